use super::*;

fn load(extra: &[&str]) -> Result<RunConfig> {
    let mut table: toml::Table = MINIMAL.parse().unwrap();
    apply_overrides(
        &mut table,
        &extra.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )?;
    RunConfig::from_table(table)
}

#[test]
fn minimal_config_loads_with_explicit_defaults() {
    let c = load(&[]).unwrap();
    assert_eq!(c.optimizer.eps, 1e-8);
    assert_eq!(c.optimizer.weight_decay, 0.1);
    assert!(matches!(c.model, ModelSource::Scratch(_)));
}

#[test]
fn overrides_are_parsed_and_validated() {
    let c = load(&["optimizer.lr=3e-4", "training.device=ndarray"]).unwrap();
    assert_eq!(c.optimizer.lr, 3e-4);
    assert_eq!(c.training.device, "ndarray");
    let e = load(&["optimizer.lrr=1"]).unwrap_err().to_string();
    assert!(e.contains("optimizer") && e.contains("lrr"), "{e}");
    let e = load(&["training.batch_size=0"]).unwrap_err().to_string();
    assert!(e.contains("training.batch_size"), "{e}");
    let e = load(&["model.num_key_value_heads=3"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.num_key_value_heads"), "{e}");
    let e = load(&["schedule.decay=\"wobbly\""])
        .unwrap_err()
        .to_string();
    assert!(e.contains("schedule.decay") && e.contains("wobbly"), "{e}");
    let e = load(&["extras.x=1"]).unwrap_err().to_string();
    assert!(e.contains("extras") && e.contains("unknown section"), "{e}");
    let e = load(&["training.on_nonfinite=\"ignore\""])
        .unwrap_err()
        .to_string();
    assert!(e.contains("training") && e.contains("ignore"), "{e}");
    let c = load(&["training.on_nonfinite=\"skip\""]).unwrap();
    assert_eq!(c.training.on_nonfinite, OnNonFinite::Skip);
}

#[test]
fn a_warmup_longer_than_the_run_is_clipped_with_a_warning() {
    let c = load(&["schedule.warmup_steps=30", "training.max_steps=16"]).unwrap();
    assert_eq!(c.notices.len(), 1);
    assert!(c.notices[0].contains("clipped to 16"), "{}", c.notices[0]);
    assert!(
        load(&["schedule.warmup_steps=10"])
            .unwrap()
            .notices
            .is_empty()
    );
}

/// Mixed precision without a bf16 kernel says that it runs emulated, slower than f32; with a
/// kernel it says nothing.
#[test]
fn mixed_precision_without_a_bf16_kernel_says_so() {
    let c = load(&["training.precision=\"bf16\""]).unwrap();
    let emulated = !qwen_burn_kernels::bf16_path().has_kernel();
    let said = c
        .notices
        .iter()
        .any(|n| n.contains("without a bf16 kernel"));
    assert_eq!(
        said,
        emulated,
        "{:?} on path {:?}",
        c.notices,
        qwen_burn_kernels::bf16_path()
    );
    assert!(load(&[]).unwrap().notices.is_empty());
}

#[test]
fn data_keys_of_the_other_kind_are_refused() {
    for key in [
        "sampling=\"epochs\"",
        "val_fraction=0.1",
        "cache_dir=\"c\"",
        "text_field=\"t\"",
    ] {
        let e = load(&["data.kind=\"sft\"", &format!("data.{key}")])
            .unwrap_err()
            .to_string();
        let name = key.split('=').next().unwrap();
        assert!(
            e.contains(&format!("data.{name}")) && e.contains("sft"),
            "{e}"
        );
    }
    for key in ["val_inputs=[\"v.jsonl\"]", "pack=false"] {
        let e = load(&[&format!("data.{key}")]).unwrap_err().to_string();
        let name = key.split('=').next().unwrap();
        assert!(
            e.contains(&format!("data.{name}")) && e.contains("text"),
            "{e}"
        );
    }
    load(&["data.kind=\"sft\"", "data.pack=false"]).unwrap();
    load(&["data.sampling=\"epochs\""]).unwrap();
    // The document mask is read by text runs and packed SFT rows only.
    let e = load(&[
        "data.kind=\"sft\"",
        "data.pack=false",
        "data.document_mask=false",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("data.document_mask") && e.contains("pack"),
        "{e}"
    );
    load(&["data.kind=\"sft\"", "data.document_mask=false"]).unwrap();
    load(&["data.document_mask=false"]).unwrap();
}

#[test]
fn peak_tflops_is_a_table_per_device_kind() {
    let c = load(&["logging.peak_tflops.cuda=67.0"]).unwrap();
    assert_eq!(c.logging.peak_tflops.cuda, Some(67.0));
    assert_eq!(c.logging.peak_tflops.flex, None);
    // A bare number would apply to whatever device runs: refused, naming the key and the form.
    let e = load(&["logging.peak_tflops=67.0"]).unwrap_err().to_string();
    assert!(
        e.contains("logging.peak_tflops") && e.contains("per device kind"),
        "{e}"
    );
    let e = load(&["logging.peak_tflops.tpu=1.0"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("tpu"), "{e}");
    let c = load(&["training.fused_kernels=false"]).unwrap();
    assert!(!c.training.fused_kernels);
}

#[test]
fn non_finite_values_are_refused_naming_the_key_not_replaced_by_defaults() {
    for (set, key) in [
        ("model.rope_theta=nan", "model.rope_theta"),
        ("model.rope_theta=inf", "model.rope_theta"),
        ("model.rms_norm_eps=nan", "model.rms_norm_eps"),
        ("model.initializer_range=-inf", "model.initializer_range"),
        (
            "model.rope_scaling={rope_type=\"yarn\", factor=4.0, beta_fast=nan}",
            "model.rope_scaling.beta_fast",
        ),
        ("optimizer.grad_clip=nan", "optimizer.grad_clip"),
        ("optimizer.lr=inf", "optimizer.lr"),
        ("optimizer.weight_decay=nan", "optimizer.weight_decay"),
        ("schedule.min_lr=nan", "schedule.min_lr"),
        (
            "training.sample_temperature=nan",
            "training.sample_temperature",
        ),
        ("logging.peak_tflops={flex=inf}", "logging.peak_tflops.flex"),
    ] {
        let e = load(&[set]).unwrap_err().to_string();
        assert!(
            e.contains(key) && e.contains("finite"),
            "--set {set}: expected an error naming {key}, got: {e}"
        );
    }
}

#[test]
fn out_of_range_optimizer_and_sampling_values_are_refused() {
    for (set, key) in [
        (
            "training.sample_temperature=-1",
            "training.sample_temperature",
        ),
        ("optimizer.grad_clip=-1", "optimizer.grad_clip"),
        ("optimizer.eps=0", "optimizer.eps"),
        ("schedule.min_lr=1", "schedule.min_lr"),
        ("logging.peak_tflops={cuda=-3}", "logging.peak_tflops.cuda"),
    ] {
        let e = load(&[set]).unwrap_err().to_string();
        assert!(e.contains(key), "--set {set}: {e}");
    }
    // The edges stay valid: no clipping, no decay, greedy samples.
    load(&[
        "optimizer.grad_clip=0",
        "optimizer.weight_decay=0",
        "training.sample_temperature=0",
    ])
    .unwrap();
}

#[test]
fn an_unknown_key_names_its_path_once() {
    let e = load(&["training.bogus=1"]).unwrap_err().to_string();
    assert!(e.contains("training.bogus"), "{e}");
    assert!(!e.contains("bogus.bogus"), "{e}");
    let e = load(&["logging.peak_tflops={tpu=1.0}"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("logging.peak_tflops.tpu") && !e.contains("tpu.tpu"),
        "{e}"
    );
}

#[test]
fn hf_bookkeeping_keys_are_refused_in_a_run_config() {
    for set in [
        "model.torch_dtype=\"bfloat16\"",
        "model.architectures=[\"Qwen3ForCausalLM\"]",
        "model.dtype=\"float32\"",
        "model.use_cache=false",
        "model.transformers_version=\"4.51.0\"",
    ] {
        let key = set.split('=').next().unwrap();
        let e = load(&[set]).unwrap_err().to_string();
        assert!(
            e.contains(key) && e.contains("no effect"),
            "--set {set}: {e}"
        );
    }
}

#[test]
fn wsd_keys_are_checked_and_only_read_with_wsd() {
    let e = load(&["schedule.decay=\"wsd\"", "schedule.decay_fraction=0"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("schedule.decay_fraction") && e.contains("(0, 1]"),
        "{e}"
    );
    let e = load(&["schedule.decay_shape=\"sqrt\""])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("schedule.decay_shape") && e.contains("only read with"),
        "{e}"
    );
    let c = load(&["schedule.decay=\"wsd\"", "schedule.decay_shape=\"sqrt\""]).unwrap();
    assert_eq!(c.schedule.decay_shape, DecayShape::Sqrt);
    assert_eq!(c.schedule.decay_fraction, 0.2);
}

/// `training.precision`: `"f32"` and `"bf16"`; another name is refused with the choices, and
/// `"bf16"` with the fused kernels off (which would run f32 products) names both keys.
#[test]
fn precision_names_its_choices_and_needs_the_fused_kernels() {
    assert_eq!(
        load(&["training.precision=\"bf16\""])
            .unwrap()
            .training
            .precision,
        super::Precision::Bf16
    );
    assert_eq!(load(&[]).unwrap().training.precision, super::Precision::F32);
    let e = load(&["training.precision=\"fp16\""])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("training.precision") && e.contains("bf16") && e.contains("f32"),
        "{e}"
    );
    let e = load(&[
        "training.precision=\"bf16\"",
        "training.fused_kernels=false",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("training.precision") && e.contains("fused_kernels"),
        "{e}"
    );
}
