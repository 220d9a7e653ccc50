//! One training step's forward and backward: batch tensors, the loss (assembled in one place,
//! [`assemble_loss`], which `train`, `bench` and `score` share), gradient accumulation over
//! micro-batches, and the step's statistics.
//!
//! Loss of a step of `k` micro-batches with `N` target tokens in all:
//! `sum_m ce_sum_m / N + coef_aux * aux + coef_z * z`, where `aux` and `z` are the mean over
//! micro-batches of each forward's router losses (as HF computes them per forward), except for
//! `global_batch`, whose `aux` is exactly the loss of the whole step's tokens (see
//! [`forward_backward_part`]). The router terms enter only with `output_router_logits` (HF).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use qwen_burn_data::Batch;
use qwen_burn_model::moe::RouterOutput;
use qwen_burn_model::{
    BalanceLoss, Documents, Qwen3Config, Qwen3ForCausalLM, RouterStats, assignment_loss,
    balancing_loss, router_z_loss, selection_counts,
};

use crate::error::{Result, TrainError};

pub use crate::step_stats::StepStats;
use crate::step_stats::{add_counts, add_sums};

/// Batch tensors on `device`: inputs `[b, t]`, targets `[b, t]`, optional padding mask.
pub fn batch_tensors(
    batch: &Batch,
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2, Int>, Option<Tensor<2, Bool>>) {
    let (b, t) = (batch.batch_size, batch.seq_len);
    let inputs: Vec<i64> = batch.inputs.iter().map(|&i| i64::from(i)).collect();
    let inputs = Tensor::from_data(TensorData::new(inputs, [b, t]), device);
    let targets = Tensor::from_data(TensorData::new(batch.targets.clone(), [b, t]), device);
    let mask = batch.attention_mask.as_ref().map(|m| {
        let m: Vec<bool> = m.iter().map(|&x| x != 0).collect();
        Tensor::from_data(TensorData::new(m, [b, t]), device)
    });
    (inputs, targets, mask)
}

/// The document layout of a packed batch ([`Batch::positions`]), `None` for one document per row.
pub fn batch_documents(batch: &Batch) -> Result<Option<Documents>> {
    batch
        .positions
        .as_ref()
        .map(|p| Documents::new(batch.batch_size, batch.seq_len, p.clone()))
        .transpose()
        .map_err(TrainError::from)
}

/// The summed next-token cross-entropy of one batch and its router outputs, with its padding
/// mask (for the balancing losses): the forward that training, validation and `bench` share.
/// Packed documents are kept apart ([`Qwen3ForCausalLM::forward_hidden_packed`]).
pub fn forward_ce_sum(
    model: &Qwen3ForCausalLM,
    batch: &Batch,
    device: &Device,
) -> Result<(Tensor<1>, Vec<RouterOutput>, Option<Tensor<2, Bool>>)> {
    let (inputs, targets, mask) = batch_tensors(batch, device);
    let docs = batch_documents(batch)?;
    let (hidden, routers) = model.forward_hidden_packed(inputs, mask.clone(), docs.as_ref());
    Ok((model.head_cross_entropy_sum(hidden, targets), routers, mask))
}

/// Targets that count in the loss.
pub fn count_targets(batch: &Batch) -> usize {
    batch.targets.iter().filter(|&&t| t >= 0).count()
}

/// The parts of one forward pass's loss.
pub struct LossParts {
    /// What to differentiate: `ce_sum / ce_norm + router_weight * (coefs * router losses)`.
    pub loss: Tensor<1>,
    /// Summed cross-entropy over the target tokens.
    pub ce_sum: Tensor<1>,
    /// Unweighted load-balancing loss (MoE), as configured by `router_aux_loss_type`.
    pub aux: Option<Tensor<1>>,
    /// Unweighted router z-loss (MoE with `router_z_loss_coef > 0`).
    pub z: Option<Tensor<1>>,
    /// Unweighted assignment loss (MoE with `router_assignment_loss_coef > 0` in a training
    /// forward under a capacity).
    pub assignment: Option<Tensor<1>>,
}

/// The one place the training loss is assembled (train, bench, score and eval use it).
///
/// `ce_sum` is the forward's summed cross-entropy
/// ([`Qwen3ForCausalLM::head_cross_entropy_sum`], or `loss::cross_entropy_sum` of its logits),
/// `routers` its router outputs, `batch_size` its rows. `ce_norm` divides the summed
/// cross-entropy (the step's target count); `router_weight` scales this forward's router losses
/// (its share of the step); `global_fractions` are the step's selection fractions for
/// `global_batch`.
#[allow(clippy::too_many_arguments)]
pub fn assemble_loss(
    config: &Qwen3Config,
    ce_sum: Tensor<1>,
    routers: &[RouterOutput],
    batch_size: usize,
    mask: Option<&Tensor<2, Bool>>,
    ce_norm: f64,
    router_weight: f64,
    global_fractions: Option<&[Vec<f64>]>,
) -> LossParts {
    let mut loss = ce_sum.clone() / ce_norm;
    let (mut aux, mut z, mut assignment) = (None, None, None);
    if let Some(moe) = &config.moe {
        let b = batch_size;
        let logits: Vec<_> = routers.iter().map(|r| r.logits.clone()).collect();
        let mask_f = mask.map(|m| m.clone().float());
        let a = balancing_loss(
            moe.router_aux_loss_type,
            &logits,
            moe.num_experts,
            moe.num_experts_per_tok,
            b,
            mask_f.as_ref(),
            global_fractions,
        );
        // As in HF, the router losses enter the loss only with output_router_logits.
        if moe.output_router_logits && moe.router_aux_loss_coef > 0.0 {
            loss = loss + a.clone() * (moe.router_aux_loss_coef * router_weight);
        }
        aux = Some(a);
        if moe.router_assignment_loss_coef > 0.0 {
            let (logits, ids): (Vec<_>, Vec<_>) = routers
                .iter()
                .filter_map(|r| Some((r.logits.clone(), r.assignment.clone()?)))
                .unzip();
            if let Some(al) = assignment_loss(&logits, &ids, mask_f.as_ref()) {
                if moe.output_router_logits {
                    loss = loss + al.clone() * (moe.router_assignment_loss_coef * router_weight);
                }
                assignment = Some(al);
            }
        }
        if moe.router_z_loss_coef > 0.0 {
            let zl = router_z_loss(&logits);
            if moe.output_router_logits {
                loss = loss + zl.clone() * (moe.router_z_loss_coef * router_weight);
            }
            z = Some(zl);
        }
    }
    LossParts {
        loss,
        ce_sum,
        aux,
        z,
        assignment,
    }
}

/// For a `global_batch` model scored on one forward (`score`, `eval`), that forward is the
/// whole "step": its own selection fractions. `None` for the other kinds.
pub fn own_fractions(
    config: &Qwen3Config,
    routers: &[RouterOutput],
    mask: Option<&Tensor<2, Bool>>,
) -> Option<Vec<Vec<f64>>> {
    let moe = config.moe.as_ref()?;
    if moe.router_aux_loss_type != BalanceLoss::GlobalBatch {
        return None;
    }
    let logits: Vec<_> = routers.iter().map(|r| r.logits.clone()).collect();
    let mask_f = mask.map(|m| m.clone().float());
    let (counts, tokens) = selection_counts(&logits, moe.num_experts_per_tok, mask_f.as_ref());
    Some(fractions(&counts, tokens).0)
}

pub(crate) fn read_scalar(t: Tensor<1>) -> Result<f64> {
    t.try_into_scalar::<f32>()
        .map(f64::from)
        .map_err(|e| TrainError::Device(format!("{e:?}")))
}

/// One forward kept for its backward: its summed cross-entropy, router outputs and padding
/// mask, and under activation checkpointing what the layer-by-layer backward needs.
struct Forward {
    ce_sum: Tensor<1>,
    routers: Vec<RouterOutput>,
    mask: Option<Tensor<2, Bool>>,
    stack: Option<Stack>,
}

/// A forward run with activation checkpointing: the decoder stack ran without a graph, keeping
/// only each layer's input; the final norm, the head and the loss ran with one, from a leaf
/// standing for the last layer's output (`last`), and the router losses from leaves standing
/// for each MoE layer's router logits (the `logits` of `Forward::routers`).
struct Stack {
    /// Inputs of layers `0..L` (no autodiff).
    inputs: Vec<Tensor<3>>,
    /// The leaf the final norm reads.
    last: Tensor<3>,
    /// The batch's token ids and document layout, for the recomputation.
    input_ids: Tensor<2, Int>,
    docs: Option<Documents>,
}

static CHECKPOINT_LAYERS: AtomicBool = AtomicBool::new(false);

/// Activation checkpointing of the decoder layers (`training.activation_checkpointing =
/// "layers"`), process-wide like the fused-kernel switch: each layer's activations are
/// recomputed in the backward instead of being kept from the forward. Off by default.
pub fn set_activation_checkpointing(on: bool) {
    CHECKPOINT_LAYERS.store(on, Ordering::Relaxed);
}

/// Whether [`set_activation_checkpointing`] is on.
pub fn activation_checkpointing() -> bool {
    CHECKPOINT_LAYERS.load(Ordering::Relaxed)
}

/// [`forward_ce_sum`] with activation checkpointing ([`Stack`]): the stack runs on the model
/// without autodiff (the same kernels, so the same values), keeping each layer's input.
fn forward_checkpointed(
    model: &Qwen3ForCausalLM,
    inner: &Qwen3ForCausalLM,
    batch: &Batch,
    device: &Device,
) -> Result<Forward> {
    let (input_ids, targets, mask) = batch_tensors(batch, device);
    let docs = batch_documents(batch)?;
    let (mut x, layer_inputs) = inner.embed_for_layers(
        input_ids.clone().inner(),
        mask.clone().map(|m| m.inner()),
        docs.as_ref(),
    );
    // Routed as the recomputation (a training forward with autodiff) routes, capacity included.
    let layer_inputs = layer_inputs.with_training_routing(true);
    let layers = inner.config.num_hidden_layers;
    let mut inputs = Vec::with_capacity(layers);
    let mut routers = Vec::new();
    for i in 0..layers {
        inputs.push(x.clone());
        let (y, router) = inner.layer(i, x, &layer_inputs);
        x = y;
        routers.extend(router.map(|r| RouterOutput {
            logits: Tensor::from_inner(r.logits).require_grad(),
            assignment: r.assignment.map(Tensor::from_inner),
            ..r
        }));
    }
    let last = Tensor::from_inner(x).require_grad();
    let hidden = model.final_norm(last.clone());
    Ok(Forward {
        ce_sum: model.head_cross_entropy_sum(hidden, targets),
        routers,
        mask,
        stack: Some(Stack {
            inputs,
            last,
            input_ids,
            docs,
        }),
    })
}

/// The backward of a checkpointed forward, after the loss's own (`grads`, which reached the
/// head, the final norm, `stack.last` and the router-logit leaves): layer by layer from the
/// last, each recomputed from its kept input with a graph, then differentiated against the
/// gradient of its output (and of its router logits, for the router losses); then the
/// embedding. Each part's parameter gradients go to `accumulator`.
fn backward_checkpointed(
    model: &Qwen3ForCausalLM,
    mask: Option<Tensor<2, Bool>>,
    stack: Stack,
    routers: &[RouterOutput],
    grads: burn::tensor::Gradients,
    accumulator: &mut GradientsAccumulator<Qwen3ForCausalLM>,
) -> Result<()> {
    let missing = || {
        TrainError::Other(
            "activation checkpointing: no gradient reached the last layer's output".into(),
        )
    };
    let mut dy = stack.last.grad(&grads).ok_or_else(missing)?;
    let mut router_grads: Vec<Option<Tensor<2>>> =
        routers.iter().map(|r| r.logits.grad(&grads)).collect();
    accumulator.accumulate(model, GradientsParams::from_grads(grads, model));

    let (embedded, layer_inputs) =
        model.embed_for_layers(stack.input_ids, mask, stack.docs.as_ref());
    for (i, x) in stack.inputs.into_iter().enumerate().rev() {
        let x = Tensor::from_inner(x).require_grad();
        let (y, router) = model.layer(i, x.clone(), &layer_inputs);
        let mut surrogate = (y * dy).sum();
        if let Some(router) = router {
            // MoE layers are counted from the top: the last router's gradient is the last one.
            if let Some(Some(g)) = router_grads.pop() {
                surrogate = surrogate + (router.logits * g).sum();
            }
        }
        let grads = surrogate.backward();
        dy = x.grad(&grads).ok_or_else(missing)?;
        accumulator.accumulate(model, GradientsParams::from_grads(grads, model));
    }
    if embedded.is_tracked() {
        let grads = (embedded * dy).sum().backward();
        accumulator.accumulate(model, GradientsParams::from_grads(grads, model));
    }
    Ok(())
}

/// Where the replicas of one step meet for `global_batch`: each adds the selection counts of
/// its micro-batches, and all continue with the step's totals.
pub struct StepSync {
    barrier: Barrier,
    totals: Mutex<(Vec<Vec<f64>>, f64)>,
}

impl StepSync {
    /// For `replicas` threads.
    pub fn new(replicas: usize) -> Self {
        Self {
            barrier: Barrier::new(replicas),
            totals: Mutex::new((Vec::new(), 0.0)),
        }
    }

    /// Add this replica's counts and tokens; wait for the others; return the step's selection
    /// fractions (`counts / tokens`) and its real-token count. Counts are whole numbers, so the
    /// sums do not depend on the order the replicas arrive in.
    fn exchange(&self, counts: &[Vec<f64>], tokens: f64) -> (Vec<Vec<f64>>, f64) {
        {
            let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
            add_f64(&mut totals.0, counts);
            totals.1 += tokens;
        }
        self.barrier.wait();
        let totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        fractions(&totals.0, totals.1)
    }
}

fn add_f64(acc: &mut Vec<Vec<f64>>, other: &[Vec<f64>]) {
    if acc.is_empty() {
        *acc = other.to_vec();
        return;
    }
    for (a, b) in acc.iter_mut().zip(other) {
        a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
    }
}

fn fractions(counts: &[Vec<f64>], tokens: f64) -> (Vec<Vec<f64>>, f64) {
    let f = counts
        .iter()
        .map(|layer| layer.iter().map(|c| c / tokens.max(1.0)).collect())
        .collect();
    (f, tokens)
}

/// Forward + backward of one optimizer step over `batches` (gradient accumulation) on one
/// device, returning the summed gradients and the step's statistics. `k` micro-batches give
/// exactly the gradient of one batch `k` times larger for the cross-entropy (normalised by the
/// step's target count) and for `global_batch`; the other balancing losses are per forward.
pub fn forward_backward(
    model: &Qwen3ForCausalLM,
    batches: &[Batch],
    device: &Device,
) -> Result<(GradientsParams, StepStats)> {
    let total_targets = batches.iter().map(count_targets).sum::<usize>();
    forward_backward_part(model, batches, device, total_targets, batches.len(), None)
}

/// [`forward_backward`] over a part of a step (one device's share under data parallelism):
/// losses are normalised by the whole step's `total_targets` and `total_micro` micro-batches,
/// so the parts' gradients and statistics add up to the whole step's.
///
/// `global_batch` needs the step's expert counts before any router loss can be formed, so it
/// runs all forwards of the part first (holding their activations, as one large batch would),
/// meets the other replicas at `sync` to sum the counts, then runs the backwards. Each forward's
/// balancing loss is then weighted by its share of the step's real tokens, which makes the sum
/// exactly the loss of the whole step: `E * sum_e f_e(step) * P_e(step)` per layer.
pub fn forward_backward_part(
    model: &Qwen3ForCausalLM,
    batches: &[Batch],
    device: &Device,
    total_targets: usize,
    total_micro: usize,
    sync: Option<&StepSync>,
) -> Result<(GradientsParams, StepStats)> {
    let ce_norm = total_targets.max(1) as f64;
    let k = total_micro.max(1) as f64;
    let moe = model.config.moe.as_ref();
    let global = moe.is_some_and(|m| m.router_aux_loss_type == BalanceLoss::GlobalBatch);
    let mut accumulator = GradientsAccumulator::<Qwen3ForCausalLM>::new();
    let mut stats = StepStats::default();
    let mut ce_total = 0.0;

    // The loss's cross-entropy is formed with the forward (the fused head kernel computes its
    // gradients there); the router losses wait for the step's fractions under `global_batch`.
    let inner = activation_checkpointing().then(|| model.valid());
    let forward = |batch: &Batch| -> Result<Forward> {
        match &inner {
            Some(inner) => forward_checkpointed(model, inner, batch, device),
            None => {
                let (ce_sum, routers, mask) = forward_ce_sum(model, batch, device)?;
                Ok(Forward {
                    ce_sum,
                    routers,
                    mask,
                    stack: None,
                })
            }
        }
    };
    let mut backward = |Forward {
                            ce_sum,
                            routers,
                            mask,
                            stack,
                        }: Forward,
                        batch: &Batch,
                        router_weight: f64,
                        fractions: Option<&[Vec<f64>]>|
     -> Result<()> {
        stats.tokens += batch.batch_size * batch.seq_len;
        let parts = assemble_loss(
            &model.config,
            ce_sum,
            &routers,
            batch.batch_size,
            mask.as_ref(),
            ce_norm,
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
        if !routers.is_empty() {
            let counts: Vec<Vec<usize>> = routers.iter().map(|r| r.expert_counts.clone()).collect();
            add_counts(&mut stats.expert_counts, &counts);
            let uncapped: Vec<Vec<usize>> = routers
                .iter()
                .filter_map(|r| r.uncapped_counts.clone())
                .collect();
            add_counts(&mut stats.uncapped_counts, &uncapped);
            let sums: Vec<(Vec<f64>, usize)> =
                routers.iter().filter_map(|r| r.input_sum.clone()).collect();
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
        ce_total += read_scalar(parts.ce_sum)?;
        let grads = parts.loss.backward();
        match stack {
            Some(stack) => {
                backward_checkpointed(model, mask, stack, &routers, grads, &mut accumulator)?
            }
            None => accumulator.accumulate(model, GradientsParams::from_grads(grads, model)),
        }
        Ok(())
    };

    if !global {
        // Forward then backward, one micro-batch at a time: one micro-batch of activations.
        for batch in batches {
            backward(forward(batch)?, batch, 1.0 / k, None)?;
        }
    } else {
        let top_k = moe.map_or(1, |m| m.num_experts_per_tok);
        let forwards: Vec<Forward> = batches.iter().map(forward).collect::<Result<_>>()?;
        let mut counts = Vec::new();
        let mut tokens = 0.0;
        for Forward { routers, mask, .. } in &forwards {
            let logits: Vec<_> = routers.iter().map(|r| r.logits.clone()).collect();
            let mask_f = mask.as_ref().map(|m| m.clone().float());
            let (c, t) = selection_counts(&logits, top_k, mask_f.as_ref());
            add_f64(&mut counts, &c);
            tokens += t;
        }
        let (step_fractions, step_tokens) = match sync {
            Some(s) => s.exchange(&counts, tokens),
            None => fractions(&counts, tokens),
        };
        for (fwd, batch) in forwards.into_iter().zip(batches) {
            let real = batch
                .attention_mask
                .as_ref()
                .map_or(batch.batch_size * batch.seq_len, |m| {
                    m.iter().filter(|&&x| x != 0).count()
                });
            let share = real as f64 / step_tokens.max(1.0);
            backward(fwd, batch, share, Some(&step_fractions))?;
        }
    }
    stats.loss = ce_total / ce_norm;
    Ok((accumulator.grads(), stats))
}
