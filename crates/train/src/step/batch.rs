//! A batch's tensors on a device: token ids, targets, the padding mask and the packed layout.

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use qwen_burn_data::Batch;
use qwen_burn_model::{Documents, Qwen3ForCausalLM};

use crate::error::{Result, TrainError};

/// Batch tensors on `device`: inputs `[b, t]`, targets `[b, t]`, optional padding mask.
pub fn batch_tensors(
    batch: &Batch,
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2, Int>, Option<Tensor<2, Bool>>) {
    let (inputs, mask) = input_tensors(batch, device);
    (inputs, target_tensor(batch, device), mask)
}

/// The token ids `[b, t]` and the optional padding mask of `batch`.
pub fn input_tensors(batch: &Batch, device: &Device) -> (Tensor<2, Int>, Option<Tensor<2, Bool>>) {
    let (b, t) = (batch.batch_size, batch.seq_len);
    let inputs: Vec<i64> = batch.inputs.iter().map(|&i| i64::from(i)).collect();
    let inputs = Tensor::from_data(TensorData::new(inputs, [b, t]), device);
    let mask = batch.attention_mask.as_ref().map(|m| {
        let m: Vec<bool> = m.iter().map(|&x| x != 0).collect();
        Tensor::from_data(TensorData::new(m, [b, t]), device)
    });
    (inputs, mask)
}

/// The next-token targets `[b, t]` of `batch` (-1 where no loss is taken).
pub fn target_tensor(batch: &Batch, device: &Device) -> Tensor<2, Int> {
    let (b, t) = (batch.batch_size, batch.seq_len);
    Tensor::from_data(TensorData::new(batch.targets.clone(), [b, t]), device)
}

/// The document layout `model`'s training forward of `batch` takes: a packed batch's
/// ([`Batch::positions`]); else, on a model without MoE layers, rows padded at their end (SFT,
/// preference and RL rows) as two documents each, the real tokens and the padding; else `None`
/// (one document per row, the padding mask).
///
/// A real token of a right-padded row sees the same keys either way (those before it, all
/// real), so its hidden state is the masked attention's, while Flex runs its fused causal
/// kernel instead of the composed attention over a `[b, heads, t, t]` mask. The padding's
/// states differ, and nothing reads them: they have no targets. MoE layers keep the mask,
/// because their capacity counts each document on its own.
pub fn batch_documents(batch: &Batch, model: &Qwen3ForCausalLM) -> Result<Option<Documents>> {
    let positions = match (&batch.positions, &batch.attention_mask) {
        (Some(p), _) => p.clone(),
        (None, Some(mask)) if model.config.moe_layers().is_empty() => {
            match trailing_padding_positions(mask, batch.seq_len) {
                Some(p) => p,
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    Documents::new(batch.batch_size, batch.seq_len, positions)
        .map(Some)
        .map_err(TrainError::from)
}

/// The positions of rows of `t` whose padding (`mask` 0) comes after all their real tokens,
/// the padding counting as a document of its own; `None` when no row has padding or some row
/// has padding before a real token.
fn trailing_padding_positions(mask: &[u8], t: usize) -> Option<Vec<u32>> {
    let mut positions = Vec::with_capacity(mask.len());
    let mut padded = false;
    for row in mask.chunks(t.max(1)) {
        let real = row.iter().take_while(|&&m| m != 0).count();
        if row[real..].iter().any(|&m| m != 0) {
            return None;
        }
        padded |= real < row.len();
        positions.extend((0..real as u32).chain(0..(row.len() - real) as u32));
    }
    padded.then_some(positions)
}

/// Tokens of `batch` that are not padding: what the balancing losses count.
pub fn real_tokens(batch: &Batch) -> usize {
    batch
        .attention_mask
        .as_ref()
        .map_or(batch.batch_size * batch.seq_len, |m| {
            m.iter().filter(|&&x| x != 0).count()
        })
}
