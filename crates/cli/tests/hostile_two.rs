//! Hostile input, round two, through the binary: zero and absurd sizes, and wrong types for
//! named choices. Each case used to do nothing, print NaN, silently become 1, or answer with
//! serde's wording; each now gets an error naming the flag or key and what it takes.

mod common;
use std::path::{Path, PathBuf};

use common::*;

/// The step-0 weights of the tiny dense config as an HF directory (no training needed).
fn tiny_hf(tmp: &Path) -> PathBuf {
    let config = tiny_config(tmp, false, 3, 3, "");
    let out = tmp.join("hf");
    ok(&qwen_burn(
        &["init", "--config", s(&config), "--out", s(&out)],
        &[],
    ));
    out
}

fn fails(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure, got success:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr(out);
    assert!(!err.contains("panicked"), "a panic, not an error:\n{err}");
    err
}

#[test]
fn zero_sizes_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf(dir.path());
    let task = repo_root().join("datasets/tasks/austen_cloze.jsonl");
    let text = repo_root().join("datasets/shakespeare/sonnets_gut.txt.gz");
    let model = ["--model", s(&hf)];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--task", s(&task), "--limit", "0"], "--limit"),
        (
            vec!["--task", s(&task), "--batch-questions", "0"],
            "--batch-questions",
        ),
        (
            vec!["--text", s(&text), "--batch-size", "0"],
            "--batch-size",
        ),
        (vec!["--text", s(&text), "--bucket", "0"], "--bucket"),
        (vec!["--text", s(&text), "--context", "0"], "--context"),
        (
            vec!["--text", s(&text), "--max-tokens", "0"],
            "--max-tokens",
        ),
    ];
    for (flags, flag) in cases {
        let mut args = vec!["eval"];
        args.extend(model);
        args.extend(flags);
        let err = fails(&qwen_burn(&args, &[]));
        assert!(
            err.contains(flag) && err.contains("at least 1"),
            "{flag}: {err}"
        );
    }
    // `bench peak --n 0` used to cache a peak of 0 (MFU then read inf%): refused, nothing
    // cached.
    let cache = dir.path().join("cache");
    let cache_env = [("QWEN_BURN_CACHE_DIR", s(&cache))];
    for flag in ["--n", "--repeats"] {
        let err = fails(&qwen_burn(&["bench", "peak", flag, "0"], &cache_env));
        assert!(err.contains(flag) && err.contains("at least 1"), "{err}");
    }
    assert!(!cache.exists(), "nothing cached");
}

#[test]
fn a_bool_or_number_for_a_named_choice_names_the_key_and_its_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 1, 1, "");
    let run = dir.path().join("run");
    let cases = [
        (
            "optimizer.kind=true",
            "optimizer.kind",
            "`adamw` or `muon`",
            "a boolean",
        ),
        ("data.kind=2", "data.kind", "`text` or `sft`", "an integer"),
        (
            "training.activation_checkpointing=false",
            "training.activation_checkpointing",
            "`none` or `layers`",
            "a boolean",
        ),
        (
            "training.on_nonfinite=1.5",
            "training.on_nonfinite",
            "`stop` or `skip`",
            "a float",
        ),
    ];
    for (set, key, choices, given) in cases {
        let err = fails(&qwen_burn(
            &[
                "train",
                "--config",
                s(&config),
                "--run-dir",
                s(&run),
                "--set",
                set,
            ],
            &[],
        ));
        assert!(
            err.contains(key) && err.contains(choices) && err.contains(given),
            "{set}: {err}"
        );
        assert!(!err.contains("unit variant"), "{set}: {err}");
        assert!(
            !run.exists(),
            "{set}: a refused run leaves no run directory"
        );
    }
}
