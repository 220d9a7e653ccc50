//! The validation loss and bits per byte of a run, and the windowed perplexity of a text
//! (`qwen-burn eval --text`).

use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_data::Batch;
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::loss::{shift_targets, targets_tensor, token_nll};
use qwen_burn_model::moe::SparseMoe;
use serde::Serialize;

use crate::error::{Result, TrainError};
use crate::objective::{count_targets, forward_ce_rows};

/// A validation measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Validation {
    /// Mean cross-entropy per target token, nats.
    pub loss: f64,
    /// Bits per byte (see [`bits_per_byte`]), when the tokenizer is known.
    pub bpb: Option<f64>,
    /// MoE with a routing bias: the fraction of token-expert choices that change without it
    /// (see [`qwen_burn_model::moe::SparseMoe::bias_changed_choices`]).
    pub bias_changed_choices: Option<f64>,
}

/// Bits per byte: the summed next-token loss in nats over the targets, divided by ln 2 and by
/// the UTF-8 bytes of the targets' text, so that models with different tokenizers compare.
/// Every target counts in the loss, a special token's too (it codes a document boundary); it
/// adds no bytes. `None` when the targets hold no bytes.
pub fn bits_per_byte(loss_sum: f64, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| loss_sum / std::f64::consts::LN_2 / bytes as f64)
}

/// The UTF-8 bytes of the text of `targets` (ignored targets, `< 0`, count nothing).
pub fn target_bytes(targets: &[i64], token_bytes: &[u32]) -> u64 {
    targets
        .iter()
        .filter(|&&t| t >= 0)
        .map(|&t| u64::from(token_bytes.get(t as usize).copied().unwrap_or(0)))
        .sum()
}

/// Validation: mean cross-entropy over the fixed validation batches, and bits per byte when
/// `token_bytes` (the tokenizer's [`Tok::token_bytes`]) is given.
pub fn evaluate(
    model: &Qwen3ForCausalLM,
    batches: &[Batch],
    device: &Device,
    token_bytes: Option<&[u32]>,
) -> Result<Validation> {
    let mut total = 0.0;
    let mut count = 0;
    let mut bytes = 0;
    let (mut changed, mut choices) = (0, 0);
    let sparse: Vec<&SparseMoe> = model.sparse_layers().collect();
    for batch in batches {
        let (row_sums, routers) = forward_ce_rows(model, batch, device)?;
        for (moe, router) in sparse.iter().zip(&routers) {
            if let Some((c, n)) = moe.bias_changed_choices(&router.logits) {
                changed += c;
                choices += n;
            }
        }
        // Row by row, in f64: the figure depends on the rows, not on how they were batched.
        for sum in row_sums {
            total += sum;
        }
        count += count_targets(batch);
        if let Some(table) = token_bytes {
            bytes += target_bytes(&batch.targets, table);
        }
    }
    Ok(Validation {
        loss: total / count.max(1) as f64,
        bpb: token_bytes.and_then(|_| bits_per_byte(total, bytes)),
        bias_changed_choices: (choices > 0).then(|| changed as f64 / choices as f64),
    })
}

/// The loss of the predictions at positions `from..=to` of the window.
#[derive(Debug, Clone, Serialize)]
pub struct BucketLoss {
    /// First predicted position (1-based: position p predicts token p from tokens 0..p-1).
    pub from: usize,
    /// Last predicted position.
    pub to: usize,
    /// Mean cross-entropy over those predictions.
    pub loss: f64,
}

/// What [`windowed_loss`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct WindowedLoss {
    /// Mean next-token cross-entropy.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Bits per byte of the predicted tokens' text, when the tokenizer is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bpb: Option<f64>,
    /// Predictions scored.
    pub tokens: usize,
    /// Windows scored.
    pub windows: usize,
    /// Tokens per window.
    pub context: usize,
    /// The loss by position inside the window, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_by_position: Option<Vec<BucketLoss>>,
}

/// Mean next-token loss of `ids` cut into non-overlapping windows of exactly `context` tokens
/// (the model sees positions `0..context-1`; each window scores its `context - 1`
/// predictions), `batch_size` windows per forward. With `bucket`, also the loss by position in
/// buckets of that many positions. With `token_bytes`, also the bits per byte. `progress` gets
/// the predictions scored so far.
#[allow(clippy::too_many_arguments)]
pub fn windowed_loss(
    model: &Qwen3ForCausalLM,
    ids: &[u32],
    context: usize,
    batch_size: usize,
    bucket: Option<usize>,
    token_bytes: Option<&[u32]>,
    device: &Device,
    mut progress: impl FnMut(usize),
) -> Result<WindowedLoss> {
    if context < 2 {
        return Err(TrainError::Other(format!(
            "the context must be at least 2 tokens (got {context})"
        )));
    }
    if ids.len() < context {
        return Err(TrainError::Other(format!(
            "{} tokens are fewer than one window of {context}; lower the context",
            ids.len()
        )));
    }
    let vocab = model.config.vocab_size;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(TrainError::Other(format!(
            "token id {bad} is out of range for the model's vocab_size {vocab} (a tokenizer \
             that does not belong to this model?)"
        )));
    }
    let windows: Vec<&[u32]> = ids.chunks_exact(context).collect();
    let width = bucket.unwrap_or(context).max(1);
    let num_buckets = (context - 1).div_ceil(width);
    // Sums and counts per bucket of predicted positions 1..context-1 (bucket k covers
    // positions k*width+1 ..= (k+1)*width).
    let mut sums = vec![0.0f64; num_buckets];
    let mut counts = vec![0usize; num_buckets];
    for group in windows.chunks(batch_size.max(1)) {
        let b = group.len();
        let flat: Vec<i64> = group
            .iter()
            .flat_map(|w| w.iter().map(|&i| i64::from(i)))
            .collect();
        let targets = targets_tensor(shift_targets(&flat, b, context), b, context, device);
        let input = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, context]), device);
        let logits = model.forward(input, None, None).logits;
        let nll = token_nll(logits, targets)
            .try_into_vec_as::<f32>()
            .map_err(|e| TrainError::Device(format!("reading losses: {e:?}")))?;
        for row in nll.chunks_exact(context) {
            for (p, &x) in row[..context - 1].iter().enumerate() {
                sums[p / width] += f64::from(x);
                counts[p / width] += 1;
            }
        }
        progress(counts.iter().sum());
    }
    let tokens: usize = counts.iter().sum();
    let loss_sum = sums.iter().sum::<f64>();
    let loss = loss_sum / tokens as f64;
    // The targets are every window's tokens after its first.
    let bpb = token_bytes.and_then(|table| {
        let bytes: u64 = windows
            .iter()
            .flat_map(|w| &w[1..])
            .map(|&t| u64::from(table.get(t as usize).copied().unwrap_or(0)))
            .sum();
        bits_per_byte(loss_sum, bytes)
    });
    Ok(WindowedLoss {
        loss,
        perplexity: loss.exp(),
        bpb,
        tokens,
        windows: windows.len(),
        context,
        loss_by_position: bucket.map(|_| {
            sums.iter()
                .zip(&counts)
                .enumerate()
                .map(|(k, (s, &n))| BucketLoss {
                    from: k * width + 1,
                    to: ((k + 1) * width).min(context - 1),
                    loss: s / n as f64,
                })
                .collect()
        }),
    })
}
