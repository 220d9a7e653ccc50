//! The typed records of a run: one line of `metrics.jsonl` per training log step and per
//! validation, one line of `samples.jsonl` per periodic sample. The trainer writes these types
//! and `plot` reads them back, so the file format has one definition.

use std::path::Path;

use qwen_burn_model::RouterStats;
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Result, TrainError};

/// A non-finite value is written as JSON `null` and read back as NaN.
fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// [`nan_if_null`] for each value of a map.
fn nan_if_null_map<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<std::collections::BTreeMap<String, f64>, D::Error> {
    let map: std::collections::BTreeMap<String, Option<f64>> = serde::Deserialize::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

/// A training step's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRecord {
    /// Optimizer steps completed.
    pub step: usize,
    /// The objective's loss over the step (next-token: the mean cross-entropy of its target
    /// tokens; `null`: not finite, the step was skipped).
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Global gradient norm before clipping.
    #[serde(deserialize_with = "nan_if_null")]
    pub grad_norm: f64,
    /// Training throughput since the previous record: input tokens a second, padding included
    /// (the positions the devices computed).
    pub tokens_per_sec: f64,
    /// Model FLOP utilisation against the devices' peak: the model FLOPs of the non-padding
    /// tokens since the previous record, a second, over the peak (padding is not counted as
    /// useful work).
    pub mfu: f64,
    /// Input tokens consumed so far, padding included.
    pub tokens_seen: u64,
    /// Of those, the tokens that are not padding (TRL's `num_tokens`, HF Trainer's
    /// `num_input_tokens_seen` with `include_num_input_tokens_seen = "non_padding"`); absent in
    /// a run resumed from a checkpoint written before this count existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_padding_tokens_seen: Option<u64>,
    /// Training wall time so far, seconds (resumes included).
    pub elapsed_secs: f64,
    /// The update was dropped (`training.on_nonfinite = "skip"`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// The objective's further figures, the step's means by name (none for next-token
    /// cross-entropy, whose figure is `loss`).
    #[serde(
        default,
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        deserialize_with = "nan_if_null_map"
    )]
    pub figures: std::collections::BTreeMap<String, f64>,
    /// Unweighted load-balancing loss of the step (MoE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux_loss: Option<f64>,
    /// Router z-loss (MoE, when enabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub z_loss: Option<f64>,
    /// Assignment loss (MoE with `router_assignment_loss_coef`), unweighted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment_loss: Option<f64>,
    /// Per MoE layer, over the whole step: the load of the router's own choice (its
    /// probabilities plus the routing bias, without a capacity), which is how validation,
    /// `eval`, `generate` and (without the bias) an HF export route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_router: Option<Vec<RouterStats>>,
    /// Under a training-time capacity (`router_capacity_factor`), per MoE layer: the load of the
    /// capped assignment the experts were trained on; absent without a capacity, where the two
    /// are the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_capped: Option<Vec<RouterStats>>,
    /// The router's own choice with all MoE layers pooled (what HF's pooled loss sees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_pooled: Option<RouterStats>,
    /// The worst MoE layer of the step, router's own choice and capped assignment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_worst: Option<super::moe::MoeWorst>,
}

/// A validation measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValRecord {
    /// Optimizer steps completed.
    pub step: usize,
    /// Mean cross-entropy over the validation batches.
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// `exp(loss)`.
    #[serde(deserialize_with = "nan_if_null")]
    pub perplexity: f64,
    /// Bits per byte of the validation targets (absent in runs from before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpb: Option<f64>,
    /// MoE with a routing bias (`router_bias_update_rate`): the fraction of the validation
    /// tokens' token-expert choices that change when the bias is dropped, as in an HF export.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_bias_changed_choices: Option<f64>,
    /// The objective's validation figures (a preference run's loss, rewards and accuracies on
    /// its validation pairs), by name.
    #[serde(
        default,
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        deserialize_with = "nan_if_null_map"
    )]
    pub figures: std::collections::BTreeMap<String, f64>,
}

/// A multiple-choice task's score (`[eval] tasks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Optimizer steps completed.
    pub step: usize,
    /// The task's name (its file stem).
    pub task: String,
    /// Questions scored.
    pub questions: usize,
    /// Accuracy.
    pub acc: f64,
    /// Its standard error.
    #[serde(deserialize_with = "nan_if_null")]
    pub acc_stderr: f64,
    /// Accuracy by log-likelihood per character of the choice (lm-evaluation-harness's
    /// `acc_norm`; records written before 2026-11-26 divided by bytes here).
    pub acc_norm: f64,
    /// Its standard error.
    #[serde(deserialize_with = "nan_if_null")]
    pub acc_norm_stderr: f64,
    /// Accuracy by log-likelihood per UTF-8 byte of the choice (the harness's `acc_bytes`;
    /// absent in records written before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acc_bytes: Option<f64>,
    /// Accuracy of a uniform guess.
    pub chance: f64,
}

impl TaskRecord {
    /// The record of `result` at `step`.
    pub fn new(step: usize, result: &crate::eval::tasks::TaskResult) -> Self {
        Self {
            step,
            task: result.task.clone(),
            questions: result.questions,
            acc: result.acc,
            acc_stderr: result.acc_stderr,
            acc_norm: result.acc_norm,
            acc_norm_stderr: result.acc_norm_stderr,
            acc_bytes: Some(result.acc_bytes),
            chance: result.chance,
        }
    }
}

/// One line of `metrics.jsonl`, told apart by its `split` field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "split", rename_all = "lowercase")]
// One record per logged step: its size does not matter, and boxing would only add noise.
#[allow(clippy::large_enum_variant)]
pub enum MetricsRecord {
    /// `"split": "train"`.
    Train(TrainRecord),
    /// `"split": "val"`.
    Val(ValRecord),
    /// `"split": "task"`.
    Task(TaskRecord),
}

impl MetricsRecord {
    /// Where the record's scalars go in TensorBoard: `train`, `val`, or `task/<name>`.
    pub fn tag_prefix(&self) -> String {
        match self {
            MetricsRecord::Train(_) => "train".into(),
            MetricsRecord::Val(_) => "val".into(),
            MetricsRecord::Task(r) => format!("task/{}", r.task),
        }
    }

    /// The step of the record.
    pub fn step(&self) -> usize {
        match self {
            MetricsRecord::Train(r) => r.step,
            MetricsRecord::Val(r) => r.step,
            MetricsRecord::Task(r) => r.step,
        }
    }

    /// A plotted field by name (`loss`, `lr`, `grad_norm`, `tokens_per_sec`, `mfu`, `aux_loss`,
    /// `z_loss`, `perplexity`, `bpb`; a task's `acc`, `acc_norm`; else one of the objective's
    /// figures of a training or validation record), if this record has it.
    pub fn field(&self, name: &str) -> Option<f64> {
        match (self, name) {
            (MetricsRecord::Train(r), "loss") => Some(r.loss),
            (MetricsRecord::Train(r), "lr") => Some(r.lr),
            (MetricsRecord::Train(r), "grad_norm") => Some(r.grad_norm),
            (MetricsRecord::Train(r), "tokens_per_sec") => Some(r.tokens_per_sec),
            (MetricsRecord::Train(r), "mfu") => Some(r.mfu),
            (MetricsRecord::Train(r), "aux_loss") => r.aux_loss,
            (MetricsRecord::Train(r), "z_loss") => r.z_loss,
            (MetricsRecord::Val(r), "loss") => Some(r.loss),
            (MetricsRecord::Val(r), "perplexity") => Some(r.perplexity),
            (MetricsRecord::Val(r), "bpb") => r.bpb,
            (MetricsRecord::Task(r), "acc") => Some(r.acc),
            (MetricsRecord::Task(r), "acc_norm") => Some(r.acc_norm),
            (MetricsRecord::Train(r), name) => r.figures.get(name).copied(),
            (MetricsRecord::Val(r), name) => r.figures.get(name).copied(),
            _ => None,
        }
    }
}

/// One line of `samples.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    /// Optimizer steps completed.
    pub step: usize,
    /// The prompt text.
    pub prompt: String,
    /// The generated continuation.
    pub text: String,
    /// RL runs: the completion's reward (the weighted sum of the reward functions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
}

/// Every record of a `metrics.jsonl`; a line that is not a record is an error naming it.
pub fn read_records(path: &Path) -> Result<Vec<MetricsRecord>> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io("read", path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| TrainError::Other(format!("{} line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_the_split_tag_and_nan_as_null() {
        let train = MetricsRecord::Train(TrainRecord {
            step: 3,
            loss: f64::NAN,
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_sec: 100.0,
            mfu: 0.1,
            tokens_seen: 300,
            non_padding_tokens_seen: Some(250),
            elapsed_secs: 1.0,
            skipped: true,
            figures: Default::default(),
            aux_loss: None,
            z_loss: None,
            assignment_loss: None,
            moe_router: None,
            moe_capped: None,
            moe_pooled: None,
            moe_worst: None,
        });
        let line = serde_json::to_string(&train).unwrap();
        assert!(
            line.contains(r#""split":"train""#) && line.contains(r#""loss":null"#),
            "{line}"
        );
        let back: MetricsRecord = serde_json::from_str(&line).unwrap();
        assert!(back.field("loss").unwrap().is_nan());
        assert_eq!(back.step(), 3);
        let val: MetricsRecord =
            serde_json::from_str(r#"{"step":0,"split":"val","loss":9.0,"perplexity":8103.08}"#)
                .unwrap();
        assert_eq!(val.field("loss"), Some(9.0));
    }
}
