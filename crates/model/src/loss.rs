//! Next-token cross-entropy with HF's conventions.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

/// HF's `ignore_index`: targets equal to it contribute nothing.
pub const IGNORE_INDEX: i64 = -100;

/// Sum of the negative log-likelihoods of the non-ignored targets (natural log, f32).
///
/// Dividing by the number of non-ignored targets gives HF's mean loss; a trainer that
/// accumulates micro-batches divides the summed losses by the global count instead, which makes
/// k micro-batches equal to one large batch (transformers PR #34191).
///
/// # Shapes
/// - `logits`: `[b, t, vocab]`, `targets`: `[b, t]` (already shifted; `-100` = ignore) -> `[1]`
pub fn cross_entropy_sum(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let targets = targets.reshape([b * t]);
    let valid = targets.clone().greater_equal_elem(0).float(); // [n]
    let safe = targets.clamp_min(0).reshape([b * t, 1]);
    let logp = log_softmax(logits.reshape([b * t, v]), 1);
    let nll = logp.gather(1, safe).reshape([b * t]).neg();
    (nll * valid).sum()
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
