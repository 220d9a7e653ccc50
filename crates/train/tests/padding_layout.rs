//! Rows padded at their end (SFT, preference and RL rows without packing) train on a model
//! without MoE layers through the padding-as-document layout (`step::batch_documents`): on Flex
//! the fused causal kernel instead of the composed attention under the padding mask. Every real
//! token's loss and the step's gradients are those of the masked forward; rows with padding
//! before a real token, rows without padding, and MoE models keep the mask.

mod common;

use burn::optim::GradientsParams;
use burn::tensor::Device;
use common::{tiny_config, worst_grad_diff};
use qwen_burn_data::{Batch, IGNORE_INDEX};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::loss::token_nll;
use qwen_burn_train::step::{batch_documents, forward_backward, input_tensors, target_tensor};

/// Rows of `lengths` real tokens padded at their end to `t`, targets on the real tokens.
fn right_padded(lengths: &[usize], t: usize) -> Batch {
    let (mut inputs, mut targets, mut mask) = (Vec::new(), Vec::new(), Vec::new());
    for (r, &len) in lengths.iter().enumerate() {
        let ids: Vec<u32> = (0..t)
            .map(|k| ((r * 29 + k * 13) % 63) as u32 + 1)
            .collect();
        for k in 0..t {
            let real = k < len;
            inputs.push(if real { ids[k] } else { 0 });
            mask.push(u8::from(real));
            targets.push(if k + 1 < len {
                i64::from(ids[k + 1])
            } else {
                IGNORE_INDEX
            });
        }
    }
    Batch {
        batch_size: lengths.len(),
        seq_len: t,
        inputs,
        targets,
        attention_mask: Some(mask),
        positions: None,
        pairs: None,
    }
}

/// Per-token losses `[b * t]` and the gradients of their mean over the targets, through the
/// masked forward (`layout: false`) or the layout's.
fn losses_and_grads(
    model: &Qwen3ForCausalLM,
    batch: &Batch,
    layout: bool,
    device: &Device,
) -> (Vec<f32>, GradientsParams) {
    let (inputs, mask) = input_tensors(batch, device);
    let targets = target_tensor(batch, device);
    let hidden = if layout {
        let docs = batch_documents(batch, model).unwrap();
        assert!(docs.is_some(), "no layout for right-padded rows");
        model.forward_hidden_packed(inputs, mask, docs.as_ref()).0
    } else {
        model.forward_hidden(inputs, mask, None).0
    };
    let nll = token_nll(model.lm_head(hidden.clone()), targets.clone());
    let values = nll.into_data().try_into_vec_as::<f32>().unwrap();
    let n = batch.targets.iter().filter(|&&x| x >= 0).count() as f64;
    let loss = model.head_cross_entropy_sum(hidden, targets).div_scalar(n);
    let grads = GradientsParams::from_grads(loss.backward(), model);
    (values, grads)
}

#[test]
fn right_padded_rows_train_as_under_the_padding_mask() {
    let device = Device::flex().autodiff();
    let model = init_weights(
        Qwen3ForCausalLM::new(&tiny_config(false, None, 0.0), &device),
        7,
    );
    // Rows across the attention kernel's 64-row query block, a one-token row, an unpadded row.
    let batch = right_padded(&[70, 33, 1, 100, 64], 100);
    let (masked, masked_grads) = losses_and_grads(&model, &batch, false, &device);
    let (laid_out, laid_out_grads) = losses_and_grads(&model, &batch, true, &device);
    let mut worst = 0.0f32;
    for (k, (&a, &b)) in masked.iter().zip(&laid_out).enumerate() {
        if batch.targets[k] >= 0 {
            worst = worst.max((a - b).abs() / a.abs().max(1.0));
        }
    }
    assert!(worst <= 1e-5, "per-token losses differ by {worst}");
    let (diff, compared) = worst_grad_diff(&model, &laid_out_grads, &masked_grads);
    assert!(compared > 10, "compared {compared} parameters");
    assert!(diff <= 1e-5, "gradients differ by {diff}");
    // The training step takes the layout: its loss is the masked forward's mean.
    let (_, stats) = forward_backward(&model, std::slice::from_ref(&batch), &device).unwrap();
    let n = batch.targets.iter().filter(|&&x| x >= 0).count() as f64;
    let mean = batch
        .targets
        .iter()
        .zip(&masked)
        .filter(|(t, _)| **t >= 0)
        .map(|(_, &l)| f64::from(l))
        .sum::<f64>()
        / n;
    assert!(
        (stats.loss - mean).abs() <= 1e-5 * mean,
        "{} vs {mean}",
        stats.loss
    );
}

#[test]
fn other_paddings_and_moe_models_keep_the_mask() {
    let device = Device::flex();
    let dense = Qwen3ForCausalLM::new(&tiny_config(false, None, 0.0), &device);
    let moe = Qwen3ForCausalLM::new(&tiny_config(true, None, 0.0), &device);
    let padded = right_padded(&[5, 8, 3], 8);
    let docs = batch_documents(&padded, &dense).unwrap().expect("a layout");
    assert_eq!(docs.batch_size(), 3);
    assert!(batch_documents(&padded, &moe).unwrap().is_none());
    // Padding before a real token (left padding, a hole): the mask.
    let mut left = padded.clone();
    let mask = left.attention_mask.as_mut().unwrap();
    mask[8..16].copy_from_slice(&[0, 0, 0, 1, 1, 1, 1, 1]);
    assert!(batch_documents(&left, &dense).unwrap().is_none());
    // No padding at all: one document a row.
    let full = right_padded(&[8, 8], 8);
    assert!(batch_documents(&full, &dense).unwrap().is_none());
}
