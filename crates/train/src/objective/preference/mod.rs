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
//! `logps/chosen`, `logps/rejected`, each a mean over pairs.

use std::path::Path;
use std::sync::OnceLock;

use burn::module::Module;
use burn::tensor::activation::{log_sigmoid, relu};
use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_data::{Batch, PreferenceData};
use qwen_burn_model::Qwen3ForCausalLM;

use super::{Figure, Objective, ObjectiveLoss};
use crate::config::{DataKind, PreferenceConfig, PreferenceLoss};
use crate::error::{Result, TrainError};
use crate::run::data::DataPipeline;
use crate::step::batch::{batch_documents, input_tensors, target_tensor};

mod reference;

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
    let targets = target_tensor(batch, device);
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

/// [`sequence_logps`] of `batch` through a model without autodiff (the reference).
pub fn batch_logps(model: &Qwen3ForCausalLM, batch: &Batch, device: &Device) -> Result<Vec<f64>> {
    let (inputs, mask) = input_tensors(batch, device);
    let docs = batch_documents(batch)?;
    let (hidden, _) = model.forward_hidden_packed(inputs, mask, docs.as_ref());
    read(sequence_logps(model, hidden, batch, device))
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
    let ids: Vec<usize> = (0..data.pairs.len()).collect();
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(per_forward.max(1)) {
        let logps = batch_logps(model, &data.batch(chunk, seq_len, pad, 0), device)?;
        let p = chunk.len();
        out.extend((0..p).map(|i| [logps[i], logps[p + i]]));
    }
    Ok(out)
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
        let table = reference::load_or_compute(&model.valid(), data, run_dir)?;
        let _ = self.reference.set(table);
        Ok(())
    }

    /// On the validation pairs: the preference loss, `rewards/accuracies`, `rewards/margins`,
    /// and `preference_accuracy` (chosen more likely than rejected, no reference needed), means
    /// over the pairs.
    fn validate(
        &self,
        model: &Qwen3ForCausalLM,
        batches: &[Batch],
        device: &Device,
    ) -> Result<std::collections::BTreeMap<String, f64>> {
        let table = self.reference.get().ok_or_else(|| {
            TrainError::Other("preference validation before the reference log-probabilities".into())
        })?;
        let (mut loss, mut acc, mut margin, mut pref, mut n) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for batch in batches {
            let Some(pairs) = batch.pairs.as_deref() else {
                continue;
            };
            let logps = batch_logps(model, batch, device)?;
            let tokens = completion_tokens(batch);
            let p = pairs.len();
            for (i, &id) in pairs.iter().enumerate() {
                let [rc, rr] = *table.get(id as usize).ok_or_else(|| {
                    TrainError::Other("a validation pair beyond the reference table".into())
                })?;
                let (c, r) = (logps[i], logps[p + i]);
                loss += pair_loss(&self.config, c, r, rc, rr, tokens[i], tokens[p + i]);
                let m = self.config.beta * ((c - rc) - (r - rr));
                acc += f64::from(u8::from(m > 0.0));
                margin += m;
                pref += f64::from(u8::from(c > r));
                n += 1.0;
            }
        }
        let mut out = std::collections::BTreeMap::new();
        if n > 0.0 {
            out.insert("preference/loss".to_string(), loss / n);
            out.insert("rewards/accuracies".to_string(), acc / n);
            out.insert("rewards/margins".to_string(), margin / n);
            out.insert("preference_accuracy".to_string(), pref / n);
        }
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
        let table = self.reference.get().ok_or_else(|| {
            TrainError::Other("preference loss before the reference log-probabilities".into())
        })?;
        let pairs = batch.pairs.as_deref().ok_or_else(|| {
            TrainError::Other("a preference step got a batch without pairs".into())
        })?;
        let p = pairs.len();
        let refs: Vec<[f64; 2]> = pairs
            .iter()
            .map(|&i| table.get(i as usize).copied())
            .collect::<Option<_>>()
            .ok_or_else(|| TrainError::Other("a pair id beyond the reference table".into()))?;
        let column = |k: usize| {
            let v: Vec<f32> = refs.iter().map(|r| r[k] as f32).collect();
            Tensor::<1>::from_data(TensorData::new(v, [p]), device)
        };
        let logps = sequence_logps(model, hidden, batch, device);
        let chosen = logps.clone().slice(0..p);
        let rejected = logps.slice(p..2 * p);
        let chosen_ratio = chosen.clone() - column(0);
        let rejected_ratio = rejected.clone() - column(1);
        let beta = self.config.beta;
        let delta = chosen_ratio.clone() - rejected_ratio.clone();
        let per_pair = match self.config.loss {
            PreferenceLoss::Sigmoid => log_sigmoid(delta * beta).neg(),
            PreferenceLoss::Hinge => relu(delta.mul_scalar(-beta).add_scalar(1.0)),
            PreferenceLoss::Ipo => {
                let n = completion_tokens(batch);
                let counts = |r: std::ops::Range<usize>| {
                    let v: Vec<f32> = n[r].iter().map(|&x| x as f32).collect();
                    Tensor::<1>::from_data(TensorData::new(v, [p]), device)
                };
                let d =
                    chosen_ratio.clone() / counts(0..p) - rejected_ratio.clone() / counts(p..2 * p);
                d.sub_scalar(1.0 / (2.0 * beta)).powi_scalar(2)
            }
            PreferenceLoss::Robust => {
                let e = self.config.label_smoothing;
                let clean = log_sigmoid(delta.clone() * beta).mul_scalar(-(1.0 - e));
                let flipped = log_sigmoid(delta * (-beta)).mul_scalar(-e);
                (clean - flipped).div_scalar(1.0 - 2.0 * e)
            }
        };
        let sum = per_pair.sum();
        let (c, r) = (read(chosen)?, read(rejected)?);
        let (rc, rr): (Vec<f64>, Vec<f64>) = (
            c.iter()
                .zip(&refs)
                .map(|(x, r)| beta * (x - r[0]))
                .collect(),
            r.iter()
                .zip(&refs)
                .map(|(x, r)| beta * (x - r[1]))
                .collect(),
        );
        let figure = |name, values: Vec<f64>| Figure {
            name,
            sum: values.iter().sum(),
            count: p as f64,
        };
        let figures = vec![
            figure("rewards/chosen", rc.clone()),
            figure("rewards/rejected", rr.clone()),
            figure(
                "rewards/margins",
                rc.iter().zip(&rr).map(|(a, b)| a - b).collect(),
            ),
            figure(
                "rewards/accuracies",
                rc.iter()
                    .zip(&rr)
                    .map(|(a, b)| f64::from(u8::from(a > b)))
                    .collect(),
            ),
            figure("logps/chosen", c),
            figure("logps/rejected", r),
        ];
        Ok(ObjectiveLoss {
            loss: sum.clone() / step_units,
            sum,
            figures,
        })
    }
}

/// One pair's loss in f64 (what `eval --pairs` reports; the training loss computes the same on
/// tensors): `c`, `r` the policy's, `rc`, `rr` the reference's log-probabilities, `nc`, `nr`
/// the completions' token counts.
#[allow(clippy::too_many_arguments)]
pub fn pair_loss(
    config: &PreferenceConfig,
    c: f64,
    r: f64,
    rc: f64,
    rr: f64,
    nc: f64,
    nr: f64,
) -> f64 {
    let beta = config.beta;
    let delta = (c - rc) - (r - rr);
    // -log sigmoid(x) = log(1 + e^-x), computed without overflow.
    let nls = |x: f64| {
        if x > 0.0 {
            (-x).exp().ln_1p()
        } else {
            -x + x.exp().ln_1p()
        }
    };
    match config.loss {
        PreferenceLoss::Sigmoid => nls(beta * delta),
        PreferenceLoss::Hinge => (1.0 - beta * delta).max(0.0),
        PreferenceLoss::Ipo => {
            ((c - rc) / nc.max(1.0) - (r - rr) / nr.max(1.0) - 1.0 / (2.0 * beta)).powi(2)
        }
        PreferenceLoss::Robust => {
            let e = config.label_smoothing;
            ((1.0 - e) * nls(beta * delta) - e * nls(-beta * delta)) / (1.0 - 2.0 * e)
        }
    }
}
