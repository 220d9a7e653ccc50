//! One optimizer step's gradient, common to every [objective](crate::objective): the forward
//! through the decoder (with or without activation checkpointing), the objective's loss, the
//! MoE router losses, gradient accumulation over micro-batches, the replicas of data
//! parallelism, and the step's statistics.
//!
//! Loss of a step of `k` micro-batches with `N` units in all (next-token: target tokens):
//! `sum_m objective_sum_m / N + coef_aux * aux + coef_z * z`, where `aux` and `z` are the mean
//! over micro-batches of each forward's router losses (as HF computes them per forward), except
//! for `global_batch`, whose `aux` is exactly the loss of the whole step's tokens (see
//! [`Step::part`]). The router terms enter only with `output_router_logits` (HF).
//!
//! Files: [`batch`] (tensors of a batch), [`checkpointed`] (activation checkpointing),
//! [`routers`] (router losses, `global_batch`'s meeting point), [`stats`] ([`StepStats`]),
//! [`replicas`] (data parallelism).

pub mod batch;
mod checkpointed;
pub mod replicas;
pub mod routers;
pub mod stats;

use std::borrow::Cow;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Bool, Device, Tensor};
use qwen_burn_data::Batch;
use qwen_burn_model::moe::RouterOutput;
use qwen_burn_model::{Qwen3ForCausalLM, RouterStats};

use crate::config::{ActivationCheckpointing, Reproducible, TrainingConfig};
use crate::error::{Result, TrainError};
use crate::objective::{NextToken, Objective, ObjectiveLoss};

pub use batch::{batch_documents, batch_tensors, input_tensors, real_tokens, target_tensor};
pub use replicas::Replicas;
pub use routers::{LossParts, StepSync, add_router_losses, own_fractions};
pub use stats::StepStats;

use routers::{add_f64, forward_counts, fractions, global_batch};
use stats::{add_counts, add_sums};

/// How a run computes its steps' gradients: its objective and its per-run options. A run holds
/// its own, so two runs in one process can differ in them.
#[derive(Clone, Copy)]
pub struct Step<'a> {
    /// What the step differentiates.
    pub objective: &'a dyn Objective,
    /// Recompute each decoder layer's activations in the backward
    /// (`training.activation_checkpointing = "layers"`).
    pub checkpoint_layers: bool,
    /// `training.reproducible = "bitwise"`: every row is a forward and backward of its own, and
    /// the rows' gradients are added in their order in the step (see [`Step::forwards`]).
    pub bitwise: bool,
}

/// Forward + backward of one step of next-token cross-entropy over `batches` (gradient
/// accumulation) on one device, without activation checkpointing.
pub fn forward_backward(
    model: &Qwen3ForCausalLM,
    batches: &[Batch],
    device: &Device,
) -> Result<(GradientsParams, StepStats)> {
    Step::next_token().run(model, batches, device)
}

pub(crate) fn read_scalar(t: Tensor<1>) -> Result<f64> {
    t.try_into_scalar::<f32>()
        .map(f64::from)
        .map_err(|e| TrainError::Device(format!("{e:?}")))
}

/// One forward kept for its backward: the objective's loss, the router outputs and padding
/// mask, and under activation checkpointing what the layer-by-layer backward needs.
struct Forward {
    objective: ObjectiveLoss,
    routers: Vec<RouterOutput>,
    mask: Option<Tensor<2, Bool>>,
    stack: Option<checkpointed::Stack>,
}

impl Step<'static> {
    /// Next-token cross-entropy without activation checkpointing.
    pub fn next_token() -> Self {
        Step {
            objective: &NextToken,
            checkpoint_layers: false,
            bitwise: false,
        }
    }
}

impl<'a> Step<'a> {
    /// The step of a run training `objective` as `training` says.
    pub fn of_run(objective: &'a dyn Objective, training: &TrainingConfig) -> Self {
        Step {
            objective,
            checkpoint_layers: training.activation_checkpointing == ActivationCheckpointing::Layers,
            bitwise: training.reproducible == Reproducible::Bitwise,
        }
    }

    /// The same step with activation checkpointing on or off.
    pub fn with_checkpointing(self, on: bool) -> Self {
        Step {
            checkpoint_layers: on,
            ..self
        }
    }

    /// The units the step's loss averages over: those of all of `batches`, and any the
    /// objective left out of them ([`Objective::units_left_out`]).
    pub fn units(&self, batches: &[Batch]) -> usize {
        batches
            .iter()
            .map(|b| self.objective.units(b))
            .sum::<usize>()
            + self.objective.units_left_out()
    }

    /// The forwards `batches` take: one per micro-batch, or under `bitwise` one per row. A
    /// row's numbers then depend on that row alone, and adding the rows' gradients one by one
    /// in their order gives the same sum whichever micro-batch held each row: any split of a
    /// global batch (`batch_size x grad_accum`, replicas) gives the same gradient, bit for bit.
    /// The per-forward router losses (HF's aux and z losses) become per-row means, and an
    /// expert capacity applies to each row.
    pub fn forwards<'b>(&self, batches: &'b [Batch]) -> Cow<'b, [Batch]> {
        if self.bitwise {
            Cow::Owned(batches.iter().flat_map(Batch::rows).collect())
        } else {
            Cow::Borrowed(batches)
        }
    }

    /// Forward + backward of one optimizer step over `batches` (gradient accumulation) on one
    /// device, returning the summed gradients and the step's statistics. `k` micro-batches give
    /// exactly the gradient of one batch `k` times larger for the objective (normalised by the
    /// step's units) and for `global_batch`; the other balancing losses are per forward.
    pub fn run(
        &self,
        model: &Qwen3ForCausalLM,
        batches: &[Batch],
        device: &Device,
    ) -> Result<(GradientsParams, StepStats)> {
        let forwards = self.forwards(batches);
        self.part(
            model,
            &forwards,
            device,
            self.units(batches),
            forwards.len(),
            None,
        )
    }

    /// The forward of one micro-batch, and the objective's loss from it.
    fn forward(
        &self,
        model: &Qwen3ForCausalLM,
        inner: Option<&Qwen3ForCausalLM>,
        batch: &Batch,
        device: &Device,
        step_units: f64,
    ) -> Result<Forward> {
        let (hidden, routers, mask, stack) = match inner {
            Some(inner) => {
                let (hidden, routers, mask, stack) =
                    checkpointed::forward(model, inner, batch, device)?;
                (hidden, routers, mask, Some(stack))
            }
            None => {
                let (inputs, mask) = input_tensors(batch, device);
                let docs = batch_documents(batch, model)?;
                let (hidden, routers) =
                    model.forward_hidden_packed(inputs, mask.clone(), docs.as_ref());
                (hidden, routers, mask, None)
            }
        };
        // The objective's loss is formed with the forward (the fused head kernel computes its
        // gradients there); the router losses wait for the step's fractions under
        // `global_batch`.
        let objective = self
            .objective
            .loss(model, hidden, batch, device, step_units)?;
        Ok(Forward {
            objective,
            routers,
            mask,
            stack,
        })
    }

    /// [`Step::run`] over a part of a step (one device's share under data parallelism): losses
    /// are normalised by the whole step's `step_units` and `total_micro` micro-batches, so the
    /// parts' gradients and statistics add up to the whole step's. Each of `batches` is one
    /// forward: the caller has already cut them by [`Step::forwards`].
    ///
    /// `global_batch` needs the step's expert counts before any router loss can be formed, so
    /// it runs all forwards of the part first (holding their activations, as one large batch
    /// would), meets the other replicas at `sync` to sum the counts, then runs the backwards.
    /// Each forward's balancing loss is then weighted by its share of the step's real tokens,
    /// which makes the sum exactly the loss of the whole step: `E * sum_e f_e(step) *
    /// P_e(step)` per layer.
    pub fn part(
        &self,
        model: &Qwen3ForCausalLM,
        batches: &[Batch],
        device: &Device,
        step_units: usize,
        total_micro: usize,
        sync: Option<&StepSync>,
    ) -> Result<(GradientsParams, StepStats)> {
        let norm = step_units.max(1) as f64;
        let k = total_micro.max(1) as f64;
        let mut accumulator = GradientsAccumulator::<Qwen3ForCausalLM>::new();
        let mut stats = StepStats::default();
        let inner = self.checkpoint_layers.then(|| model.valid());
        let forward = |batch: &Batch| self.forward(model, inner.as_ref(), batch, device, norm);

        let mut backward = |fwd: Forward,
                            batch: &Batch,
                            router_weight: f64,
                            fractions: Option<&[Vec<f64>]>|
         -> Result<()> {
            let Forward {
                objective,
                routers,
                mask,
                stack,
            } = fwd;
            stats.tokens += batch.batch_size * batch.seq_len;
            stats.non_padding_tokens += real_tokens(batch);
            let parts = add_router_losses(
                &model.config,
                objective.loss,
                &routers,
                batch.batch_size,
                mask.as_ref(),
                router_weight,
                fractions,
            );
            if let Some(aux) = parts.aux {
                *stats.aux_loss.get_or_insert(0.0) += read_scalar(aux)? * router_weight;
            }
            if let Some(z) = parts.z {
                *stats.z_loss.get_or_insert(0.0) += read_scalar(z)? / k;
            }
            if let Some(a) = parts.assignment {
                *stats.assignment_loss.get_or_insert(0.0) += read_scalar(a)? * router_weight;
            }
            record_routing(&mut stats, &routers, k);
            stats.add_figures(&objective.figures);
            // Each forward's share of the step's loss, added in order: the rows of a `bitwise`
            // step give the same figure in one part or in one part each.
            stats.loss += read_scalar(objective.sum)? / norm;
            let grads = parts.loss.backward();
            match stack {
                Some(stack) => {
                    checkpointed::backward(model, mask, stack, &routers, grads, &mut accumulator)?
                }
                None => accumulator.accumulate(model, GradientsParams::from_grads(grads, model)),
            }
            Ok(())
        };

        match global_batch(&model.config) {
            None => {
                // Forward then backward, one micro-batch at a time: one micro-batch of
                // activations.
                for batch in batches {
                    backward(forward(batch)?, batch, 1.0 / k, None)?;
                }
            }
            Some(top_k) => {
                let forwards: Vec<Forward> = batches.iter().map(forward).collect::<Result<_>>()?;
                let mut counts = Vec::new();
                let mut tokens = 0.0;
                for f in &forwards {
                    let (c, t) = forward_counts(&f.routers, top_k, f.mask.as_ref());
                    add_f64(&mut counts, &c);
                    tokens += t;
                }
                let (step_fractions, step_tokens) = match sync {
                    Some(s) => s.exchange(&counts, tokens),
                    None => fractions(&counts, tokens),
                };
                for (fwd, batch) in forwards.into_iter().zip(batches) {
                    let share = real_tokens(batch) as f64 / step_tokens.max(1.0);
                    backward(fwd, batch, share, Some(&step_fractions))?;
                }
            }
        }
        Ok((accumulator.grads(), stats))
    }
}

/// Add one forward's routing counts, router-input sums and entropies (the latter averaged over
/// the step's `k` micro-batches) to `stats`.
fn record_routing(stats: &mut StepStats, routers: &[RouterOutput], k: f64) {
    if routers.is_empty() {
        return;
    }
    let counts: Vec<Vec<usize>> = routers.iter().map(|r| r.expert_counts.clone()).collect();
    add_counts(&mut stats.expert_counts, &counts);
    let uncapped: Vec<Vec<usize>> = routers
        .iter()
        .filter_map(|r| r.uncapped_counts.clone())
        .collect();
    add_counts(&mut stats.uncapped_counts, &uncapped);
    let sums: Vec<(Vec<f64>, usize)> = routers.iter().filter_map(|r| r.input_sum.clone()).collect();
    add_sums(&mut stats.router_input_sums, &sums);
    let entropy: Vec<f64> = routers
        .iter()
        .map(|r| RouterStats::mean_entropy(&r.logits) / k)
        .collect();
    if stats.router_entropy.is_empty() {
        stats.router_entropy = entropy;
    } else {
        stats
            .router_entropy
            .iter_mut()
            .zip(&entropy)
            .for_each(|(a, b)| *a += b);
    }
}
