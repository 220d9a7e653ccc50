//! A batch's tensors on a device: token ids, targets, the padding mask and the packed layout.

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use qwen_burn_data::Batch;
use qwen_burn_model::Documents;

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

/// The document layout of a packed batch ([`Batch::positions`]), `None` for one document per row.
pub fn batch_documents(batch: &Batch) -> Result<Option<Documents>> {
    batch
        .positions
        .as_ref()
        .map(|p| Documents::new(batch.batch_size, batch.seq_len, p.clone()))
        .transpose()
        .map_err(TrainError::from)
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
