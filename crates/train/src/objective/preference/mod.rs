//! Preference fine-tuning (`data.kind = "preference"`, `[preference]`): DPO and its losses as
//! TRL 1.16.0's `DPOTrainer` computes them, on sequence log-probabilities (the summed
//! log-probabilities of a completion's tokens) against a reference's.
//!
//! The reference is the model the run starts from (with LoRA: the base, since new adapters add
//! nothing). Its log-probabilities of every training and validation pair are computed once,
//! before the first step, and kept in `RUN/reference_logps.json` (TRL's
//! `precompute_ref_log_probs`), so only one model is in memory while training and a resumed run
//! reuses them.
//!
//! With `delta = (logp_c - ref_c) - (logp_r - ref_r)`, per pair: `sigmoid`
//! `-log sigmoid(beta delta)`; `hinge` `relu(1 - beta delta)`; `ipo`
//! `((logp_c - ref_c) / n_c - (logp_r - ref_r) / n_r - 1 / (2 beta))^2` with `n` the completion's
//! tokens; `robust` `(-(1 - e) log sigmoid(beta delta) + e log sigmoid(-beta delta)) / (1 - 2e)`.
//! The step's loss is their mean over its pairs. Figures under TRL's names: `rewards/chosen`
//! (`beta (logp_c - ref_c)`), `rewards/rejected`, `rewards/margins`, `rewards/accuracies`,
//! `logps/chosen`, `logps/rejected` (summed log-probabilities), each a mean over pairs.
//!
//! The reference-free losses, as TRL's `CPOTrainer` (`loss_type = "simpo"`, `cpo_alpha = 0`)
//! and `ORPOTrainer` compute them, work on mean per-token log-probabilities `a = logp / n`:
//! `simpo` `-log sigmoid(beta (a_c - a_r) - gamma)`; `orpo` the token-mean NLL of the chosen
//! completions (TRL's `nll_loss`) plus the mean of `-beta log sigmoid(lor)`, with
//! `lor = (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r))` (`log_odds_chosen`;
//! `log_odds_ratio` is the mean of `log sigmoid(lor)`). Their rewards are `beta a`. Neither
//! computes a reference.

use std::path::Path;
use std::sync::OnceLock;

use burn::module::Module;
use burn::tensor::activation::{log_sigmoid, relu};
use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_data::{Batch, PreferenceData};
use qwen_burn_model::Qwen3ForCausalLM;

use super::{Figure, Objective, ObjectiveLoss};
use crate::config::{DataKind, PreferenceConfig, PreferenceLoss};
use crate::error::{Result, TrainError};
use crate::run::data::DataPipeline;
use crate::step::batch::{batch_documents, input_tensors, target_tensor};

mod numbers;
mod reference;

pub use numbers::{
    PairNumbers, chosen_nll, completion_nll, log_odds_ratio, mean_loss, neg_log_sigmoid,
};

/// The preference objective of a run.
pub struct Preference {
    config: PreferenceConfig,
    /// Reference log-probabilities `[chosen, rejected]` by pair id (training pairs, then
    /// validation pairs), set before the first step.
    reference: OnceLock<Vec<[f64; 2]>>,
}

impl Preference {
    /// The objective of `[preference]`.
    pub fn new(config: PreferenceConfig) -> Self {
        Self {
            config,
            reference: OnceLock::new(),
        }
    }

    /// The objective with its reference log-probabilities given (tests, `eval --pairs`).
    pub fn with_reference(config: PreferenceConfig, reference: Vec<[f64; 2]>) -> Self {
        let objective = Self::new(config);
        let _ = objective.reference.set(reference);
        objective
    }

    /// The reference log-probabilities of pair `id`: None for a reference-free loss; an error
    /// when the loss needs them and they are not there.
    fn reference_of(&self, id: u32) -> Result<Option<[f64; 2]>> {
        if !self.config.loss.needs_reference() {
            return Ok(None);
        }
        let table = self.reference.get().ok_or_else(|| {
            TrainError::Other("a preference loss before the reference log-probabilities".into())
        })?;
        table
            .get(id as usize)
            .copied()
            .map(Some)
            .ok_or_else(|| TrainError::Other(format!("pair {id} is beyond the reference table")))
    }
}

/// The summed log-probability of each row's target tokens (its completion), `[rows]`, from
/// the model's final hidden states. Row by row through the fused LM head + cross-entropy
/// ([`Qwen3ForCausalLM::head_cross_entropy_sum`]), which never holds a row's whole logits: a
/// DPO step then needs about the memory of a next-token step on as many rows.
pub fn sequence_logps(
    model: &Qwen3ForCausalLM,
    hidden: Tensor<3>,
    batch: &Batch,
    device: &Device,
) -> Tensor<1> {
    rows_logps(model, hidden, target_tensor(batch, device))
}

/// The summed log-probability of each row's `targets` (`-1`: none), `[rows]`, row by row.
fn rows_logps(model: &Qwen3ForCausalLM, hidden: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, h] = hidden.dims();
    let rows = (0..b)
        .map(|r| {
            let row = hidden.clone().slice([r..r + 1, 0..t, 0..h]);
            model
                .head_cross_entropy_sum(row, targets.clone().slice([r..r + 1, 0..t]))
                .neg()
        })
        .collect();
    Tensor::cat(rows, 0)
}

/// Chosen sequences' `[summed log-probability, tokens]` over all their next tokens.
pub type Wholes = Vec<[f64; 2]>;

/// ORPO's NLL targets for the first `rows` rows of a preference batch (its chosen sequences):
/// every next token, prompt and completion, as TRL's `ORPOTrainer` takes them; and each row's
/// count of them.
fn whole_targets(batch: &Batch, rows: usize, device: &Device) -> (Tensor<2, Int>, Vec<usize>) {
    let t = batch.seq_len;
    let real = |i: usize| batch.attention_mask.as_ref().is_none_or(|m| m[i] == 1);
    let targets: Vec<i64> = (0..rows * t)
        .map(|i| {
            if i % t + 1 < t && real(i) && real(i + 1) {
                i64::from(batch.inputs[i + 1])
            } else {
                qwen_burn_data::IGNORE_INDEX
            }
        })
        .collect();
    let counts = targets
        .chunks(t.max(1))
        .map(|row| row.iter().filter(|&&x| x >= 0).count())
        .collect();
    (
        Tensor::from_data(TensorData::new(targets, [rows, t]), device),
        counts,
    )
}

/// Summed completion log-probabilities of `batch`'s rows through a model without autodiff (the
/// reference, validation, `eval --pairs`); with `whole`, also each chosen sequence's summed
/// log-probability of all its next tokens and their count (ORPO's NLL).
pub fn batch_logps(model: &Qwen3ForCausalLM, batch: &Batch, device: &Device) -> Result<Vec<f64>> {
    Ok(batch_logps_whole(model, batch, device, false)?.0)
}

/// [`batch_logps`], and with `whole` the chosen rows' `[logp, tokens]` over all next tokens.
pub fn batch_logps_whole(
    model: &Qwen3ForCausalLM,
    batch: &Batch,
    device: &Device,
    whole: bool,
) -> Result<(Vec<f64>, Option<Wholes>)> {
    let (inputs, mask) = input_tensors(batch, device);
    let docs = batch_documents(batch, model)?;
    let (hidden, _) = model.forward_hidden_packed(inputs, mask, docs.as_ref());
    let logps = read(sequence_logps(model, hidden.clone(), batch, device))?;
    if !whole {
        return Ok((logps, None));
    }
    let p = batch.batch_size / 2;
    let [_, t, h] = hidden.dims();
    let (targets, counts) = whole_targets(batch, p, device);
    let chosen = read(rows_logps(model, hidden.slice([0..p, 0..t, 0..h]), targets))?;
    Ok((
        logps,
        Some(
            chosen
                .iter()
                .zip(counts)
                .map(|(&l, n)| [l, n as f64])
                .collect(),
        ),
    ))
}

/// `[chosen, rejected]` summed completion log-probabilities of every pair of `data`, scored
/// `per_forward` pairs at a time in rows of `seq_len` padded with `pad`, through a model without
/// autodiff (a reference, or `eval --pairs`).
pub fn pair_logps(
    model: &Qwen3ForCausalLM,
    data: &PreferenceData,
    seq_len: usize,
    pad: u32,
    per_forward: usize,
    device: &Device,
) -> Result<Vec<[f64; 2]>> {
    Ok(pair_logps_whole(model, data, seq_len, pad, per_forward, device, false)?.0)
}

/// [`pair_logps`], and with `whole` each chosen sequence's `[logp, tokens]` over all its next
/// tokens (ORPO's NLL).
pub fn pair_logps_whole(
    model: &Qwen3ForCausalLM,
    data: &PreferenceData,
    seq_len: usize,
    pad: u32,
    per_forward: usize,
    device: &Device,
    whole: bool,
) -> Result<(Vec<[f64; 2]>, Option<Wholes>)> {
    let ids: Vec<usize> = (0..data.pairs.len()).collect();
    let (mut out, mut wholes) = (Vec::with_capacity(ids.len()), Vec::new());
    for chunk in ids.chunks(per_forward.max(1)) {
        let batch = data.batch(chunk, seq_len, pad, 0);
        let (logps, w) = batch_logps_whole(model, &batch, device, whole)?;
        let p = chunk.len();
        out.extend((0..p).map(|i| [logps[i], logps[p + i]]));
        wholes.extend(w.unwrap_or_default());
    }
    Ok((out, whole.then_some(wholes)))
}

fn read(t: Tensor<1>) -> Result<Vec<f64>> {
    t.try_into_vec_as::<f32>()
        .map(|v| v.into_iter().map(f64::from).collect())
        .map_err(|e| TrainError::Device(format!("{e:?}")))
}

/// Completion tokens of each row (targets that count).
fn completion_tokens(batch: &Batch) -> Vec<f64> {
    batch
        .targets
        .chunks(batch.seq_len.max(1))
        .map(|row| row.iter().filter(|&&t| t >= 0).count().max(1) as f64)
        .collect()
}

impl Objective for Preference {
    fn name(&self) -> &'static str {
        "preference"
    }

    fn data_kinds(&self) -> &'static [DataKind] {
        &[DataKind::Preference]
    }

    fn units(&self, batch: &Batch) -> usize {
        batch.batch_size / 2
    }

    fn prepare(&self, model: &Qwen3ForCausalLM, data: &DataPipeline, run_dir: &Path) -> Result<()> {
        if !self.config.loss.needs_reference() {
            return Ok(());
        }
        let table = reference::load_or_compute(&model.valid(), data, run_dir)?;
        let _ = self.reference.set(table);
        Ok(())
    }

    /// On the validation pairs, as one batch holding them all: the preference loss,
    /// `rewards/accuracies`, `rewards/margins`, and `preference_accuracy` (chosen more likely
    /// than rejected, no reference needed).
    fn validate(
        &self,
        model: &Qwen3ForCausalLM,
        batches: &[Batch],
        device: &Device,
    ) -> Result<std::collections::BTreeMap<String, f64>> {
        let mut pairs = Vec::new();
        for batch in batches {
            let Some(ids) = batch.pairs.as_deref() else {
                continue;
            };
            let orpo = self.config.loss == PreferenceLoss::Orpo;
            let (logps, whole) = batch_logps_whole(model, batch, device, orpo)?;
            let tokens = completion_tokens(batch);
            let p = ids.len();
            for (i, &id) in ids.iter().enumerate() {
                pairs.push(PairNumbers {
                    policy: [logps[i], logps[p + i]],
                    reference: self.reference_of(id)?,
                    tokens: [tokens[i], tokens[p + i]],
                    chosen_whole: whole.as_ref().map(|w| w[i]),
                });
            }
        }
        let mut out = std::collections::BTreeMap::new();
        let Some(loss) = mean_loss(&self.config, &pairs) else {
            return Ok(out);
        };
        let n = pairs.len() as f64;
        let (mut acc, mut margin, mut pref) = (0.0, 0.0, 0.0);
        for pair in &pairs {
            if let Some([c, r]) = pair.rewards(&self.config) {
                acc += f64::from(u8::from(c > r));
                margin += c - r;
            }
            pref += f64::from(u8::from(pair.policy[0] > pair.policy[1]));
        }
        out.insert("preference/loss".to_string(), loss);
        out.insert("rewards/accuracies".to_string(), acc / n);
        out.insert("rewards/margins".to_string(), margin / n);
        out.insert("preference_accuracy".to_string(), pref / n);
        Ok(out)
    }

    fn loss(
        &self,
        model: &Qwen3ForCausalLM,
        hidden: Tensor<3>,
        batch: &Batch,
        device: &Device,
        step_units: f64,
    ) -> Result<ObjectiveLoss> {
        let ids = batch.pairs.as_deref().ok_or_else(|| {
            TrainError::Other("a preference step got a batch without pairs".into())
        })?;
        let p = ids.len();
        let refs: Vec<Option<[f64; 2]>> = ids
            .iter()
            .map(|&id| self.reference_of(id))
            .collect::<Result<_>>()?;
        let vector = |v: Vec<f64>| {
            let v: Vec<f32> = v.into_iter().map(|x| x as f32).collect();
            Tensor::<1>::from_data(TensorData::new(v, [p]), device)
        };
        let column = |k: usize| vector(refs.iter().map(|r| r.map_or(0.0, |r| r[k])).collect());
        let tokens = completion_tokens(batch);
        let chosen_hidden = {
            let [_, t, h] = hidden.dims();
            hidden.clone().slice([0..p, 0..t, 0..h])
        };
        let logps = sequence_logps(model, hidden, batch, device);
        let chosen = logps.clone().slice(0..p);
        let rejected = logps.slice(p..2 * p);
        let beta = self.config.beta;
        // Mean per-token log-probabilities, for the length-normalised losses.
        let means = || {
            (
                chosen.clone() / vector(tokens[..p].to_vec()),
                rejected.clone() / vector(tokens[p..].to_vec()),
            )
        };
        let chosen_ratio = || chosen.clone() - column(0);
        let rejected_ratio = || rejected.clone() - column(1);
        let delta = || chosen_ratio() - rejected_ratio();
        let mut extra = Vec::new();
        let sum = match self.config.loss {
            PreferenceLoss::Sigmoid => log_sigmoid(delta() * beta).neg().sum(),
            PreferenceLoss::Hinge => relu(delta().mul_scalar(-beta).add_scalar(1.0)).sum(),
            PreferenceLoss::Ipo => {
                let counts = |r: std::ops::Range<usize>| vector(tokens[r].to_vec());
                let d = chosen_ratio() / counts(0..p) - rejected_ratio() / counts(p..2 * p);
                d.sub_scalar(1.0 / (2.0 * beta)).powi_scalar(2).sum()
            }
            PreferenceLoss::Robust => {
                let e = self.config.label_smoothing;
                let clean = log_sigmoid(delta() * beta).mul_scalar(-(1.0 - e));
                let flipped = log_sigmoid(delta() * (-beta)).mul_scalar(-e);
                (clean - flipped).div_scalar(1.0 - 2.0 * e).sum()
            }
            PreferenceLoss::Simpo => {
                let (ac, ar) = means();
                let logits = (ac - ar)
                    .mul_scalar(beta)
                    .sub_scalar(self.config.simpo_gamma());
                log_sigmoid(logits).neg().sum()
            }
            PreferenceLoss::Orpo => {
                let (ac, ar) = means();
                let log1m = |a: Tensor<1>| a.exp().neg().log1p();
                let lor = (ac.clone() - ar.clone()) - (log1m(ac) - log1m(ar));
                let ratio = log_sigmoid(lor.clone());
                // The micro-batch's token-mean NLL of its chosen sequences (prompt and
                // completion, as TRL) counts once per pair, so the step's mean over pairs gives
                // TRL's mean over micro-batches.
                let (targets, counts) = whole_targets(batch, p, device);
                let count: usize = counts.iter().sum();
                let nll = rows_logps(model, chosen_hidden, targets)
                    .sum()
                    .neg()
                    .div_scalar(count.max(1) as f64);
                let all = |name, t: Tensor<1>| -> Result<Figure> {
                    Ok(Figure {
                        name,
                        sum: read(t)?.iter().sum(),
                        count: p as f64,
                    })
                };
                extra.push(all("nll_loss", nll.clone().mul_scalar(p as f64))?);
                extra.push(all("log_odds_ratio", ratio.clone())?);
                extra.push(all("log_odds_chosen", lor)?);
                nll.mul_scalar(p as f64) - ratio.sum().mul_scalar(beta)
            }
        };
        // RPO: the micro-batch's token-mean NLL of its chosen completions (TRL's "sft" loss),
        // once per pair, so that the step's mean over pairs is TRL's mean over micro-batches.
        let w = self.config.sft_weight;
        let sum = if w > 0.0 {
            let count: f64 = tokens[..p].iter().sum();
            let nll = chosen.clone().sum().neg().div_scalar(count.max(1.0));
            sum + nll.mul_scalar(w * p as f64)
        } else {
            sum
        };
        let (c, r) = (read(chosen)?, read(rejected)?);
        let numbers: Vec<PairNumbers> = (0..p)
            .map(|i| PairNumbers {
                policy: [c[i], r[i]],
                reference: refs[i],
                tokens: [tokens[i], tokens[p + i]],
                chosen_whole: None,
            })
            .collect();
        let rewards: Vec<[f64; 2]> = numbers
            .iter()
            .map(|n| n.rewards(&self.config))
            .collect::<Option<_>>()
            .ok_or_else(|| TrainError::Other("preference rewards without a reference".into()))?;
        let figure = |name, values: Vec<f64>| Figure {
            name,
            sum: values.iter().sum(),
            count: p as f64,
        };
        let mut figures = vec![
            figure("rewards/chosen", rewards.iter().map(|x| x[0]).collect()),
            figure("rewards/rejected", rewards.iter().map(|x| x[1]).collect()),
            figure(
                "rewards/margins",
                rewards.iter().map(|x| x[0] - x[1]).collect(),
            ),
            figure(
                "rewards/accuracies",
                rewards
                    .iter()
                    .map(|x| f64::from(u8::from(x[0] > x[1])))
                    .collect(),
            ),
            figure("logps/chosen", c),
            figure("logps/rejected", r),
        ];
        if w > 0.0 {
            // The term's value from the numbers read above (no second read of the device).
            figures.push(figure("sft_loss", vec![completion_nll(&numbers); p]));
        }
        figures.extend(extra);
        Ok(ObjectiveLoss {
            loss: sum.clone() / step_units,
            sum,
            figures,
        })
    }
}
