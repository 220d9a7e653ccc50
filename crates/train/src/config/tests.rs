use super::*;

const MINIMAL: &str = r#"
[model]
vocab_size = 64
hidden_size = 16
intermediate_size = 32
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
head_dim = 8
[data]
inputs = ["x.txt"]
tokenizer = "t.json"
[optimizer]
lr = 1e-3
[training]
batch_size = 2
seq_len = 8
max_steps = 10
"#;

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
