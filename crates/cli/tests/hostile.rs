//! Hostile input through the binary: each case is one that used to panic, allocate without
//! bound, lose a file or silently do something else than asked, and now gets a clear error (or
//! the documented behaviour).

mod common;
use std::path::Path;

use common::*;

#[test]
fn export_onto_its_own_source_is_refused_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path(), &[]);
    let tok = hf.join("tokenizer.json");
    std::fs::copy(repo_root().join("datasets/tokenizer.json"), &tok).unwrap();
    let before = std::fs::read(&tok).unwrap();
    let weights = std::fs::read(hf.join("model.safetensors")).unwrap();
    let err = fails(&qwen_burn(
        &["export", "--checkpoint", s(&hf), "--out", s(&hf)],
        &[],
    ));
    assert!(
        err.contains("--out") && err.contains("being exported"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&tok).unwrap(),
        before,
        "tokenizer.json changed"
    );
    assert_eq!(
        std::fs::read(hf.join("model.safetensors")).unwrap(),
        weights
    );
    // The same directory spelled differently is the same directory.
    let other_spelling = hf.join("../hf");
    fails(&qwen_burn(
        &[
            "export",
            "--checkpoint",
            s(&hf),
            "--out",
            s(&other_spelling),
        ],
        &[],
    ));
    assert_eq!(std::fs::read(&tok).unwrap(), before);
}

#[test]
fn eval_with_a_tokenizer_larger_than_the_model_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    // A model with 256 embeddings; the shipped tokenizer has 8192 tokens.
    let hf = tiny_hf(tmp.path(), &["model.vocab_size=256"]);
    let err = fails(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--tokenizer",
            "datasets/tokenizer.json",
            "--text",
            "datasets/austen/austen_persuasion.txt.gz",
            "--context",
            "32",
            "--max-tokens",
            "200",
        ],
        &[],
    ));
    assert!(
        err.contains("vocab_size is 256") && err.contains("tokenizer.json"),
        "{err}"
    );
}

#[test]
fn a_config_json_asking_for_petabytes_is_refused_before_allocating() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path(), &[]);
    let path = hf.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["num_hidden_layers"] = serde_json::json!(1_000_000_000u64);
    std::fs::write(&path, config.to_string()).unwrap();
    let started = std::time::Instant::now();
    let err = fails(&qwen_burn(
        &["generate", "--model", s(&hf), "--prompt-ids", "1,2"],
        &[],
    ));
    assert!(
        err.contains("num_hidden_layers") && err.contains("is available"),
        "{err}"
    );
    assert!(started.elapsed().as_secs() < 30, "it tried to build it");
}

#[test]
fn init_with_a_trillion_token_vocabulary_is_refused_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 3, 3, "");
    let err = fails(&qwen_burn(
        &[
            "init",
            "--config",
            s(&config),
            "--out",
            s(&tmp.path().join("hf")),
            "--set",
            "model.vocab_size=1000000000000",
        ],
        &[],
    ));
    assert!(err.contains("vocab_size") && err.contains("TiB"), "{err}");
    // A limit set by the user is the limit.
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&tmp.path().join("run")),
        ],
        &[("QWEN_BURN_MEMORY_LIMIT", "1MiB")],
    ));
    assert!(err.contains("QWEN_BURN_MEMORY_LIMIT=1MiB"), "{err}");
    assert!(err.contains("training.batch_size"), "{err}");
}

fn generate(hf: &Path, flags: &[&str]) -> std::process::Output {
    let mut args = vec![
        "generate",
        "--model",
        s(hf),
        "--prompt-ids",
        "1,2,3",
        "--max-new-tokens",
        "8",
        "--json",
    ];
    args.extend(flags);
    qwen_burn(&args, &[])
}

fn new_ids(out: &std::process::Output) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_str(ok(out).trim()).unwrap();
    v["new_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn sampling_flags_are_checked_as_hf_checks_them() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path(), &[]);
    for (flags, named) in [
        (&["--temperature=NaN"][..], "--temperature"),
        (&["--temperature=-1"][..], "--temperature"),
        (&["--temperature=inf"][..], "--temperature"),
        (&["--temperature=1", "--top-p=0"][..], "--top-p"),
        (&["--temperature=1", "--top-p=-1"][..], "--top-p"),
        (&["--temperature=1", "--top-p=1.5"][..], "--top-p"),
    ] {
        let err = fails(&generate(&hf, flags));
        assert!(err.contains(named), "{flags:?}: {err}");
    }
    // top_k = 0 is "no top-k filter" (HF), not greedy: the same draws as no top-k at all.
    let greedy = new_ids(&generate(&hf, &[]));
    let unfiltered = new_ids(&generate(&hf, &["--temperature=1", "--seed=3"]));
    let top_k_0 = new_ids(&generate(
        &hf,
        &["--temperature=1", "--seed=3", "--top-k=0"],
    ));
    assert_eq!(top_k_0, unfiltered);
    assert_ne!(top_k_0, greedy, "--top-k 0 decoded greedily");
}

#[test]
fn generating_past_the_trained_context_warns() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path(), &[]);
    // max_position_embeddings is 64.
    let out = qwen_burn(
        &[
            "generate",
            "--model",
            s(&hf),
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "70",
            "--ignore-eos",
            "--json",
        ],
        &[],
    );
    ok(&out);
    assert!(
        stderr(&out).contains("max_position_embeddings (64)"),
        "{}",
        stderr(&out)
    );
    let out = generate(&hf, &[]);
    ok(&out);
    assert!(!stderr(&out).contains("max_position_embeddings"));
}

/// Overwrite the last f32 of `model.safetensors` (the end of the last tensor) with NaN.
fn poison_last_weight(hf: &Path) {
    let path = hf.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn nan_weights_are_an_error_naming_the_parameter_not_a_null_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path(), &[]);
    std::fs::copy(
        repo_root().join("datasets/tokenizer.json"),
        hf.join("tokenizer.json"),
    )
    .unwrap();
    poison_last_weight(&hf);
    let tokens = tmp.path().join("tokens.json");
    std::fs::write(&tokens, r#"{"input_ids": [[1, 2, 3, 4, 5]]}"#).unwrap();
    let err = fails(&qwen_burn(
        &["score", "--model", s(&hf), "--tokens", s(&tokens)],
        &[],
    ));
    assert!(
        err.contains("not finite") && err.contains("parameter"),
        "{err}"
    );
    let err = fails(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--text",
            "datasets/austen/austen_persuasion.txt.gz",
            "--context",
            "32",
            "--max-tokens",
            "100",
        ],
        &[],
    ));
    assert!(
        err.contains("not finite") && err.contains("parameter"),
        "{err}"
    );
}
