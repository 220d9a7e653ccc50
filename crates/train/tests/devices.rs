//! The same tiny model and batches give the same losses on every compiled-in device
//! (flex, ndarray, and wgpu with `--features wgpu`; on Mesa's lavapipe in CI).

#![allow(deprecated)] // Device::ndarray: burn-ndarray is deprecated upstream but still a supported device here.

mod common;

use burn::tensor::Device;
use common::{lcg_batch, tiny_config};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::init::init_weights;
use qwen_burn_train::config::OptimizerConfig;
use qwen_burn_train::optim::{build_optimizer, clip_global_norm};
use qwen_burn_train::step::forward_backward;

/// Losses of three AdamW steps on `device`.
fn losses(device: Device, moe: bool) -> Vec<f64> {
    let device = device.autodiff();
    let mut model = init_weights(
        Qwen3ForCausalLM::new(&tiny_config(moe, Some(0.1), 0.01), &device),
        5,
    );
    let opt = OptimizerConfig {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        grad_clip: 1.0,
        ..OptimizerConfig::default()
    };
    let mut optimizer = build_optimizer(&model, &opt);
    let mut out = Vec::new();
    for step in 0..3 {
        let (mut grads, stats) =
            forward_backward(&model, &[lcg_batch(2, 16, step)], &device).unwrap();
        clip_global_norm(&model, &mut grads, 1.0).unwrap();
        model = optimizer.step(opt.lr, model, grads);
        out.push(stats.loss + stats.aux_loss.unwrap_or(0.0));
    }
    out
}

fn compare(name: &str, device: Device, moe: bool) {
    let reference = losses(Device::flex(), moe);
    let other = losses(device, moe);
    let first = (reference[0] - other[0]).abs();
    let worst = reference
        .iter()
        .zip(&other)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    println!(
        "{name} moe={moe}: flex {reference:?} vs {other:?}; first-step diff {first:.2e}, worst {worst:.2e}"
    );
    assert!(
        first <= 1e-5,
        "{name}: first-step loss differs from flex by {first}"
    );
    assert!(worst <= 1e-4, "{name}: losses drift from flex by {worst}");
}

#[test]
fn ndarray_matches_flex() {
    compare("ndarray", Device::ndarray(), false);
    compare("ndarray", Device::ndarray(), true);
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_matches_flex() {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    let probe = std::panic::catch_unwind(|| {
        burn::tensor::Tensor::<1>::from_floats([1.0, 2.0], &device)
            .sum()
            .into_scalar::<f32>()
    });
    if probe.is_err() {
        // No adapter: skipped with the reason, unless QWEN_BURN_REQUIRE_WGPU is set (.ci/run
        // sets it after installing Mesa's lavapipe, so CI cannot pass without running this).
        assert!(
            std::env::var_os("QWEN_BURN_REQUIRE_WGPU").is_none(),
            "QWEN_BURN_REQUIRE_WGPU is set but there is no wgpu adapter (Debian: install \
             mesa-vulkan-drivers libvulkan1)"
        );
        println!("SKIPPED wgpu_matches_flex: no wgpu adapter on this machine (no Vulkan driver?)");
        return;
    }
    compare("wgpu", device.clone(), false);
    compare("wgpu", device, true);
}
