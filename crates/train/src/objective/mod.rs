//! Training objectives: what a step differentiates, given the model's final hidden states.
//!
//! An objective is one type behind [`Objective`]: which data it trains on, how many units of a
//! micro-batch its loss averages over, and how it turns one micro-batch's forward into its loss
//! and its figures. Everything else of a step is common to all objectives and lives in
//! [`crate::step`]: the forward through the decoder (with or without activation checkpointing),
//! the MoE router losses, gradient accumulation over micro-batches, the replicas and the
//! step's statistics; and above it [`crate::run`]: the loop, checkpoints, resume and the guard.
//!
//! - [`NextToken`]: next-token cross-entropy, over the target tokens of plain text or of SFT
//!   rows (whose masked prompt tokens have target -1).
//! - [`preference::Preference`]: DPO and its losses on pairs of completions (TRL's).
//! - [`rl::Rl`]: GRPO and REINFORCE on completions the policy generates for prompts, with
//!   verifiable rewards (TRL's GRPO, nanochat's REINFORCE); it makes its own batches
//!   ([`Objective::rollout`]).

mod next_token;
pub mod preference;
pub mod rl;

use std::path::Path;

use burn::tensor::{Device, Tensor};
use qwen_burn_data::Batch;
use qwen_burn_model::Qwen3ForCausalLM;

use crate::config::DataKind;
use crate::error::Result;
use crate::run::data::DataPipeline;

pub use next_token::{NextToken, count_targets, forward_ce_rows, forward_ce_sum};

/// A training objective (see the module docs).
pub trait Objective: Send + Sync {
    /// Its name, as the progress line and the records give it.
    fn name(&self) -> &'static str;

    /// The `data.kind`s it trains on; a run refuses the others before its first step.
    fn data_kinds(&self) -> &'static [DataKind];

    /// How many units of `batch` the step's loss averages over (next-token: target tokens). The
    /// step divides every micro-batch's loss by the units of the whole step, so `k`
    /// micro-batches, or `n` replicas, give the gradient of one batch that holds them all.
    fn units(&self, batch: &Batch) -> usize;

    /// Units of the step's loss that none of its batches holds: rows the objective left out
    /// of the forwards because their loss and gradient are exactly 0 (RL's zero-advantage
    /// rows), which the loss still averages over. 0 by default.
    fn units_left_out(&self) -> usize {
        0
    }

    /// Work before the first step, once the model and the data are open (the preference
    /// objective's reference log-probabilities). Nothing by default.
    fn prepare(
        &self,
        _model: &Qwen3ForCausalLM,
        _data: &DataPipeline,
        _run_dir: &Path,
    ) -> Result<()> {
        Ok(())
    }

    /// Whether step `step` (0-based) takes new batches from the data. An objective that trains
    /// several steps on one rollout ([`rl::Rl`] with `rl.num_iterations > 1`) declines them on
    /// the steps that reuse it. True by default.
    fn wants_data(&self, _step: usize) -> bool {
        true
    }

    /// The step's micro-batches from the data's (`batches`, empty when [`Self::wants_data`]
    /// declined them), with the model as it is before the step: RL turns prompt batches into
    /// rows of generated completions. The data's, unchanged, by default.
    fn rollout(
        &self,
        _model: &Qwen3ForCausalLM,
        batches: Vec<Batch>,
        _step: usize,
    ) -> Result<Vec<Batch>> {
        Ok(batches)
    }

    /// Completions of the latest rollout to show as samples: `(prompt, completion, reward)`.
    /// None by default (the run samples `training.sample_prompt` instead).
    fn samples(&self) -> Vec<(String, String, f64)> {
        Vec::new()
    }

    /// Figures of the objective on the validation batches, beside the validation loss (which
    /// is the next-token loss of their targets for every objective). None by default.
    fn validate(
        &self,
        _model: &Qwen3ForCausalLM,
        _batches: &[Batch],
        _device: &Device,
    ) -> Result<std::collections::BTreeMap<String, f64>> {
        Ok(Default::default())
    }

    /// The loss of one micro-batch, from the model's final hidden states `hidden` (`[b, t,
    /// hidden_size]`, after the final norm): `loss` is what the step differentiates, already
    /// divided by `step_units`, the units of the whole step.
    fn loss(
        &self,
        model: &Qwen3ForCausalLM,
        hidden: Tensor<3>,
        batch: &Batch,
        device: &Device,
        step_units: f64,
    ) -> Result<ObjectiveLoss>;
}

/// One micro-batch's loss under an objective.
pub struct ObjectiveLoss {
    /// What to differentiate: the micro-batch's share of the step's loss.
    pub loss: Tensor<1>,
    /// The same loss summed over the micro-batch's units, undivided: the step's logged loss is
    /// the sum of these over its micro-batches divided by its units.
    pub sum: Tensor<1>,
    /// Further figures of the micro-batch, each a sum and the count it is averaged over (the
    /// step logs `sum of sums / sum of counts`).
    pub figures: Vec<Figure>,
}

/// A figure an objective records beside its loss (see [`ObjectiveLoss::figures`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Its key in `metrics.jsonl`'s `figures`.
    pub name: &'static str,
    /// Summed over the units it covers.
    pub sum: f64,
    /// How many units that is.
    pub count: f64,
}

/// The objective of a run: preference data trains with `[preference]`'s loss, prompts with
/// `[rl]`'s, the others with next-token cross-entropy.
pub fn of_run(config: &crate::config::RunConfig) -> Result<Box<dyn Objective>> {
    Ok(match config.data.kind {
        DataKind::Preference => Box::new(preference::Preference::new(config.preference.clone())),
        DataKind::Prompts => {
            let from = match &config.model {
                crate::config::ModelSource::Pretrained(p) => Some(p.clone()),
                crate::config::ModelSource::Scratch(_) => None,
            };
            Box::new(rl::Rl::new(config.rl.clone(), config.training.seed, from)?)
        }
        DataKind::Text | DataKind::Sft => Box::new(NextToken),
    })
}
