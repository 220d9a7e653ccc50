//! Per-run options travel with the run (issue 37): two trainings with different
//! `training.fused_kernels` and `training.activation_checkpointing`, run at the same time in one
//! process, each log exactly the losses they log alone. (With the options in process-wide
//! switches, the run that set its switch last decided both.)

use std::path::{Path, PathBuf};

use qwen_burn_train::{RunConfig, RunOptions, train};

fn config(dir: &Path, fused: bool, checkpointing: &str) -> RunConfig {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let data = root.join("datasets/austen");
    let tok = root.join("datasets/tokenizer.json");
    let text = format!(
        r#"
[model]
model_type = "qwen3"
vocab_size = 8192
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 16
max_position_embeddings = 64
tie_word_embeddings = true

[data]
inputs = [{data:?}]
tokenizer = {tok:?}
cache_dir = {cache:?}
val_fraction = 0.01

[optimizer]
lr = 3e-3

[training]
seed = 7
batch_size = 2
seq_len = 64
grad_accum = 2
max_steps = 6
eval_interval = 0
sample_interval = 0
fused_kernels = {fused}
activation_checkpointing = "{checkpointing}"

[checkpoint]
interval = 0

[logging]
interval = 1
peak_tflops = {{ flex = 1.0 }}
"#,
        cache = dir.join("shards"),
    );
    RunConfig::from_table(text.parse().unwrap()).unwrap()
}

fn losses(run: &Path) -> Vec<u64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["split"] == "train")
        .map(|r| r["loss"].as_f64().unwrap().to_bits())
        .collect()
}

fn run(config: &RunConfig, dir: PathBuf) -> Vec<u64> {
    let opts = RunOptions {
        device: None,
        run_dir: dir.clone(),
        resume: false,
        from_checkpoint: None,
    };
    train(config, &opts).unwrap();
    losses(&dir)
}

#[test]
fn two_differently_configured_runs_in_one_process_keep_their_own_options() {
    let tmp = tempfile::tempdir().unwrap();
    let composed = config(tmp.path(), false, "layers");
    let fused = config(tmp.path(), true, "none");
    let alone_a = run(&composed, tmp.path().join("alone-a"));
    let alone_b = run(&fused, tmp.path().join("alone-b"));
    assert_eq!(alone_a.len(), 6);
    assert_ne!(
        alone_a, alone_b,
        "the two settings must give different bits, or the test could not tell them apart"
    );
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| run(&composed, tmp.path().join("together-a")));
        let b = s.spawn(|| run(&fused, tmp.path().join("together-b")));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(
        a, alone_a,
        "the composed, checkpointed run changed beside the other"
    );
    assert_eq!(b, alone_b, "the fused run changed beside the other");
}
