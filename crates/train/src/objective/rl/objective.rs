//! [`Rl`]: the RL objective behind [`Objective`] (see the module docs of `objective::rl`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_data::Batch;
use qwen_burn_model::Qwen3ForCausalLM;

use super::advantage::advantages;
use super::left_out::{rows_needed, select_rows, skips_zero_rows};
use super::loss::{TokenInputs, rl_loss, rl_loss_rows, rl_units};
use super::rewards::Reward;
use super::rollout::{
    NamedReward, PromptSets, complete, host_token_logps, rows_batch, score, tempered, token_logps,
};
use crate::config::{DataKind, RewardKind, RlAlgorithm, RlConfig};
use crate::error::{Result, TrainError};
use crate::objective::{Figure, Objective, ObjectiveLoss, count_targets};
use crate::run::data::DataPipeline;

/// The RL objective of a run.
pub struct Rl {
    config: RlConfig,
    seed: u64,
    rewards: Vec<NamedReward>,
    /// The model the run starts from, the reference of the KL term (`rl.beta > 0`).
    reference_from: Option<PathBuf>,
    sets: OnceLock<PromptSets>,
    reference: OnceLock<Qwen3ForCausalLM>,
    current: Mutex<Option<Rollout>>,
}

/// The rows of the current generation batch.
struct Rollout {
    batches: Vec<Batch>,
    rows: Vec<Row>,
    /// Step-wide figures (rewards, lengths), logged with every step that trains on the rows.
    figures: Vec<(&'static str, f64)>,
    /// The first completion of the first prompts, with its reward: the run's samples.
    samples: Vec<(String, String, f64)>,
    /// The loss units of the rows left out of `batches` (zero advantage).
    units_left_out: usize,
}

struct Row {
    advantage: f32,
    /// Per-token log-probabilities at generation / of the reference, over the row's batch
    /// positions.
    old: Option<Vec<f32>>,
    reference: Option<Vec<f32>>,
}

/// The rollout's step-wide figures, counted once per row of a micro-batch of `rows`, so their
/// mean over the step is their value.
fn push_step_figures(figures: &mut Vec<Figure>, step: &[(&'static str, f64)], rows: usize) {
    for &(name, value) in step {
        figures.push(Figure {
            name,
            sum: value * rows as f64,
            count: rows as f64,
        });
    }
}

/// Completions a step's samples show (the first of as many prompts).
const SAMPLES: usize = 2;

/// A figure name made once per run (reward names carry the config's order).
fn leak(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}

impl Rl {
    /// The objective of `[rl]`; `reference_from` is `model.from` (the KL's reference).
    pub fn new(config: RlConfig, seed: u64, reference_from: Option<PathBuf>) -> Result<Self> {
        let mut rewards = Vec::new();
        let mut names = BTreeMap::new();
        for (i, spec) in config.rewards.iter().enumerate() {
            let key = format!("rl.rewards[{i}].pattern");
            let pattern = |default: &str| {
                regex::Regex::new(spec.pattern.as_deref().unwrap_or(default))
                    .map_err(|e| TrainError::config(key.clone(), format!("not a regex: {e}")))
            };
            let reward = match spec.kind {
                RewardKind::ExactMatch => Reward::ExactMatch {
                    pattern: pattern(Reward::GSM8K_PATTERN)?,
                },
                RewardKind::Regex => Reward::Regex {
                    pattern: pattern("")?,
                },
                RewardKind::Command => Reward::Command {
                    program: spec.command[0].display().to_string(),
                    args: spec.command[1..]
                        .iter()
                        .map(|a| a.display().to_string())
                        .collect(),
                    timeout: std::time::Duration::from_secs_f64(spec.timeout_secs),
                },
            };
            let kind = reward.kind();
            let seen = names.entry(kind).or_insert(0usize);
            *seen += 1;
            let name = if *seen == 1 {
                kind.to_string()
            } else {
                format!("{kind}_{seen}")
            };
            rewards.push(NamedReward {
                reward,
                weight: spec.weight,
                name: leak(name),
            });
        }
        if config.beta > 0.0 && reference_from.is_none() {
            return Err(TrainError::config(
                "rl.beta",
                "the KL term's reference is the model of model.from; a run from scratch has none",
            ));
        }
        Ok(Self {
            config,
            seed,
            rewards,
            reference_from,
            sets: OnceLock::new(),
            reference: OnceLock::new(),
            current: Mutex::new(None),
        })
    }

    fn sets(&self) -> Result<&PromptSets> {
        self.sets
            .get()
            .ok_or_else(|| TrainError::Other("an RL step before its prompts were opened".into()))
    }

    /// Generate, score and lay out the rows of the step's prompt batches.
    fn generate(
        &self,
        model: &Qwen3ForCausalLM,
        prompts: &[Batch],
        step: usize,
    ) -> Result<Rollout> {
        let sets = self.sets()?;
        let valid = model.valid();
        let device = valid
            .devices()
            .first()
            .cloned()
            .ok_or_else(|| TrainError::Other("the policy has no device".into()))?;
        let g = self.config.group_size;
        let mut all_prompts = Vec::new();
        let mut all_completions = Vec::new();
        let mut groups = Vec::new();
        let started = std::time::Instant::now();
        let mut generating = 0.0;
        for batch in prompts {
            let ids = batch.pairs.clone().ok_or_else(|| {
                TrainError::Other("an RL step got a batch that is not a prompt batch".into())
            })?;
            let clock = std::time::Instant::now();
            let completions = complete(
                &valid,
                sets,
                &self.config,
                &ids,
                g,
                false,
                self.seed,
                step,
                &device,
            )?;
            generating += clock.elapsed().as_secs_f64();
            groups.push((ids.clone(), completions.clone()));
            all_prompts.extend(ids);
            all_completions.extend(completions);
        }
        let (total, each) = score(&self.rewards, sets, &all_prompts, &all_completions)?;
        let (adv, reward_figures) =
            advantages(&total, g, self.config.scale_rewards, self.config.algorithm);
        let pad = sets.stop_ids.first().copied().unwrap_or(0);
        let skip = skips_zero_rows(&self.config, model)?;
        let mut batches = Vec::with_capacity(groups.len());
        let mut rows = Vec::with_capacity(total.len());
        let (mut first, mut rows_left_out, mut units_left_out) = (0usize, 0usize, 0usize);
        for (ids, completions) in &groups {
            let mut batch = rows_batch(sets, ids, completions, pad, rows.len() as u32)?;
            let mut adv_rows: Vec<f64> = adv[first..first + batch.batch_size].to_vec();
            first += batch.batch_size;
            let needed = rows_needed(&adv_rows);
            if skip && needed.len() < adv_rows.len() {
                let (kept_ids, kept) = select_rows(ids, completions, &needed);
                let all_units = self.units(&batch);
                rows_left_out += batch.batch_size - needed.len();
                batch = rows_batch(sets, &kept_ids, &kept, pad, rows.len() as u32)?;
                units_left_out += all_units - self.units(&batch);
                adv_rows = needed.iter().map(|&i| adv_rows[i]).collect();
            }
            let keep_old = self.config.num_iterations > 1;
            let old = keep_old
                .then(|| host_token_logps(&valid, &batch, self.config.temperature))
                .transpose()?;
            let reference = match self.reference.get() {
                Some(r) if self.config.beta > 0.0 => {
                    Some(host_token_logps(r, &batch, self.config.temperature)?)
                }
                _ => None,
            };
            let t = batch.seq_len;
            for (r, &advantage) in adv_rows.iter().enumerate() {
                let span = r * t..(r + 1) * t;
                rows.push(Row {
                    advantage: advantage as f32,
                    old: old.as_ref().map(|v| v[span.clone()].to_vec()),
                    reference: reference.as_ref().map(|v| v[span].to_vec()),
                });
            }
            batches.push(batch);
        }
        let lengths: Vec<usize> = all_completions
            .iter()
            .flatten()
            .map(|c| c.ids.len())
            .collect();
        let n = lengths.len().max(1) as f64;
        let clipped = all_completions
            .iter()
            .flatten()
            .filter(|c| !c.stopped)
            .count();
        let mut figures: Vec<(&'static str, f64)> = reward_figures.to_vec();
        for (r, values) in self.rewards.iter().zip(&each) {
            let mean = values.iter().sum::<f64>() / n;
            figures.push((leak(format!("rewards/{}/mean", r.name)), mean));
        }
        figures.push((
            "completions/mean_length",
            lengths.iter().sum::<usize>() as f64 / n,
        ));
        figures.push((
            "completions/max_length",
            lengths.iter().copied().max().unwrap_or(0) as f64,
        ));
        figures.push(("completions/clipped_ratio", clipped as f64 / n));
        // The share of the rows that the update left out (zero advantage, see `left_out`).
        figures.push((
            "rollout/frac_rows_left_out",
            rows_left_out as f64 / total.len().max(1) as f64,
        ));
        // Timings of this rollout: the decoding alone, and all of it (decoding, rewards,
        // the rows' layout and any old or reference log-probabilities).
        let generated = lengths.iter().sum::<usize>() as f64;
        figures.push(("rollout/generation_secs", generating));
        figures.push((
            "rollout/generation_tokens_per_sec",
            generated / generating.max(1e-9),
        ));
        figures.push(("rollout/secs", started.elapsed().as_secs_f64()));
        let mut samples = Vec::new();
        for (k, (&id, group)) in all_prompts
            .iter()
            .zip(&all_completions)
            .take(SAMPLES)
            .enumerate()
        {
            let text = sets.completion_text(&group[0].ids)?;
            samples.push((sets.item(id)?.text.clone(), text, total[k * g]));
        }
        Ok(Rollout {
            batches,
            rows,
            figures,
            samples,
            units_left_out,
        })
    }
}

impl Objective for Rl {
    fn name(&self) -> &'static str {
        match self.config.algorithm {
            RlAlgorithm::Grpo => "grpo",
            RlAlgorithm::Reinforce => "reinforce",
        }
    }

    fn data_kinds(&self) -> &'static [DataKind] {
        &[DataKind::Prompts]
    }

    fn units(&self, batch: &Batch) -> usize {
        rl_units(&self.config, batch.batch_size, count_targets(batch))
    }

    fn units_left_out(&self) -> usize {
        self.current
            .lock()
            .ok()
            .and_then(|c| c.as_ref().map(|r| r.units_left_out))
            .unwrap_or(0)
    }

    fn prepare(
        &self,
        model: &Qwen3ForCausalLM,
        data: &DataPipeline,
        _run_dir: &Path,
    ) -> Result<()> {
        let sets = data.prompts().ok_or_else(|| {
            TrainError::config("data.kind", "an RL run needs data.kind = \"prompts\"")
        })?;
        let _ = self.sets.set(sets.clone());
        // A `true` that the model cannot honour is an error before the first step.
        skips_zero_rows(&self.config, model)?;
        if self.config.beta > 0.0
            && let Some(from) = &self.reference_from
        {
            let device = model
                .valid()
                .devices()
                .first()
                .cloned()
                .ok_or_else(|| TrainError::Other("the policy has no device".into()))?;
            let reference = crate::run::checkpoint::load_model_any(from, &device)?;
            let _ = self.reference.set(reference);
        }
        Ok(())
    }

    fn wants_data(&self, step: usize) -> bool {
        let reuse = !step.is_multiple_of(self.config.num_iterations);
        !(reuse && self.current.lock().is_ok_and(|c| c.is_some()))
    }

    fn rollout(
        &self,
        model: &Qwen3ForCausalLM,
        batches: Vec<Batch>,
        step: usize,
    ) -> Result<Vec<Batch>> {
        let mut current = self
            .current
            .lock()
            .map_err(|_| TrainError::Other("the rollout lock is poisoned".into()))?;
        if !batches.is_empty() {
            *current = Some(self.generate(model, &batches, step)?);
        }
        current
            .as_ref()
            .map(|r| r.batches.clone())
            .ok_or_else(|| TrainError::Other("an RL step without a rollout".into()))
    }

    fn samples(&self) -> Vec<(String, String, f64)> {
        self.current
            .lock()
            .ok()
            .and_then(|c| c.as_ref().map(|r| r.samples.clone()))
            .unwrap_or_default()
    }

    fn validate(
        &self,
        model: &Qwen3ForCausalLM,
        batches: &[Batch],
        device: &Device,
    ) -> Result<BTreeMap<String, f64>> {
        let sets = self.sets()?;
        let ids: Vec<u32> = batches
            .iter()
            .filter_map(|b| b.pairs.clone())
            .flatten()
            .collect();
        let mut out = BTreeMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let completions = complete(model, sets, &self.config, &ids, 1, true, 0, 0, device)?;
        let (total, each) = score(&self.rewards, sets, &ids, &completions)?;
        let n = total.len() as f64;
        out.insert("reward".to_string(), total.iter().sum::<f64>() / n);
        for (r, values) in self.rewards.iter().zip(&each) {
            let mean = values.iter().sum::<f64>() / n;
            out.insert(format!("rewards/{}/mean", r.name), mean);
            if r.name == "exact_match" {
                out.insert("accuracy".to_string(), mean);
            }
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
        let current = self
            .current
            .lock()
            .map_err(|_| TrainError::Other("the rollout lock is poisoned".into()))?;
        let rollout = current
            .as_ref()
            .ok_or_else(|| TrainError::Other("an RL loss without a rollout".into()))?;
        // The log-probabilities of the sampling distribution (logits / temperature), as TRL.
        let hidden = tempered(hidden, self.config.temperature);
        let ids = batch
            .pairs
            .as_deref()
            .ok_or_else(|| TrainError::Other("an RL batch without row ids".into()))?;
        let rows: Vec<&Row> = ids
            .iter()
            .map(|&i| rollout.rows.get(i as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| TrainError::Other("an RL row beyond the rollout".into()))?;
        let (b, t) = (batch.batch_size, batch.seq_len);
        let matrix =
            |values: Vec<f32>| Tensor::<2>::from_data(TensorData::new(values, [b, t]), device);
        let gather = |f: &dyn Fn(&Row) -> Option<&Vec<f32>>| -> Option<Tensor<2>> {
            let parts: Option<Vec<&Vec<f32>>> = rows.iter().map(|r| f(r)).collect();
            parts.map(|p| matrix(p.into_iter().flatten().copied().collect()))
        };
        let advantages = Tensor::<1>::from_data(
            TensorData::new(rows.iter().map(|r| r.advantage).collect::<Vec<_>>(), [b]),
            device,
        );
        // Only the rows' summed log-probabilities matter (on-policy, no KL): the fused head.
        let per_token = rows
            .iter()
            .any(|r| r.old.is_some() || r.reference.is_some());
        if !per_token {
            let tokens: Vec<f64> = batch
                .targets
                .chunks(t.max(1))
                .map(|row| row.iter().filter(|&&x| x >= 0).count() as f64)
                .collect();
            let sums = crate::objective::preference::sequence_logps(model, hidden, batch, device);
            let (sum, mut figures) = rl_loss_rows(&self.config, sums, &tokens, advantages);
            push_step_figures(&mut figures, &rollout.figures, b);
            return Ok(ObjectiveLoss {
                loss: sum.clone() / step_units,
                sum,
                figures,
            });
        }
        let mask_values: Vec<f32> = batch
            .targets
            .iter()
            .map(|&x| f32::from(u8::from(x >= 0)))
            .collect();
        let mask = matrix(mask_values);
        let (logps, entropy) = token_logps(model, hidden, batch, device);
        let inputs = TokenInputs {
            logps,
            old: gather(&|r| r.old.as_ref()),
            reference: gather(&|r| r.reference.as_ref()),
            mask: mask.clone(),
            advantages,
        };
        let (sum, mut figures) = rl_loss(&self.config, inputs);
        let tokens: f64 = batch.targets.iter().filter(|&&x| x >= 0).count() as f64;
        let entropy_sum = entropy
            .mul(mask)
            .sum()
            .try_into_scalar::<f32>()
            .map_err(|e| TrainError::Device(format!("{e:?}")))?;
        figures.push(Figure {
            name: "entropy",
            sum: f64::from(entropy_sum),
            count: tokens,
        });
        push_step_figures(&mut figures, &rollout.figures, b);
        Ok(ObjectiveLoss {
            loss: sum.clone() / step_units,
            sum,
            figures,
        })
    }
}
