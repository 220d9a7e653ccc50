//! Next-token cross-entropy with HF's conventions.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use qwen_burn_kernels::cross_entropy_rows;

/// HF's `ignore_index`: targets equal to it contribute nothing.
pub const IGNORE_INDEX: i64 = -100;

/// Sum of the negative log-likelihoods of the non-ignored targets (natural log, f32).
///
/// Dividing by the number of non-ignored targets gives HF's mean loss; a trainer that
/// accumulates micro-batches divides the summed losses by the global count instead, which makes
/// k micro-batches equal to one large batch (transformers PR #34191).
///
/// The softmax over the vocabulary is the largest element-wise cost of a small model's step, so
/// it is computed once, outside the autodiff graph (Burn's decomposed `log_softmax` evaluates
/// `exp` over `[b*t, vocab]` in the forward pass and again in the backward pass). The gradient
/// is attached analytically: for logits `z`, probabilities `p` and one-hot target `y`,
/// `d CE / d z = p - y`, carried by the surrogate `sum(z * (p - y))` whose value is cancelled.
/// [`cross_entropy_sum_reference`] is the plain formulation; tests check that both agree in
/// value and gradient.
///
/// # Shapes
/// - `logits`: `[b, t, vocab]`, `targets`: `[b, t]` (already shifted; `-100` = ignore) -> `[1]`
pub fn cross_entropy_sum(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let n = b * t;
    let logits = logits.reshape([n, v]);
    let want = logits.device().is_autodiff();
    let (value, coefficient) =
        value_and_coefficient(logits.clone().detach(), targets.reshape([n]), want);
    match coefficient {
        Some(c) => {
            let surrogate = (logits * c).sum();
            surrogate.clone() - surrogate.detach() + value
        }
        None => value,
    }
}

/// Loss sum (`[1]`) and, when `want_coefficient`, `softmax(z) - onehot(y)` with zero rows for
/// ignored targets (`[n, v]`), of untracked logits `z: [n, v]` and targets `y: [n]`. The loss
/// is `logsumexp(z) - z[y]` per row, exact also where `p[y]` underflows.
fn value_and_coefficient(
    z: Tensor<2>,
    y: Tensor<1, Int>,
    want_coefficient: bool,
) -> (Tensor<1>, Option<Tensor<2>>) {
    let [n, v] = z.dims();
    let device = z.device();
    // Flex: one fused pass per row (qwen_burn_kernels::cross_entropy_rows); it treats its inputs
    // as constants, like the detached logits here.
    if let Some((nll, coefficient)) = cross_entropy_rows(&z, &y, want_coefficient) {
        let value = nll.sum();
        let autodiff = |t: Tensor<2>| {
            if device.is_autodiff() {
                t.autodiff()
            } else {
                t
            }
        };
        return (
            if device.is_autodiff() {
                value.autodiff()
            } else {
                value
            },
            coefficient.map(autodiff),
        );
    }
    let valid = y.clone().greater_equal_elem(0).float(); // [n]
    let safe = y.clamp_min(0).reshape([n, 1]);
    let max = z.clone().max_dim(1); // [n, 1]
    let exp = (z.clone() - max.clone()).exp(); // [n, v]
    let sum = exp.clone().sum_dim(1); // [n, 1]
    let z_target = z.gather(1, safe.clone()); // [n, 1]
    let nll = (max + sum.clone().log() - z_target).reshape([n]);
    let value = (nll * valid.clone()).sum();
    if !want_coefficient {
        return (value, None);
    }
    let one_hot = Tensor::<2>::zeros([n, v], &device).scatter(
        1,
        safe,
        Tensor::<2>::ones([n, 1], &device),
        burn::tensor::IndexingUpdateOp::Assign,
    );
    let coefficient = (exp / sum - one_hot) * valid.unsqueeze_dim(1);
    (value, Some(coefficient))
}

/// The textbook formulation, `-sum(log_softmax(z)[target])` (the kernels crate's reference for
/// its fused loss), for tests and benchmarks.
pub use qwen_burn_kernels::cross_entropy_sum_reference;

/// Per-position negative log-likelihood `[b, t]` (0 where the target is ignored), for
/// evaluation: perplexity by position, per-document losses. Not for training (no fused gradient).
pub fn token_nll(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<2> {
    let [b, t, v] = logits.dims();
    let targets = targets.reshape([b * t]);
    let valid = targets.clone().greater_equal_elem(0).float();
    let safe = targets.clamp_min(0).reshape([b * t, 1]);
    let logp = log_softmax(logits.reshape([b * t, v]), 1);
    (logp.gather(1, safe).reshape([b * t]).neg() * valid).reshape([b, t])
}

/// Shift `input_ids` left by one into next-token targets, `-100` in the last column
/// (what HF does for `labels=input_ids`). Rows are row-major `[b, t]`.
pub fn shift_targets(input_ids: &[i64], b: usize, t: usize) -> Vec<i64> {
    let mut targets = vec![IGNORE_INDEX; b * t];
    for row in 0..b {
        targets[row * t..row * t + t - 1].copy_from_slice(&input_ids[row * t + 1..row * t + t]);
    }
    targets
}

/// Targets as an Int tensor on `device`.
pub fn targets_tensor(
    targets: Vec<i64>,
    b: usize,
    t: usize,
    device: &burn::tensor::Device,
) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(targets, [b, t]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    #[test]
    fn fused_cross_entropy_matches_the_reference_in_value_and_gradient() {
        let device = Device::flex().autodiff();
        let logits =
            Tensor::<3>::random([2, 5, 11], Distribution::Normal(0.0, 3.0), &device).require_grad();
        let targets = vec![3i64, 0, 10, -100, 7, 1, 1, -100, 4, 9];
        let t = || Tensor::<2, Int>::from_data(TensorData::new(targets.clone(), [2, 5]), &device);
        let reference = cross_entropy_sum_reference(logits.clone(), t());
        let b = reference.clone().into_scalar::<f32>();
        let gb = logits.grad(&(reference * 0.5).backward()).unwrap();
        let fused = cross_entropy_sum(logits.clone(), t());
        let a = fused.clone().into_scalar::<f32>();
        assert!((a - b).abs() <= 1e-5 * b.abs(), "value {a} vs {b}");
        let ga = logits.grad(&(fused * 0.5).backward()).unwrap();
        let diff = (ga - gb).abs().max().into_scalar::<f32>();
        assert!(diff <= 1e-6, "gradient differs by {diff}");
    }

    #[test]
    fn cross_entropy_is_exact_where_the_target_probability_underflows() {
        let device = Device::flex();
        // Large logits: a naive exp would overflow; a target far below the max underflows.
        let logits = Tensor::<3>::random([3, 4, 50], Distribution::Normal(0.0, 40.0), &device);
        let targets: Vec<i64> = vec![0, 49, -100, 7, 3, 3, 3, 3, -100, -100, 12, 1];
        let t = || Tensor::<2, Int>::from_data(TensorData::new(targets.clone(), [3, 4]), &device);
        let b = cross_entropy_sum_reference(logits.clone(), t()).into_scalar::<f32>();
        assert!(b.is_finite() && b > 0.0);
        let a = cross_entropy_sum(logits, t()).into_scalar::<f32>();
        assert!((a - b).abs() <= 1e-5 * b.abs(), "value {a} vs {b}");
    }

    #[test]
    fn token_nll_sums_to_the_cross_entropy_and_zeroes_ignored_positions() {
        let device = Device::flex();
        let logits = Tensor::<3>::random([2, 5, 11], Distribution::Normal(0.0, 3.0), &device);
        let targets = vec![3i64, 0, 10, -100, 7, 1, 1, -100, 4, 9];
        let t = || Tensor::<2, Int>::from_data(TensorData::new(targets.clone(), [2, 5]), &device);
        let per = token_nll(logits.clone(), t())
            .try_into_vec_as::<f32>()
            .unwrap();
        assert_eq!(per.len(), 10);
        assert_eq!(
            (per[3], per[7]),
            (0.0, 0.0),
            "ignored positions must be 0: {per:?}"
        );
        assert!(
            per.iter()
                .enumerate()
                .all(|(i, &x)| i == 3 || i == 7 || x > 0.0)
        );
        let total: f32 = per.iter().sum();
        let reference = cross_entropy_sum_reference(logits, t()).into_scalar::<f32>();
        assert!(
            (total - reference).abs() <= 1e-5 * reference,
            "{total} vs {reference}"
        );
    }
}
