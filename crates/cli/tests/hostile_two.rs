//! Hostile input, round two, through the binary: outputs onto inputs, refusals that leave
//! nothing, memory bounds of the scoring forwards, signals, zero sizes, wrong types for named
//! choices, non-UTF-8 paths and corrupt Parquet. Each case used to lose a file, panic, allocate
//! without bound, or silently do something else than asked; each now gets a clear error naming
//! the flag, key or file (or the documented behaviour).

mod common;

use common::*;

#[test]
fn zero_sizes_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf(dir.path(), &[]);
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
        (
            "data.kind=2",
            "data.kind",
            "`text`, `sft`, `preference`",
            "an integer",
        ),
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

/// A corrupt Parquet task whose page makes the `parquet` crate panic: one error naming the
/// file, and no "panicked at" line before it.
#[test]
fn a_corrupt_parquet_task_is_one_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf(dir.path(), &[]);
    let task = dir.path().join("task.parquet");
    std::fs::copy(
        repo_root().join("crates/data/tests/fixtures/parquet/fuzz_bit_util_panic.parquet"),
        &task,
    )
    .expect("copy");
    let tok = repo_root().join("datasets/tokenizer.json");
    let err = fails(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--tokenizer",
            s(&tok),
            "--task",
            s(&task),
        ],
        &[],
    ));
    assert!(
        err.contains("corrupt Parquet data") && err.contains("task.parquet"),
        "{err}"
    );
}

/// Two `[eval]` tasks whose files share a name would be logged and plotted as one task.
#[test]
fn two_eval_tasks_of_one_name_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = repo_root().join("datasets/tasks/austen_cloze.jsonl");
    std::fs::create_dir_all(dir.path().join("other")).expect("dir");
    let copy = dir.path().join("other/austen_cloze.jsonl");
    std::fs::copy(&task, &copy).expect("copy");
    let extra = format!(
        "\n[eval]\ntasks = [\"{}\", \"{}\"]\n",
        task.display(),
        copy.display()
    );
    let config = tiny_config(dir.path(), false, 1, 1, &extra);
    let run = dir.path().join("run");
    let err = fails(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    assert!(
        err.contains("eval.tasks") && err.contains("`austen_cloze`"),
        "{err}"
    );
    assert!(!run.exists(), "refused before the run directory");
}

/// `score` reads `input_ids` only: a padding mask or labels beside them are refused, not
/// ignored (padding would be scored as text).
#[test]
fn score_refuses_what_it_would_ignore() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf(dir.path(), &[]);
    let rows = dir.path().join("rows.json");
    for extra in [
        r#""attention_mask": [[1, 1, 1, 0]]"#,
        r#""labels": [[5, 6, 7, -100]]"#,
    ] {
        let text = format!(r#"{{"input_ids": [[5, 6, 7, 0]], {extra}}}"#);
        std::fs::write(&rows, text).expect("rows");
        let err = fails(&qwen_burn(
            &["score", "--model", s(&hf), "--tokens", s(&rows)],
            &[],
        ));
        let key = extra.split('"').nth(1).expect("key");
        assert!(
            err.contains(&format!("`{key}`")) && err.contains("input_ids"),
            "{err}"
        );
    }
    std::fs::write(&rows, r#"{"input_ids": [[5, 6, 7, 8]]}"#).expect("rows");
    ok(&qwen_burn(
        &["score", "--model", s(&hf), "--tokens", s(&rows)],
        &[],
    ));
}

/// A forward that cannot fit is refused before it allocates, naming the options that size it,
/// with the limit `train` uses (`QWEN_BURN_MEMORY_LIMIT` here, set low).
#[test]
fn forwards_that_cannot_fit_are_refused_naming_the_options() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf(dir.path(), &[]);
    let tok = repo_root().join("datasets/tokenizer.json");
    let text = repo_root().join("datasets/shakespeare/sonnets_gut.txt.gz");
    let limit = [("QWEN_BURN_MEMORY_LIMIT", "64MiB")];
    let err = fails(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--tokenizer",
            s(&tok),
            "--text",
            s(&text),
            "--context",
            "64",
            "--batch-size",
            "64",
        ],
        &limit,
    ));
    assert!(err.contains("--batch-size x --context"), "{err}");
    // The same text in small batches fits.
    ok(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--tokenizer",
            s(&tok),
            "--text",
            s(&text),
            "--context",
            "64",
            "--batch-size",
            "2",
            "--max-tokens",
            "512",
        ],
        &limit,
    ));
    // score: 40 rows of 32 tokens in one forward.
    let rows: Vec<Vec<u32>> = (0..40)
        .map(|r| (0..32).map(|c| (r * 32 + c) % 8000).collect())
        .collect();
    let path = dir.path().join("rows.json");
    std::fs::write(&path, serde_json::json!({ "input_ids": rows }).to_string()).expect("rows");
    let err = fails(&qwen_burn(
        &["score", "--model", s(&hf), "--tokens", s(&path)],
        &limit,
    ));
    assert!(err.contains("rows x tokens of --tokens"), "{err}");
}

/// One `eval --task` question whose choices alone need more logits than the usual grouping
/// bound (a large vocabulary and long choices) is checked against the memory limit before its
/// forward, naming what sizes it.
#[test]
fn an_oversized_task_question_is_refused_before_its_forward() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A 65,536-token vocabulary with room for long choices.
    let extra = "";
    let config = tiny_config(dir.path(), false, 1, 1, extra);
    let text = std::fs::read_to_string(&config)
        .expect("config")
        .replace("vocab_size = 8192", "vocab_size = 65536")
        .replace(
            "max_position_embeddings = 64",
            "max_position_embeddings = 1024",
        );
    std::fs::write(&config, text).expect("config");
    let hf = dir.path().join("hf");
    ok(&qwen_burn(
        &["init", "--config", s(&config), "--out", s(&hf)],
        &[],
    ));
    // Four choices of ~300 tokens: 4 x 300 x 65,536 logits, over the 2^26 grouping bound.
    let long = "the quick brown fox jumps over the lazy dog and ".repeat(30);
    let row = serde_json::json!({
        "context": "Once upon a time",
        "choices": [long.clone(), long.clone(), long.clone(), long],
        "gold": 0,
    });
    let task = dir.path().join("long.jsonl");
    std::fs::write(&task, format!("{row}\n")).expect("task");
    let tok = repo_root().join("datasets/tokenizer.json");
    let err = fails(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--tokenizer",
            s(&tok),
            "--task",
            s(&task),
        ],
        &[("QWEN_BURN_MEMORY_LIMIT", "64MiB")],
    ));
    assert!(
        err.contains("question 1") && err.contains("its choices x its longest choice"),
        "{err}"
    );
}

/// `training.precision = "bf16"` is computed by the fused kernels of the flex device: on
/// another device it is refused before anything is written, naming the key.
#[test]
fn bf16_precision_off_flex_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 2, 2, "");
    let run = dir.path().join("run");
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--device",
            "ndarray",
            "--set",
            "training.precision=\"bf16\"",
        ],
        &[],
    );
    let e = fails(&out);
    assert!(
        e.contains("training.precision") && e.contains("flex"),
        "{e}"
    );
    assert!(
        !run.join("metrics.jsonl").exists(),
        "a refused run wrote metrics"
    );
}

/// `QWEN_BURN_BF16_KERNEL` (which caps the bf16 kernel, to compare paths on one CPU) that names
/// no path, or one this CPU lacks, is refused before anything is written, naming the variable
/// and the paths this CPU has; `emulated` exists on every CPU and is taken.
#[test]
fn a_bf16_kernel_this_cpu_lacks_is_refused_naming_the_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 2, 2, "");
    let run = dir.path().join("run");
    let args = ["train", "--config", s(&config), "--run-dir", s(&run)];
    for bad in ["avx2", "AMX", "amx-bf16"] {
        let out = qwen_burn(&args, &[("QWEN_BURN_BF16_KERNEL", bad)]);
        let e = fails(&out);
        assert!(
            e.contains("QWEN_BURN_BF16_KERNEL") && e.contains(bad) && e.contains("emulated"),
            "{e}"
        );
        assert!(!run.exists(), "a refused run wrote {}", run.display());
    }
    let out = qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[("QWEN_BURN_BF16_KERNEL", "emulated")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
