//! Shared helpers of the CLI integration tests: tiny run configs on the shipped corpus.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// A tiny dense or MoE run on one Shakespeare play, `steps` steps, checkpoint every `every`.
pub fn tiny_config(dir: &Path, moe: bool, steps: usize, every: usize, extra: &str) -> PathBuf {
    let root = repo_root();
    let moe_keys = if moe {
        "model_type = \"qwen3_moe\"\nnum_experts = 4\nnum_experts_per_tok = 2\nmoe_intermediate_size = 16\n\
         norm_topk_prob = true\noutput_router_logits = true\nrouter_aux_loss_coef = 0.01\nrouter_z_loss_coef = 0.001\nrouter_bias_update_rate = 0.001\n"
    } else {
        "model_type = \"qwen3\"\n"
    };
    let text = format!(
        r#"[model]
{moe_keys}vocab_size = 8192
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 8
max_position_embeddings = 64
tie_word_embeddings = true

[data]
inputs = ["{corpus}"]
tokenizer = "{tok}"
cache_dir = "{cache}"
val_fraction = 0.1

[optimizer]
lr = 3e-3

[schedule]
warmup_steps = 2
min_lr = 1e-4

[training]
seed = 7
batch_size = 4
seq_len = 32
max_steps = {steps}
eval_interval = {every}
eval_batches = 2
sample_interval = 0

[checkpoint]
interval = {every}
keep_last = 3

[logging]
interval = 1
{extra}"#,
        corpus = root
            .join("datasets/shakespeare/sonnets_gut.txt.gz")
            .display(),
        tok = root.join("datasets/tokenizer.json").display(),
        cache = dir.join("shards").display(),
    );
    let path = dir.join(if moe { "moe.toml" } else { "dense.toml" });
    std::fs::write(&path, text).expect("write config");
    path
}

/// The binary, run from the repository root with the tests' own peak cache (a peak measured
/// beside parallel tests must not reach the user's).
pub fn qwen_burn_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qwen-burn"));
    cmd.current_dir(repo_root()).env(
        "QWEN_BURN_CACHE_DIR",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen-burn-cache"),
    );
    cmd
}

pub fn qwen_burn(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = qwen_burn_command();
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("qwen-burn runs")
}

pub fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "qwen-burn failed:\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Every record of a run's `metrics.jsonl`, in order.
pub fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect()
}

/// The train records of a run's `metrics.jsonl`, in order.
pub fn train_metrics(run: &Path) -> Vec<serde_json::Value> {
    metrics(run)
        .into_iter()
        .filter(|v| v["split"] == "train")
        .collect()
}

/// `(step, loss)` of the train records of a run.
pub fn train_losses(run: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["split"] == "train")
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The step-0 weights of the tiny dense config as an HF directory (no training needed), with
/// `--set` overrides.
pub fn tiny_hf(tmp: &Path, extra: &[&str]) -> PathBuf {
    let config = tiny_config(tmp, false, 3, 3, "");
    let out = tmp.join("hf");
    let mut args = vec!["init", "--config", s(&config), "--out", s(&out)];
    for e in extra {
        args.extend(["--set", e]);
    }
    ok(&qwen_burn(&args, &[]));
    out
}

/// [`tiny_hf`] with the shipped `tokenizer.json` beside the weights.
pub fn tiny_hf_with_tokenizer(tmp: &Path) -> PathBuf {
    let hf = tiny_hf(tmp, &[]);
    std::fs::copy(
        repo_root().join("datasets/tokenizer.json"),
        hf.join("tokenizer.json"),
    )
    .expect("tokenizer");
    hf
}

/// A failed command's stderr, after checking that it failed and did not panic.
pub fn fails(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure, got success:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr(out);
    assert!(!err.contains("panicked"), "a panic, not an error:\n{err}");
    err
}
