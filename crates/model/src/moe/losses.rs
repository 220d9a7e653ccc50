//! The router losses: load balancing (HF's pooled form and the per-layer, sequence-wise and
//! global-batch forms) and the z-loss.

use burn::tensor::activation::log_softmax;
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::config::BalanceLoss;

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

/// The assignment loss (`router_assignment_loss_coef`): the cross-entropy of each router's
/// probabilities against the capped assignment its training forward used, averaged over the k
/// slots, the real tokens and the MoE layers:
/// `mean_l mean_t (-1/k) sum_j log p_l[t, a_l[t, j]]`. It teaches the router to choose by
/// itself what the training-time capacity assigns (balanced in every sequence), so that the
/// router's own choice, which inference routes by, balances too. With a balanced router the
/// assignment is its own top-k and the loss only sharpens it.
///
/// - `router_logits`: one `[n, E]` tensor per MoE layer; `assignments`: the matching `[n, k]`
///   expert ids (`None` when there is no pair: no capacity acted);
/// - `attention_mask`: `[b, t]` (flattened as the logits), 1 = real token; padding counts
///   nowhere.
pub fn assignment_loss(
    router_logits: &[Tensor<2>],
    assignments: &[Tensor<2, Int>],
    attention_mask: Option<&Tensor<2>>,
) -> Option<Tensor<1>> {
    let layers = router_logits.len().min(assignments.len()).max(1) as f64;
    let mut total: Option<Tensor<1>> = None;
    for (logits, ids) in router_logits.iter().zip(assignments) {
        let [n, _] = logits.dims();
        let k = ids.dims()[1].max(1) as f64;
        let w = token_weights(attention_mask, n, &logits.device()); // [n, 1]
        let picked = log_softmax(logits.clone(), 1).gather(1, ids.clone()); // [n, k]
        let nll = -(picked.sum_dim(1) * w.clone()).sum() / (w.sum().clamp_min(1.0) * k);
        total = Some(match total {
            Some(acc) => acc + nll,
            None => nll,
        });
    }
    total.map(|t| t / layers)
}
