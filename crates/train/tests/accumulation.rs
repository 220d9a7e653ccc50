//! Gradient accumulation equals the large batch: the gradients of k micro-batches of size b
//! equal those of one batch of k*b within 1e-5 (dense; MoE with the CE loss; MoE with the
//! `global_batch` balancing loss on, whose expert counts span the whole step).

mod common;

use burn::tensor::Device;
use common::{lcg_batch, tiny_config, tiny_moe_config, worst_grad_diff};
use qwen_burn_data::Batch;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{BalanceLoss, Qwen3ForCausalLM};
use qwen_burn_train::step::forward_backward;

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
        positions: None,
        pairs: None,
    }
}

fn check(moe: bool) {
    check_config(&tiny_config(moe, Some(0.1), 0.0), &format!("moe={moe}"));
}

fn check_config(config: &qwen_burn_model::Qwen3Config, name: &str) {
    let device = Device::flex().autodiff();
    let model = init_weights(Qwen3ForCausalLM::new(config, &device), 3);
    let micro: Vec<Batch> = (0..4).map(|i| batch(2, 12, 100 + i)).collect();
    let (g_small, s_small) = forward_backward(&model, &micro, &device).unwrap();
    let (g_big, s_big) = forward_backward(&model, &[concat(&micro)], &device).unwrap();
    let (worst, count) = worst_grad_diff(&model, &g_small, &g_big);
    println!(
        "{name}: {} parameter gradients, worst diff {:.2e}; loss {} vs {}; aux {:?} vs {:?}",
        count, worst, s_small.loss, s_big.loss, s_small.aux_loss, s_big.aux_loss
    );
    assert!(count > 10);
    assert!(
        worst <= 1e-5,
        "{name}: accumulated gradients differ by {}",
        worst
    );
    assert!((s_small.loss - s_big.loss).abs() <= 1e-5);
    // Only global_batch's balancing loss spans the step; HF's is per forward.
    if config
        .moe
        .as_ref()
        .is_some_and(|m| m.router_aux_loss_type == BalanceLoss::GlobalBatch)
    {
        let (a, b) = (s_small.aux_loss.unwrap(), s_big.aux_loss.unwrap());
        assert!((a - b).abs() <= 1e-6, "{name}: aux {a} vs {b}");
    }
}

#[test]
fn four_micro_batches_equal_one_large_batch_moe_global_batch_aux_on() {
    let mut config = tiny_moe_config("global_batch", 0.5);
    config.initializer_range = 0.1;
    check_config(&config, "global_batch aux 0.5");
}

#[test]
fn four_micro_batches_equal_one_large_batch_dense() {
    check(false);
}

#[test]
fn four_micro_batches_equal_one_large_batch_moe() {
    check(true);
}
