//! Sparse Mixture-of-Experts block (Qwen3MoeSparseMoeBlock) and its router losses.
//!
//! Dispatch is sparse: the router's top-k choices are read back once per layer (`N * k`
//! integers), slots are grouped by expert with a counting sort on the host, the tokens are
//! gathered into one expert-sorted buffer, each expert runs only on its contiguous group, and
//! the weighted outputs are written back to their `(token, slot)` places and summed over the k
//! slots. Every step is a differentiable tensor op (`select`, `narrow`, `cat`, `select_assign`),
//! so autodiff flows through it on every backend; the slot write-back has no duplicate indices,
//! which keeps it deterministic on GPUs as well. On Flex, from 64 tokens up, the same computation
//! runs as one fused operation with its own backward (`qwen_burn_kernels::moe_experts`).
//!
//! With `router_capacity_factor` (training forwards only) each sequence caps every expert at
//! that factor times its share of the sequence's slots, in position order, so balance holds
//! even while the router cannot tell tokens apart ([`capacity_limited_topk`]). With
//! `router_centering`, training forwards also report the sum of the router's inputs, from which
//! the trainer keeps the router weight orthogonal to the inputs' mean (see
//! [`SparseMoe::center_router`]).

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::config::{MoeConfig, Qwen3Config};
use crate::mlp::{Mlp, linear};
use crate::projection::project;
use qwen_burn_kernels::{flex_training, moe_experts};

/// Router plus experts of one MoE layer; parameter names are the HF keys.
#[derive(Module, Debug)]
pub struct SparseMoe {
    /// Router `[hidden, num_experts]`, no bias (HF `mlp.gate.weight` is `[E, hidden]`).
    pub gate: Linear,
    /// `E` SwiGLU experts of width `moe_intermediate_size`.
    pub experts: Vec<Mlp>,
    /// Aux-loss-free balancing bias (DeepSeek-V3): added to the scores only to choose the top-k.
    /// Present only when `router_bias_update_rate > 0`; never trained by gradients.
    pub routing_bias: Option<Param<Tensor<1>>>,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the selected probabilities.
    pub norm_topk_prob: bool,
    /// Training-time expert capacity per sequence (`router_capacity_factor`; 0 = none).
    pub capacity_factor: f64,
    /// `router_centering`: training forwards report their router inputs' sum.
    pub centering: bool,
}

/// How one forward routes, decided by the caller: a training forward (the capacity applies and
/// the router-input sums are reported) or not, and where the packed documents of its rows
/// start (the capacity counts each document on its own).
#[derive(Debug, Clone, Copy, Default)]
pub struct Routing<'a> {
    /// A training forward.
    pub training: bool,
    /// `[b * t]` positions inside each token's document (packed rows), or `None` (one sequence
    /// a row).
    pub positions: Option<&'a [u32]>,
}

impl Routing<'_> {
    /// What a forward on `device` is by default: training when it records gradients.
    pub fn for_device(device: &Device) -> Self {
        Self {
            training: is_autodiff(device),
            positions: None,
        }
    }
}

/// What a MoE layer reports besides its output.
#[derive(Debug, Clone)]
pub struct RouterOutput {
    /// Raw router logits `[b * t, E]` (before softmax), for the aux and z losses.
    pub logits: Tensor<2>,
    /// Slots routed to each expert in this forward (`sum = b * t * k`), from the selection
    /// actually used (biased when aux-loss-free balancing is on).
    pub expert_counts: Vec<usize>,
    /// Under a training-time capacity: the counts the router (and bias) would have chosen
    /// without it, what validation and generation route by. `None` without a capacity.
    pub uncapped_counts: Option<Vec<usize>>,
    /// Under `router_centering`, in training forwards: the sum over this forward's tokens of
    /// the router input (`[hidden]`, padding included) and the number of tokens.
    pub input_sum: Option<(Vec<f64>, usize)>,
    /// Under a training-time capacity, in training forwards: the capped assignment `[b * t, k]`
    /// (expert ids) the experts were trained on, the target of the assignment loss
    /// ([`assignment_loss`]).
    pub assignment: Option<Tensor<2, Int>>,
}

impl SparseMoe {
    /// Build with HF's normal(0, initializer_range) init.
    pub fn new(c: &Qwen3Config, moe: &MoeConfig, device: &Device) -> Self {
        let (h, std) = (c.hidden_size, c.initializer_range);
        Self {
            gate: linear(h, moe.num_experts, false, std, device),
            experts: (0..moe.num_experts)
                .map(|_| Mlp::new(h, moe.moe_intermediate_size, std, device))
                .collect(),
            routing_bias: (moe.router_bias_update_rate > 0.0).then(|| {
                Initializer::Zeros
                    .init([moe.num_experts], device)
                    .set_require_grad(false)
            }),
            top_k: moe.num_experts_per_tok,
            norm_topk_prob: moe.norm_topk_prob,
            capacity_factor: moe.router_capacity_factor,
            centering: moe.router_centering,
        }
    }

    /// Number of experts.
    pub fn num_experts(&self) -> usize {
        self.experts.len()
    }

    /// With a routing bias, how many of the token-expert choices in `logits` (`[n, E]`, this
    /// layer's router logits) change when the bias is dropped, as an HF export routes, and how
    /// many choices there are (`n * k`); `None` without a bias. One device read.
    pub fn bias_changed_choices(&self, logits: &Tensor<2>) -> Option<(usize, usize)> {
        let bias = self.routing_bias.as_ref()?;
        let [n, e] = logits.dims();
        let k = self.top_k;
        let probs = softmax(logits.clone().detach(), 1);
        let (_, own) = probs.clone().topk_with_indices(k, 1);
        let (_, biased) = (probs + bias.val().detach().unsqueeze::<2>()).topk_with_indices(k, 1);
        let chosen = |ids: Tensor<2, Int>| ids.one_hot::<3>(e).sum_dim(1).reshape([n, e]);
        // An expert in the biased choice and not in the unbiased one is one changed choice.
        let changed = (chosen(biased) - chosen(own)).clamp_min(0).sum();
        let changed = changed.try_into_scalar::<i64>().ok()?;
        Some((changed.max(0) as usize, n * k))
    }

    /// `router_centering`, after an optimizer step: make the router weight `W` (`[hidden, E]`)
    /// orthogonal to `mean`, the step's mean router input: `W <- W - m (m^T W)` with
    /// `m = mean / |mean|`. A component shared by every token's router input then adds the same
    /// score (zero) to every expert, so the experts are ranked by what differs between tokens.
    /// The weight stays an ordinary router weight: HF routes the exported model the same way.
    /// A zero or non-finite mean, or a router carrying a LoRA adapter, is left alone.
    pub fn center_router(&mut self, mean: &[f64]) {
        let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt();
        let weight = &self.gate.weight;
        let [h, _] = weight.dims();
        if !(norm > 0.0 && norm.is_finite()) || mean.len() != h || weight.adapter().is_some() {
            return;
        }
        let unit: Vec<f32> = mean.iter().map(|&v| (v / norm) as f32).collect();
        self.gate.weight = weight.clone().map(|w| {
            let tracked = w.is_require_grad();
            let w = w.detach();
            let m = Tensor::<2>::from_data(TensorData::new(unit, [h, 1]), &w.device());
            let along = m.clone().transpose().matmul(w.clone()); // [1, E]
            // A fresh leaf: the optimizer's next step tracks it like the weight it replaces.
            let centred = (w - m.matmul(along)).detach();
            if tracked {
                centred.require_grad()
            } else {
                centred
            }
        });
    }

    /// Route, run each expert on its tokens only, combine.
    ///
    /// # Shapes
    /// - `x`: `[b, t, hidden]` -> `[b, t, hidden]`
    pub fn forward(&self, x: Tensor<3>, routing: Routing<'_>) -> (Tensor<3>, RouterOutput) {
        let [b, t, h] = x.dims();
        let (n, k, e) = (b * t, self.top_k, self.num_experts());
        let x = x.reshape([n, h]);

        // 1. Router: softmax over all experts (f32 here), top-k, optional renormalisation.
        let logits = router_logits(&self.gate, x.clone()); // [n, e]
        let probs = softmax(logits.clone(), 1);
        let (weights, indices) = match &self.routing_bias {
            None => probs.clone().topk_with_indices(k, 1),
            Some(bias) => {
                let scores = probs.clone().detach() + bias.val().detach().unsqueeze::<2>();
                let (_, indices) = scores.topk_with_indices(k, 1);
                (probs.clone().gather(1, indices.clone()), indices)
            }
        }; // [n, k] each

        // Training forwards under a capacity: each sequence's tokens, in position order, take
        // their best experts that still have room (the biased scores rank them, as above).
        let capped = (self.capacity_factor > 0.0 && routing.training).then(|| {
            let scores = match &self.routing_bias {
                None => probs.clone().detach(),
                Some(bias) => probs.clone().detach() + bias.val().detach().unsqueeze::<2>(),
            };
            let scores: Vec<f32> = scores
                .try_into_vec_as::<f32>()
                .expect("router scores are readable");
            let positions = routing.positions.filter(|p| p.len() == n);
            capacity_limited_topk(&scores, b, t, e, k, self.capacity_factor, positions)
        });
        let input_sum = (self.centering && routing.training).then(|| {
            let sum: Vec<f32> = x
                .clone()
                .detach()
                .sum_dim(0)
                .try_into_vec_as::<f32>()
                .expect("router inputs are readable");
            (sum.into_iter().map(f64::from).collect(), n)
        });
        let capped_given = capped.is_some();
        let (weights, indices, uncapped_counts) = match capped {
            Some(ids) => {
                let uncapped = ids_and_counts(&indices, e).1;
                let indices =
                    Tensor::<2, Int>::from_data(TensorData::new(ids, [n, k]), &x.device());
                (
                    probs.clone().gather(1, indices.clone()),
                    indices,
                    Some(uncapped),
                )
            }
            None => (weights, indices, None),
        };
        let weights = if self.norm_topk_prob {
            weights.clone() / weights.sum_dim(1)
        } else {
            weights
        };

        let assignment = capped_given.then(|| indices.clone());
        // 2. Group the n*k (token, slot) pairs by expert: one read of n*k ids, counting sort.
        let (ids, counts) = ids_and_counts(&indices, e);
        if let Some(y) = self.fused_experts(&x, &weights, &indices) {
            let router = RouterOutput {
                logits,
                expert_counts: counts,
                uncapped_counts,
                input_sum,
                assignment,
            };
            return (y.reshape([b, t, h]), router);
        }
        let mut next = Vec::with_capacity(e);
        let mut acc = 0;
        for &c in &counts {
            next.push(acc);
            acc += c;
        }
        let mut order = vec![0i64; n * k]; // sorted position -> slot (token * k + j)
        for (slot, &id) in ids.iter().enumerate() {
            order[next[id as usize]] = slot as i64;
            next[id as usize] += 1;
        }
        let tokens: Vec<i64> = order.iter().map(|&slot| slot / k as i64).collect();
        let device = x.device();
        let order = Tensor::<1, Int>::from_data(TensorData::new(order, [n * k]), &device);
        let tokens = Tensor::<1, Int>::from_data(TensorData::new(tokens, [n * k]), &device);

        // 3. Gather tokens in expert order and run each expert on its contiguous group.
        let sorted_x = x.select(0, tokens); // [n*k, h]
        let sorted_w = weights.reshape([n * k]).select(0, order.clone()); // [n*k]
        let mut outputs = Vec::with_capacity(e);
        let mut start = 0;
        for (expert, &count) in self.experts.iter().zip(&counts) {
            if count > 0 {
                let rows = sorted_x.clone().narrow(0, start, count);
                // One token in the whole forward (decoding) takes the matrix-vector kernel;
                // otherwise an expert's rows sum as the fused kernel's do, however few.
                outputs.push(if n > 1 {
                    expert.forward_batched(rows)
                } else {
                    expert.forward(rows)
                });
            }
            start += count;
        }
        let sorted_y = Tensor::cat(outputs, 0) * sorted_w.unsqueeze_dim(1); // [n*k, h]

        // 4. Back to (token, slot) order, then sum the k slots of each token.
        let slots = Tensor::<2>::zeros([n * k, h], &device).select_assign(
            0,
            order,
            sorted_y,
            IndexingUpdateOp::Add,
        );
        let y = slots.reshape([n, k, h]).sum_dim(1).reshape([b, t, h]);
        (
            y,
            RouterOutput {
                logits,
                expert_counts: counts,
                uncapped_counts,
                input_sum,
                assignment,
            },
        )
    }
}

/// Whether `device` records gradients (a training forward).
fn is_autodiff(device: &Device) -> bool {
    use burn::backend::DispatchDevice;
    matches!(device.as_dispatch(), DispatchDevice::Autodiff(_))
}

/// The expert ids of a `[n, k]` selection (one device read) and the slots per expert.
fn ids_and_counts(indices: &Tensor<2, Int>, e: usize) -> (Vec<i64>, Vec<usize>) {
    let ids: Vec<i64> = indices
        .clone()
        .try_into_vec_as::<i64>()
        .expect("router indices are readable");
    let mut counts = vec![0usize; e];
    for &id in &ids {
        counts[id as usize] += 1;
    }
    (ids, counts)
}

/// Fewest tokens for which a MoE layer runs its experts through the fused kernel.
const FUSED_MIN_TOKENS: usize = 64;

impl SparseMoe {
    /// The experts through the fused Flex kernel ([`moe_experts`]), which takes the expert
    /// matrices stacked; `None` on other devices, below [`FUSED_MIN_TOKENS`] tokens, or when an
    /// expert projection carries a LoRA adapter or a bias.
    fn fused_experts(
        &self,
        x: &Tensor<2>,
        weights: &Tensor<2>,
        indices: &Tensor<2, Int>,
    ) -> Option<Tensor<2>> {
        let plain = |l: &Linear| l.weight.adapter().is_none() && l.bias.is_none();
        let all_plain = self
            .experts
            .iter()
            .all(|m| plain(&m.gate_proj) && plain(&m.up_proj) && plain(&m.down_proj));
        // Decoding (a few tokens) keeps the per-expert path, whose single rows go to the
        // matrix-vector kernel: stacking every expert's weights would cost more than the step.
        let [n, _] = x.dims();
        if !all_plain || !flex_training(&x.device()) || n < FUSED_MIN_TOKENS {
            return None;
        }
        let stack = |pick: fn(&Mlp) -> &Linear| {
            Tensor::stack::<3>(
                self.experts.iter().map(|m| pick(m).weight.val()).collect(),
                0,
            )
        };
        moe_experts(
            x,
            &stack(|m| &m.gate_proj),
            &stack(|m| &m.up_proj),
            &stack(|m| &m.down_proj),
            weights,
            indices,
        )
    }
}

/// Reference MoE computation: every expert on every token, weighted by a dense `[n, E]` routing
/// matrix that is zero outside each token's top-k. Same result as [`SparseMoe::forward`]
/// (tests check outputs and gradients to 1e-5) at `E / k` times the expert FLOPs; kept for
/// tests and benchmarks.
///
/// # Shapes
/// - `x`: `[b, t, hidden]` -> `[b, t, hidden]`
pub fn naive_forward(moe: &SparseMoe, x: Tensor<3>) -> Tensor<3> {
    let [b, t, h] = x.dims();
    let (n, e) = (b * t, moe.num_experts());
    let x = x.reshape([n, h]);
    let probs = softmax(router_logits(&moe.gate, x.clone()), 1);
    let (w, idx) = match &moe.routing_bias {
        None => probs.topk_with_indices(moe.top_k, 1),
        Some(bias) => {
            let (_, idx) = (probs.clone().detach() + bias.val().detach().unsqueeze::<2>())
                .topk_with_indices(moe.top_k, 1);
            (probs.gather(1, idx.clone()), idx)
        }
    };
    let w = if moe.norm_topk_prob {
        w.clone() / w.sum_dim(1)
    } else {
        w
    };
    let device = x.device();
    let routing = Tensor::<2>::zeros([n, e], &device).scatter(1, idx, w, IndexingUpdateOp::Add);
    let mut y = Tensor::<2>::zeros([n, h], &device);
    for (i, expert) in moe.experts.iter().enumerate() {
        y = y + expert.forward(x.clone()) * routing.clone().narrow(1, i, 1);
    }
    y.reshape([b, t, h])
}

mod capacity;
mod losses;
mod stats;

pub use capacity::capacity_limited_topk;
pub use losses::{
    assignment_loss, balancing_loss, load_balancing_loss, router_z_loss, selection_counts,
};
pub use stats::RouterStats;

/// The router's logits, its product in f32 whatever the run's precision: a routing choice turns
/// on small differences between logits, which bf16 operands would move (mixed-precision MoE
/// training keeps the router in f32, as Megatron-LM and DeepSeek-V3 do). Its backward keeps f32.
/// A router stored in bf16 (a frozen bf16 LoRA base) multiplies its stored values, widened, by
/// the f32 inputs: the fused kernels would make a bf16 weight's product in bf16.
fn router_logits(gate: &Linear, x: Tensor<2>) -> Tensor<2> {
    let w = gate.weight.val();
    if w.dtype() != burn::tensor::DType::F32 && gate.weight.adapter().is_none() {
        let y = x.matmul(qwen_burn_kernels::widened(w));
        return match &gate.bias {
            Some(b) => y + b.val().unsqueeze(),
            None => y,
        };
    }
    qwen_burn_kernels::with_precision(qwen_burn_kernels::Precision::F32, || project(gate, x))
}
