//! Activation checkpointing (`training.activation_checkpointing = "layers"`, issue 27): a step
//! that keeps only each decoder layer's input and recomputes the layer in the backward gives the
//! same loss and the same gradients as a step that keeps every activation, for dense and MoE
//! models (with the router losses, over several micro-batches, with padding and packed
//! documents), full training and
//! LoRA, through the fused Flex kernels and the composed ops.
//!
//! One test in its own binary: both switches it flips are process-wide.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use common::{lcg_batch, tiny_config, tiny_moe_config};
use qwen_burn_data::Batch;
use qwen_burn_kernels::with_fused_kernels;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use qwen_burn_train::config::{BaseDtype, LoraConfig, LoraTarget};
use qwen_burn_train::run::checkpoint::apply_lora;
use qwen_burn_train::step::{Step, StepStats};
use serde_json::json;

/// The largest gradient difference over the parameters that have one in `a`, the largest
/// gradient, and how many were compared; every gradient of `a` must be in `b` and vice versa.
fn compare(
    model: &Qwen3ForCausalLM,
    a: &GradientsParams,
    b: &GradientsParams,
) -> (f32, f32, usize) {
    struct Diff<'a>(&'a GradientsParams, &'a GradientsParams, f32, f32, usize);
    impl ModuleVisitor for Diff<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            match (self.0.get::<D>(param.id), self.1.get::<D>(param.id)) {
                (Some(a), Some(b)) => {
                    self.3 = self.3.max(b.clone().abs().max().into_scalar::<f32>());
                    self.2 = self.2.max((a - b).abs().max().into_scalar::<f32>());
                    self.4 += 1;
                }
                (None, None) => {}
                _ => panic!("a gradient present with checkpointing on or off only"),
            }
        }
    }
    let mut diff = Diff(a, b, 0.0, 0.0, 0);
    model.visit(&mut diff);
    (diff.2, diff.3, diff.4)
}

fn step(model: &Qwen3ForCausalLM, batches: &[Batch], on: bool) -> (GradientsParams, StepStats) {
    Step::next_token()
        .with_checkpointing(on)
        .run(model, batches, &Device::flex().autodiff())
        .unwrap()
}

/// A MoE config with both router losses in the loss.
fn moe_with_z(kind: &str) -> Qwen3Config {
    let mut v = tiny_moe_config(kind, 0.02).to_hf_json();
    v["router_z_loss_coef"] = json!(0.001);
    Qwen3Config::from_json(&v, false).unwrap()
}

/// [`moe_with_z`] under a training-time capacity, with the routing bias and router centring.
fn moe_capped(kind: &str) -> Qwen3Config {
    let mut v = moe_with_z(kind).to_hf_json();
    v["router_capacity_factor"] = json!(1.1);
    v["router_bias_update_rate"] = json!(0.01);
    v["router_centering"] = json!(true);
    v["router_assignment_loss_coef"] = json!(0.5);
    Qwen3Config::from_json(&v, false).unwrap()
}

#[test]
fn checkpointed_steps_equal_plain_steps() {
    let device = Device::flex().autodiff();
    let lora = |base_dtype| LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: vec![LoraTarget::QProj, LoraTarget::VProj, LoraTarget::DownProj],
        base_dtype,
    };
    // Two micro-batches, the second with padding.
    let mut padded = lcg_batch(2, 12, 7);
    padded.attention_mask = Some((0..24).map(|i| u8::from(i % 12 < 9)).collect());
    for (i, target) in padded.targets.iter_mut().enumerate() {
        if i % 12 >= 9 {
            *target = -100;
        }
    }
    // A packed micro-batch: two documents per row (5 + 7 tokens), each attending to itself.
    let mut packed = lcg_batch(2, 12, 3);
    packed.positions = Some((0..2).flat_map(|_| (0..5).chain(0..7)).collect());
    let batches = vec![lcg_batch(2, 12, 1), padded, packed];
    let cases: Vec<(&str, Qwen3Config, Option<LoraConfig>)> = vec![
        ("dense", tiny_config(false, None, 0.0), None),
        ("moe hf", moe_with_z("hf"), None),
        ("moe global_batch", moe_with_z("global_batch"), None),
        ("moe hf capacity", moe_capped("hf"), None),
        (
            "moe global_batch capacity",
            moe_capped("global_batch"),
            None,
        ),
        (
            "dense lora",
            tiny_config(false, None, 0.0),
            Some(lora(BaseDtype::F32)),
        ),
        (
            "dense lora bf16",
            tiny_config(false, None, 0.0),
            Some(lora(BaseDtype::Bf16)),
        ),
        ("moe lora", moe_with_z("hf"), Some(lora(BaseDtype::F32))),
    ];
    for fused in [true, false] {
        with_fused_kernels(fused, || {
            for (name, config, lora) in &cases {
                let mut model = init_weights(Qwen3ForCausalLM::new(config, &device), 5);
                if let Some(lora) = lora {
                    model = apply_lora(model, lora);
                }
                let (plain, a) = step(&model, &batches, false);
                let (checkpointed, b) = step(&model, &batches, true);
                let what = format!("{name}, fused={fused}");
                assert!(
                    (a.loss - b.loss).abs() <= 1e-6 * a.loss.abs(),
                    "{what}: loss {} vs {}",
                    a.loss,
                    b.loss
                );
                assert_eq!(a.aux_loss, b.aux_loss, "{what}: aux loss");
                assert_eq!(a.expert_counts, b.expert_counts, "{what}: routing");
                assert_eq!(
                    a.uncapped_counts, b.uncapped_counts,
                    "{what}: router's own choice"
                );
                assert_eq!(a.router_input_sums.len(), b.router_input_sums.len());
                for ((sa, na), (sb, nb)) in a.router_input_sums.iter().zip(&b.router_input_sums) {
                    assert_eq!(na, nb, "{what}: router input tokens");
                    for (x, y) in sa.iter().zip(sb) {
                        assert!(
                            (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                            "{what}: router input sums {x} vs {y}"
                        );
                    }
                }
                if name.contains("capacity") {
                    // The capacity acted (the test can tell the two routings apart).
                    assert_ne!(a.expert_counts, a.uncapped_counts, "{what}: capacity idle");
                    assert_eq!(
                        a.router_input_sums.len(),
                        2,
                        "{what}: one sum per MoE layer"
                    );
                    let (x, y) = (a.assignment_loss.unwrap(), b.assignment_loss.unwrap());
                    assert!(
                        (x - y).abs() <= 1e-6 * x.abs(),
                        "{what}: assignment loss {x} vs {y}"
                    );
                }
                let (diff, scale, count) = compare(&model, &plain, &checkpointed);
                assert_eq!(count, plain.len(), "{what}: every gradient compared");
                assert!(count > 0 && scale > 0.0, "{what}: nothing to compare");
                assert!(
                    diff <= 1e-6 * scale.max(1.0),
                    "{what}: gradients differ by {diff} (largest {scale}) over {count} parameters"
                );
            }
        });
    }
}
