//! `training.fused_kernels`: with the switch off every fused Flex kernel gives way to the composed
//! Burn ops it replaces. One training step's loss and gradients both ways: they agree within
//! float tolerance, and they are not bit-identical (so the switch really changes the path).
//! Its own test binary: the switch is process-wide.

mod common;

use burn::tensor::Device;
use common::{lcg_batch, tiny_config, worst_grad_diff};
use qwen_burn_kernels::with_fused_kernels;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use qwen_burn_train::step::forward_backward;
use serde_json::json;

#[test]
fn the_switch_selects_the_composed_ops_and_both_agree() {
    // Both LM-head layouts of the fused head + loss kernel: a `Linear` and the tied table.
    for (moe, tied) in [(false, false), (false, true), (true, false)] {
        let device = Device::flex().autodiff();
        let mut config = tiny_config(moe, None, 0.01).to_hf_json();
        config["tie_word_embeddings"] = json!(tied);
        let config = Qwen3Config::from_json(&config, false).unwrap();
        let model = init_weights(Qwen3ForCausalLM::new(&config, &device), 7);
        let batches = [lcg_batch(4, 16, 3)];
        let (fused, a) =
            with_fused_kernels(true, || forward_backward(&model, &batches, &device)).unwrap();
        let (composed, b) =
            with_fused_kernels(false, || forward_backward(&model, &batches, &device)).unwrap();
        let loss_diff = (a.loss - b.loss).abs();
        assert!(
            loss_diff <= 1e-5 * b.loss.abs(),
            "moe={moe} tied={tied}: loss {} vs {}",
            a.loss,
            b.loss
        );
        let (worst, compared) = worst_grad_diff(&model, &fused, &composed);
        assert!(
            compared > 10,
            "moe={moe} tied={tied}: compared {compared} parameters"
        );
        assert!(
            worst <= 1e-5,
            "moe={moe} tied={tied}: gradients differ by up to {worst}"
        );
        assert!(
            worst > 0.0 || a.loss != b.loss,
            "moe={moe} tied={tied}: bit-identical results: the switch did not change the path"
        );
    }
}
