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
//! even while the router cannot tell tokens apart ([`capacity_limited_topk`]).

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::config::{BalanceLoss, MoeConfig, Qwen3Config};
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
        }
    }

    /// Number of experts.
    pub fn num_experts(&self) -> usize {
        self.experts.len()
    }

    /// Route, run each expert on its tokens only, combine.
    ///
    /// # Shapes
    /// - `x`: `[b, t, hidden]` -> `[b, t, hidden]`
    pub fn forward(&self, x: Tensor<3>) -> (Tensor<3>, RouterOutput) {
        let [b, t, h] = x.dims();
        let (n, k, e) = (b * t, self.top_k, self.num_experts());
        let x = x.reshape([n, h]);

        // 1. Router: softmax over all experts (f32 here), top-k, optional renormalisation.
        let logits = project(&self.gate, x.clone()); // [n, e]
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
        let capped = (self.capacity_factor > 0.0 && is_autodiff(&x.device())).then(|| {
            let scores = match &self.routing_bias {
                None => probs.clone().detach(),
                Some(bias) => probs.clone().detach() + bias.val().detach().unsqueeze::<2>(),
            };
            let scores: Vec<f32> = scores
                .try_into_vec_as::<f32>()
                .expect("router scores are readable");
            capacity_limited_topk(&scores, b, t, e, k, self.capacity_factor)
        });
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

        // 2. Group the n*k (token, slot) pairs by expert: one read of n*k ids, counting sort.
        let (ids, counts) = ids_and_counts(&indices, e);
        if let Some(y) = self.fused_experts(&x, &weights, &indices) {
            let router = RouterOutput {
                logits,
                expert_counts: counts,
                uncapped_counts,
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
                outputs.push(expert.forward(sorted_x.clone().narrow(0, start, count)));
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

/// Top-k under a per-sequence expert capacity: `scores` is `[rows * t, e]` (row-major, each
/// row a sequence of `t` tokens). Token `p` of a row takes, best score first, the experts that
/// hold fewer than `max(1, ceil(factor * (p + 1) * k / e))` of its row's earlier slots; the
/// limit never stops a token from finding `k` experts when `factor >= 1` (a token short of
/// room, possible only by rounding, takes its best remaining experts). So every expert holds at
/// most about `factor` times its share of every prefix, and a token's experts depend only on the
/// tokens before it in its row: causal, like the model, and independent of the other rows.
/// Returns `[rows * t, k]` expert ids, best first.
pub fn capacity_limited_topk(
    scores: &[f32],
    rows: usize,
    t: usize,
    e: usize,
    k: usize,
    factor: f64,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(rows * t * k);
    let mut order: Vec<usize> = Vec::with_capacity(e);
    for r in 0..rows {
        let mut load = vec![0usize; e];
        for p in 0..t {
            let cap = ((factor * ((p + 1) * k) as f64 / e as f64).ceil() as usize).max(1);
            let s = &scores[(r * t + p) * e..(r * t + p + 1) * e];
            order.clear();
            order.extend(0..e);
            order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
            let start = out.len();
            for &x in &order {
                if out.len() - start == k {
                    break;
                }
                if load[x] < cap {
                    out.push(x as i64);
                }
            }
            for &x in &order {
                if out.len() - start == k {
                    break;
                }
                if !out[start..].contains(&(x as i64)) {
                    out.push(x as i64);
                }
            }
            for &x in &out[start..] {
                load[x as usize] += 1;
            }
        }
    }
    out
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
    let probs = softmax(project(&moe.gate, x.clone()), 1);
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

/// HF `load_balancing_loss_func` (Switch / Mixtral / Qwen3-MoE), unweighted.
///
/// The router logits of all MoE layers are concatenated as extra tokens, then
/// `E * sum_{j,e} f[j,e] * Pbar[e]` with `f` the fraction of tokens whose slot `j` chose `e`
/// and `Pbar` the mean routing probability; a perfectly balanced router gives `k`. With an
/// `attention_mask` (`[b, t]`, 1 = real token, flattened in the same order as the logits) both
/// means run over real tokens only. Gradient flows through `Pbar` only.
pub fn load_balancing_loss(
    router_logits: &[Tensor<2>],
    num_experts: usize,
    top_k: usize,
    attention_mask: Option<&Tensor<2>>,
) -> Tensor<1> {
    let logits = Tensor::cat(router_logits.to_vec(), 0); // [layers * n, e]
    let [m, e] = logits.dims();
    let probs = softmax(logits, 1);
    let (_, selected) = probs.clone().detach().topk_with_indices(top_k, 1); // [m, k]
    let chosen = selected.one_hot::<3>(e).float(); // [m, k, e]
    let (f, pbar) = match attention_mask {
        None => (chosen.mean_dim(0), probs.mean_dim(0)), // [1, k, e], [1, e]
        Some(mask) => {
            let layers = router_logits.len();
            let mask = mask
                .clone()
                .reshape([1, m / layers])
                .repeat_dim(0, layers)
                .reshape([m, 1]);
            let total = mask.clone().sum();
            let f = (chosen * mask.clone().unsqueeze_dim::<3>(2)).sum_dim(0)
                / total.clone().reshape([1, 1, 1]);
            let pbar = (probs * mask).sum_dim(0) / total.reshape([1, 1]);
            (f, pbar)
        }
    };
    (f * pbar.unsqueeze_dim::<3>(1)).sum() * num_experts as f64
}

/// Real-token weights `[n, 1]` (1 = counts) of a `[b, t]` attention mask, or ones.
fn token_weights(mask: Option<&Tensor<2>>, n: usize, device: &Device) -> Tensor<2> {
    match mask {
        Some(m) => m.clone().reshape([n, 1]),
        None => Tensor::ones([n, 1], device),
    }
}

/// `[n, E]`: 1 where the expert is in the token's (unbiased) top-k, as HF counts it.
fn selected(probs: &Tensor<2>, top_k: usize) -> Tensor<2> {
    let [n, e] = probs.dims();
    let (_, idx) = probs.clone().detach().topk_with_indices(top_k, 1);
    idx.one_hot::<3>(e).float().sum_dim(1).reshape([n, e])
}

/// Per MoE layer, how many real tokens selected each expert (unbiased top-k, as the losses
/// count them), and the number of real tokens: the statistics `global_batch` sums over the
/// micro-batches and replicas of a step. One device read per layer.
pub fn selection_counts(
    router_logits: &[Tensor<2>],
    top_k: usize,
    attention_mask: Option<&Tensor<2>>,
) -> (Vec<Vec<f64>>, f64) {
    let mut tokens = 0.0;
    let counts = router_logits
        .iter()
        .map(|logits| {
            let [n, _] = logits.dims();
            let w = token_weights(attention_mask, n, &logits.device());
            tokens = w
                .clone()
                .sum()
                .try_into_scalar::<f32>()
                .map(f64::from)
                .unwrap_or(f64::NAN);
            let sel = selected(&softmax(logits.clone().detach(), 1), top_k) * w;
            sel.sum_dim(0)
                .try_into_vec_as::<f32>()
                .expect("selection counts are readable")
                .into_iter()
                .map(f64::from)
                .collect()
        })
        .collect();
    (counts, tokens)
}

/// The load-balancing loss `kind` of one forward pass, unweighted (see [`BalanceLoss`]).
///
/// - `router_logits`: one `[b * t, E]` tensor per MoE layer;
/// - `batch`: `b`, the number of sequences (for `sequence`);
/// - `attention_mask`: `[b, t]`, 1 = real token; padding counts nowhere;
/// - `global_fractions`: for `global_batch`, `f_e` per layer counted over the whole step (from
///   [`selection_counts`]); required for that kind and ignored by the others.
///
/// Gradient flows through the router probabilities only (`f` is a count).
pub fn balancing_loss(
    kind: BalanceLoss,
    router_logits: &[Tensor<2>],
    num_experts: usize,
    top_k: usize,
    batch: usize,
    attention_mask: Option<&Tensor<2>>,
    global_fractions: Option<&[Vec<f64>]>,
) -> Tensor<1> {
    if kind == BalanceLoss::Hf {
        return load_balancing_loss(router_logits, num_experts, top_k, attention_mask);
    }
    let e = num_experts as f64;
    let layers = router_logits.len().max(1) as f64;
    let mut total: Option<Tensor<1>> = None;
    for (l, logits) in router_logits.iter().enumerate() {
        let [n, ne] = logits.dims();
        let device = logits.device();
        let probs = softmax(logits.clone(), 1);
        let w = token_weights(attention_mask, n, &device);
        let layer = match kind {
            BalanceLoss::Hf => unreachable!("returned above"),
            BalanceLoss::PerLayer | BalanceLoss::GlobalBatch => {
                let real = w.clone().sum().reshape([1, 1]).clamp_min(1.0);
                let pbar = (probs.clone() * w.clone()).sum_dim(0) / real.clone(); // [1, E]
                let f = match kind {
                    BalanceLoss::GlobalBatch => {
                        let fractions = global_fractions
                            .and_then(|g| g.get(l))
                            .expect("global_batch needs the step's selection fractions");
                        let values: Vec<f32> = fractions.iter().map(|&x| x as f32).collect();
                        Tensor::<2>::from_data(TensorData::new(values, [1, ne]), &device)
                    }
                    _ => (selected(&probs, top_k) * w).sum_dim(0) / real,
                };
                (f * pbar).sum() * e
            }
            BalanceLoss::Sequence => {
                let t = n / batch.max(1);
                let sel = selected(&probs, top_k).reshape([batch, t, ne]);
                let w = w.reshape([batch, t, 1]);
                let len = w.clone().sum_dim(1); // [b, 1, 1]
                let present = len.clone().clamp_max(1.0); // 1 for a sequence with real tokens
                let len = len.clamp_min(1.0);
                let f = (sel * w.clone()).sum_dim(1) / len.clone() * (e / top_k as f64); // [b, 1, E]
                let pbar = (probs.reshape([batch, t, ne]) * w).sum_dim(1) / len;
                let per_seq = (f * pbar).sum_dim(2); // [b, 1, 1]
                (per_seq * present.clone()).sum() / present.sum().clamp_min(1.0)
            }
        };
        total = Some(match total {
            Some(acc) => acc + layer,
            None => layer,
        });
    }
    total.expect("a MoE model has at least one MoE layer") / layers
}

/// Router z-loss (ST-MoE): `mean_t(logsumexp(logits_t)^2)` over the tokens of all MoE layers.
pub fn router_z_loss(router_logits: &[Tensor<2>]) -> Tensor<1> {
    let logits = Tensor::cat(router_logits.to_vec(), 0);
    let max = logits.clone().detach().max_dim(1); // [m, 1]
    let lse = (logits - max.clone()).exp().sum_dim(1).log() + max;
    lse.square().mean()
}

/// Per-layer routing statistics for logging.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RouterStats {
    /// Slots routed to each expert.
    pub tokens_per_expert: Vec<usize>,
    /// Largest expert load over the mean load (1 = perfectly balanced).
    pub max_over_mean_load: f64,
    /// Mean entropy of the routing distribution (nats), `ln E` at most.
    pub router_entropy: f64,
    /// Fraction of experts that received no token.
    pub dead_expert_fraction: f64,
}

impl RouterStats {
    /// Statistics of one layer from its expert counts and mean router entropy.
    pub fn from_counts(counts: &[usize], router_entropy: f64) -> Self {
        let total: usize = counts.iter().sum();
        let mean = total as f64 / counts.len().max(1) as f64;
        let max = counts.iter().copied().max().unwrap_or(0) as f64;
        Self {
            tokens_per_expert: counts.to_vec(),
            max_over_mean_load: if mean > 0.0 { max / mean } else { 0.0 },
            router_entropy,
            dead_expert_fraction: counts.iter().filter(|&&c| c == 0).count() as f64
                / counts.len().max(1) as f64,
        }
    }

    /// Mean entropy (nats) of the routing distributions of `[n, E]` router logits (one device
    /// read).
    pub fn mean_entropy(logits: &Tensor<2>) -> f64 {
        let logp = burn::tensor::activation::log_softmax(logits.clone().detach(), 1);
        (-(logp.clone().exp() * logp).sum_dim(1).mean())
            .try_into_scalar::<f32>()
            .map(f64::from)
            .unwrap_or(f64::NAN)
    }

    /// Compute the statistics of one forward's layer.
    pub fn from_output(out: &RouterOutput) -> Self {
        Self::from_counts(&out.expert_counts, Self::mean_entropy(&out.logits))
    }
}
