//! Sparse Mixture-of-Experts block (Qwen3MoeSparseMoeBlock) and its router losses.
//!
//! Dispatch is sparse: the router's top-k choices are read back once per layer (`N * k`
//! integers), slots are grouped by expert with a counting sort on the host, the tokens are
//! gathered into one expert-sorted buffer, each expert runs only on its contiguous group, and
//! the weighted outputs are written back to their `(token, slot)` places and summed over the k
//! slots. Every step is a differentiable tensor op (`select`, `narrow`, `cat`, `select_assign`),
//! so autodiff flows through it on every backend; the slot write-back has no duplicate indices,
//! which keeps it deterministic on GPUs as well.

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::config::{MoeConfig, Qwen3Config};
use crate::mlp::{Mlp, linear};

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
}

/// What a MoE layer reports besides its output.
#[derive(Debug, Clone)]
pub struct RouterOutput {
    /// Raw router logits `[b * t, E]` (before softmax), for the aux and z losses.
    pub logits: Tensor<2>,
    /// Slots routed to each expert in this forward (`sum = b * t * k`), from the selection
    /// actually used (biased when aux-loss-free balancing is on).
    pub expert_counts: Vec<usize>,
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
        let logits = self.gate.forward(x.clone()); // [n, e]
        let probs = softmax(logits.clone(), 1);
        let (weights, indices) = match &self.routing_bias {
            None => probs.clone().topk_with_indices(k, 1),
            Some(bias) => {
                let scores = probs.clone().detach() + bias.val().detach().unsqueeze::<2>();
                let (_, indices) = scores.topk_with_indices(k, 1);
                (probs.clone().gather(1, indices.clone()), indices)
            }
        }; // [n, k] each
        let weights = if self.norm_topk_prob {
            weights.clone() / weights.sum_dim(1)
        } else {
            weights
        };

        // 2. Group the n*k (token, slot) pairs by expert: one read of n*k ids, counting sort.
        let ids: Vec<i64> = indices
            .try_into_vec_as::<i64>()
            .expect("router indices are readable");
        let mut counts = vec![0usize; e];
        for &id in &ids {
            counts[id as usize] += 1;
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
            },
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
    let probs = softmax(moe.gate.forward(x.clone()), 1);
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

/// Router z-loss (ST-MoE): `mean_t(logsumexp(logits_t)^2)` over the tokens of all MoE layers.
pub fn router_z_loss(router_logits: &[Tensor<2>]) -> Tensor<1> {
    let logits = Tensor::cat(router_logits.to_vec(), 0);
    let max = logits.clone().detach().max_dim(1); // [m, 1]
    let lse = (logits - max.clone()).exp().sum_dim(1).log() + max;
    lse.square().mean()
}

/// Per-layer routing statistics for logging.
#[derive(Debug, Clone, serde::Serialize)]
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
    /// Compute the statistics of one layer (reads one scalar back from the device).
    pub fn from_output(out: &RouterOutput) -> Self {
        let counts = &out.expert_counts;
        let total: usize = counts.iter().sum();
        let mean = total as f64 / counts.len() as f64;
        let max = counts.iter().copied().max().unwrap_or(0) as f64;
        let logp = burn::tensor::activation::log_softmax(out.logits.clone().detach(), 1);
        let entropy = -(logp.clone().exp() * logp).sum_dim(1).mean();
        let router_entropy = entropy
            .try_into_scalar::<f32>()
            .map(f64::from)
            .unwrap_or(f64::NAN);
        Self {
            tokens_per_expert: counts.clone(),
            max_over_mean_load: if mean > 0.0 { max / mean } else { 0.0 },
            router_entropy,
            dead_expert_fraction: counts.iter().filter(|&&c| c == 0).count() as f64
                / counts.len() as f64,
        }
    }
}
