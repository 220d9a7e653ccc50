//! Gradient accumulation equals the large batch: the gradients of k micro-batches of size b
//! equal those of one batch of k*b within 1e-5 (dense, and MoE with the CE loss).

mod common;

use burn::tensor::Device;
use common::{lcg_batch, tiny_config, worst_grad_diff};
use qwen_burn_data::Batch;
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::init::init_weights;
use qwen_burn_train::trainer::forward_backward;

fn batch(rows: usize, t: usize, seed: u64) -> Batch {
    let mut batch = lcg_batch(rows, t, seed);
    // Some ignored targets, so the normalisation by the global count matters.
    batch.targets[1] = -100;
    batch
}

fn concat(batches: &[Batch]) -> Batch {
    Batch {
        batch_size: batches.iter().map(|b| b.batch_size).sum(),
        seq_len: batches[0].seq_len,
        inputs: batches.iter().flat_map(|b| b.inputs.clone()).collect(),
        targets: batches.iter().flat_map(|b| b.targets.clone()).collect(),
        attention_mask: None,
    }
}

fn check(moe: bool) {
    let device = Device::flex().autodiff();
    let model = init_weights(
        Qwen3ForCausalLM::new(&tiny_config(moe, Some(0.1), 0.0), &device),
        3,
    );
    let micro: Vec<Batch> = (0..4).map(|i| batch(2, 12, 100 + i)).collect();
    let (g_small, s_small) = forward_backward(&model, &micro, &device).unwrap();
    let (g_big, s_big) = forward_backward(&model, &[concat(&micro)], &device).unwrap();
    let (worst, count) = worst_grad_diff(&model, &g_small, &g_big);
    println!(
        "moe={moe}: {} parameter gradients, worst diff {:.2e}; loss {} vs {}",
        count, worst, s_small.loss, s_big.loss
    );
    assert!(count > 10);
    assert!(worst <= 1e-5, "accumulated gradients differ by {}", worst);
    assert!((s_small.loss - s_big.loss).abs() <= 1e-5);
}

#[test]
fn four_micro_batches_equal_one_large_batch_dense() {
    check(false);
}

#[test]
fn four_micro_batches_equal_one_large_batch_moe() {
    check(true);
}
