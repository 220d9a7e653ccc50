//! Parity with HF transformers: logits, losses and greedy generations of the fixtures that
//! `tests/fixtures/make_fixtures.py` produced with transformers 5.23 (see its README).
//!
//! Tolerances (issue #2): logits max-abs-diff <= 1e-4, loss relative error <= 1e-5, greedy
//! generation with the KV cache identical. Run with `--nocapture` to see the measured figures.

#![allow(deprecated)] // Device::ndarray: burn-ndarray is deprecated upstream but still a supported device here.

use std::path::{Path, PathBuf};

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use qwen_burn_model::loss::{cross_entropy_sum, shift_targets, targets_tensor};
use qwen_burn_model::{Qwen3ForCausalLM, SamplingConfig, generate, load_balancing_loss};
use serde_json::Value;

const LOGIT_TOL: f32 = 1e-4;
const LOSS_REL_TOL: f64 = 1e-5;

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn expected(name: &str) -> Value {
    let path = fixture_dir(name).join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture exists"))
        .expect("fixture is JSON")
}

fn ids_of(v: &Value) -> (Vec<i64>, usize, usize) {
    let rows = v.as_array().expect("rows");
    let t = rows[0].as_array().expect("row").len();
    let flat: Vec<i64> = rows
        .iter()
        .flat_map(|r| {
            r.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_i64().expect("id"))
        })
        .collect();
    (flat, rows.len(), t)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_f64().expect("float") as f32)
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32], keep: impl Fn(usize) -> bool) -> f32 {
    assert_eq!(a.len(), b.len(), "logit counts differ");
    a.iter()
        .zip(b)
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .map(|(_, (x, y))| (x - y).abs())
        .fold(0.0, f32::max)
}

fn rel_err(ours: f64, theirs: f64) -> f64 {
    (ours - theirs).abs() / theirs.abs().max(1e-12)
}

/// Everything one fixture checks, on one device.
fn check(name: &str, device: &Device) {
    let exp = expected(name);
    let model =
        Qwen3ForCausalLM::from_pretrained(&fixture_dir(name), device).expect("fixture loads");
    let (ids, b, t) = ids_of(&exp["input_ids"]);
    let v = model.config.vocab_size;

    // 1. Logits and loss of the plain forward.
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [b, t]), device);
    let out = model.forward(input, None, None);
    let ours: Vec<f32> = out.logits.clone().try_into_vec_as::<f32>().expect("logits");
    let diff = max_abs_diff(&ours, &floats(&exp["logits"]), |_| true);
    let targets = targets_tensor(shift_targets(&ids, b, t), b, t, device);
    let lm_loss = f64::from(cross_entropy_sum(out.logits, targets).into_scalar::<f32>())
        / (b * (t - 1)) as f64;
    let loss = match &model.config.moe {
        None => lm_loss,
        Some(moe) => {
            let logits: Vec<_> = out.routers.iter().map(|r| r.logits.clone()).collect();
            let aux = f64::from(
                load_balancing_loss(&logits, moe.num_experts, moe.num_experts_per_tok, None)
                    .into_scalar::<f32>(),
            );
            let aux_err = rel_err(aux, exp["aux_loss"].as_f64().unwrap());
            let lm_err = rel_err(lm_loss, exp["lm_loss"].as_f64().unwrap());
            println!("{name}: lm_loss rel err {lm_err:.2e}, aux_loss rel err {aux_err:.2e}");
            assert!(
                lm_err <= LOSS_REL_TOL,
                "{name}: lm_loss {lm_loss} vs HF {}",
                exp["lm_loss"]
            );
            assert!(
                aux_err <= LOSS_REL_TOL,
                "{name}: aux_loss {aux} vs HF {}",
                exp["aux_loss"]
            );
            lm_loss + moe.router_aux_loss_coef * aux
        }
    };
    let loss_err = rel_err(loss, exp["loss"].as_f64().unwrap());
    println!("{name} on {device:?}: logits max abs diff {diff:.2e}, loss rel err {loss_err:.2e}");
    assert!(
        diff <= LOGIT_TOL,
        "{name}: logits max abs diff {diff} > {LOGIT_TOL}"
    );
    assert!(
        loss_err <= LOSS_REL_TOL,
        "{name}: loss {loss} vs HF {}",
        exp["loss"]
    );

    // 2. Padded batch: compare the real (mask = 1) positions only.
    let padded = &exp["padded"];
    let (pids, pb, pt) = ids_of(&padded["input_ids"]);
    let (mask, _, _) = ids_of(&padded["attention_mask"]);
    let mask_bool: Vec<bool> = mask.iter().map(|&m| m == 1).collect();
    let mask_t = Tensor::<2, Bool>::from_data(TensorData::new(mask_bool, [pb, pt]), device);
    let input = Tensor::<2, Int>::from_data(TensorData::new(pids, [pb, pt]), device);
    let out = model.forward(input, Some(mask_t), None);
    let ours: Vec<f32> = out.logits.clone().try_into_vec_as::<f32>().expect("logits");
    let pdiff = max_abs_diff(&ours, &floats(&padded["logits"]), |i| mask[i / v] == 1);
    println!("{name}: padded logits max abs diff {pdiff:.2e}");
    assert!(
        pdiff <= LOGIT_TOL,
        "{name}: padded logits max abs diff {pdiff}"
    );
    if let (Some(moe), Some(hf_aux)) = (&model.config.moe, padded["aux_loss"].as_f64()) {
        let logits: Vec<_> = out.routers.iter().map(|r| r.logits.clone()).collect();
        let maskf = Tensor::<2>::from_data(
            TensorData::new(mask.iter().map(|&m| m as f32).collect::<Vec<_>>(), [pb, pt]),
            device,
        );
        let aux = f64::from(
            load_balancing_loss(
                &logits,
                moe.num_experts,
                moe.num_experts_per_tok,
                Some(&maskf),
            )
            .into_scalar::<f32>(),
        );
        let err = rel_err(aux, hf_aux);
        println!("{name}: masked aux_loss rel err {err:.2e}");
        assert!(
            err <= LOSS_REL_TOL,
            "{name}: masked aux loss {aux} vs HF {hf_aux}"
        );
    }

    // 3. Greedy generation with the KV cache equals HF's generate().
    let greedy = &exp["greedy"];
    let prompt: Vec<u32> = greedy["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let want: Vec<u32> = greedy["new_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let cfg = SamplingConfig {
        max_new_tokens: greedy["max_new_tokens"].as_u64().unwrap() as usize,
        ..SamplingConfig::default()
    };
    let got = generate(&model, &prompt, &cfg, device, |_| {}).expect("generates");
    assert_eq!(
        got.new_token_ids, want,
        "{name}: greedy generation with KV cache differs from HF"
    );
    let no_cache = SamplingConfig {
        use_cache: false,
        ..cfg
    };
    let got = generate(&model, &prompt, &no_cache, device, |_| {}).expect("generates");
    assert_eq!(
        got.new_token_ids, want,
        "{name}: greedy generation without cache differs from HF"
    );
}

macro_rules! parity_tests {
    ($($name:ident),* $(,)?) => {
        mod flex {
            $(#[test] fn $name() { super::check(stringify!($name), &burn::tensor::Device::flex()); })*
        }
        mod ndarray {
            $(#[test] fn $name() { super::check(stringify!($name), &burn::tensor::Device::ndarray()); })*
        }
    };
}

parity_tests!(
    dense,
    dense_legacy_tied,
    yarn,
    rope_linear,
    rope_dynamic,
    rope_llama3,
    sharded_bf16,
    moe,
    moe_norm_false,
);

/// One tiny fixture on wgpu (Mesa lavapipe in CI); skipped with a reason where no adapter exists.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_dense() {
    let device = burn::tensor::Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    match std::panic::catch_unwind(|| {
        let t = Tensor::<1>::from_floats([1.0, 2.0], &device);
        t.sum().into_scalar::<f32>()
    }) {
        Ok(_) => check("dense", &device),
        // No adapter: skipped with the reason, unless QWEN_BURN_REQUIRE_WGPU is set (.ci/run
        // sets it after installing Mesa's lavapipe, so CI cannot pass without running this).
        Err(_) => {
            assert!(
                std::env::var_os("QWEN_BURN_REQUIRE_WGPU").is_none(),
                "QWEN_BURN_REQUIRE_WGPU is set but there is no wgpu adapter (Debian: install \
                 mesa-vulkan-drivers libvulkan1)"
            );
            println!("SKIPPED wgpu_dense: no wgpu adapter on this machine (no Vulkan driver?)")
        }
    }
}

#[test]
fn dynamic_ntk_frequencies_match_hf() {
    let exp = expected("rope_dynamic");
    let config =
        qwen_burn_model::Qwen3Config::from_file(&fixture_dir("rope_dynamic").join("config.json"))
            .unwrap();
    let seq = exp["dynamic_seq_len_used"].as_u64().unwrap() as usize;
    let ours = qwen_burn_model::rope::rope_frequencies(&config, seq).inv_freq;
    let theirs = floats(&exp["inv_freq_used"]);
    let diff = max_abs_diff(&ours, &theirs, |_| true);
    assert!(
        diff <= 1e-7,
        "dynamic NTK inv_freq differs from HF by {diff}"
    );
}
