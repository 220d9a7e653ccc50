//! Hostile input, round two, through the binary: outputs onto inputs, refusals that leave
//! nothing, memory bounds of the scoring forwards, signals, zero sizes, wrong types for named
//! choices, non-UTF-8 paths and corrupt Parquet. Each case used to lose a file, panic, allocate
//! without bound, or silently do something else than asked; each now gets a clear error naming
//! the flag, key or file (or the documented behaviour).

mod common;
use std::path::Path;

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

#[test]
fn eval_records_never_overwrite_an_input_and_are_checked_before_the_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf(dir.path(), &[]);
    let task = dir.path().join("task.jsonl");
    std::fs::copy(repo_root().join("datasets/tasks/austen_cloze.jsonl"), &task).expect("copy");
    let before = std::fs::read(&task).expect("task");
    let tok = repo_root().join("datasets/tokenizer.json");
    let eval = |records: &Path| {
        qwen_burn(
            &[
                "eval",
                "--model",
                s(&hf),
                "--task",
                s(&task),
                "--limit",
                "2",
                "--tokenizer",
                s(&tok),
                "--records",
                s(records),
            ],
            &[],
        )
    };
    // Onto the task file, onto the model's config.json, into a missing directory.
    let err = fails(&eval(&task));
    assert!(err.contains("--records") && err.contains("reads"), "{err}");
    assert_eq!(
        std::fs::read(&task).expect("task"),
        before,
        "the task file is unchanged"
    );
    let config = hf.join("config.json");
    let config_before = std::fs::read(&config).expect("config");
    let err = fails(&eval(&config));
    assert!(err.contains("--records"), "{err}");
    assert_eq!(std::fs::read(&config).expect("config"), config_before);
    let err = fails(&eval(&dir.path().join("missing/records.jsonl")));
    assert!(err.contains("does not exist"), "{err}");
    // A good path gets one record per question, and nothing else is left beside it.
    let out = dir.path().join("records.jsonl");
    ok(&eval(&out));
    let lines = std::fs::read_to_string(&out)
        .expect("records")
        .lines()
        .count();
    assert_eq!(lines, 2);
    let leftovers = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn init_and_export_never_write_over_a_checkpoint_and_replace_a_model_only_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 2, 2, "");
    let run = dir.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    let ckpt = std::fs::read_dir(run.join("checkpoints"))
        .expect("checkpoints")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .next()
        .expect("a checkpoint");
    let ckpt_config = std::fs::read(ckpt.join("config.json")).expect("config");
    // Into a checkpoint, or a run directory: refused, even with --overwrite.
    for target in [&ckpt, &run] {
        for extra in [&[][..], &["--overwrite"][..]] {
            let mut args = vec!["init", "--config", s(&config), "--out", s(target)];
            args.extend(extra);
            let err = fails(&qwen_burn(&args, &[]));
            assert!(err.contains("--out") && err.contains("damage"), "{err}");
        }
    }
    assert_eq!(
        std::fs::read(ckpt.join("config.json")).expect("config"),
        ckpt_config
    );
    // Over an exported model: refused, then replaced with --overwrite; a sharded index and its
    // shards left there are removed, so every loader reads the new single file.
    let hf = dir.path().join("hf");
    ok(&qwen_burn(
        &["export", "--checkpoint", s(&run), "--out", s(&hf)],
        &[],
    ));
    let err = fails(&qwen_burn(
        &["init", "--config", s(&config), "--out", s(&hf)],
        &[],
    ));
    assert!(err.contains("--overwrite"), "{err}");
    let index = r#"{"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00001.safetensors"}}"#;
    std::fs::write(hf.join("model.safetensors.index.json"), index).expect("index");
    std::fs::write(hf.join("model-00001-of-00001.safetensors"), b"stale").expect("shard");
    ok(&qwen_burn(
        &[
            "export",
            "--checkpoint",
            s(&run),
            "--out",
            s(&hf),
            "--overwrite",
        ],
        &[],
    ));
    assert!(!hf.join("model.safetensors.index.json").exists());
    assert!(!hf.join("model-00001-of-00001.safetensors").exists());
    // The directory loads (as the single file).
    let task = repo_root().join("datasets/tasks/austen_cloze.jsonl");
    ok(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--task",
            s(&task),
            "--limit",
            "1",
        ],
        &[],
    ));
}

#[test]
fn a_refused_resume_or_branch_changes_nothing_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 4, 2, "");
    let run = dir.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    let run_toml = std::fs::read(run.join("run.toml")).expect("run.toml");
    let metrics = std::fs::read(run.join("metrics.jsonl")).expect("metrics");
    // --max-steps below the checkpoint's step: an error naming it, and nothing rewritten.
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--resume",
            "--max-steps",
            "2",
        ],
        &[],
    ));
    assert!(err.contains("max_steps") && err.contains("step 4"), "{err}");
    assert_eq!(
        std::fs::read(run.join("run.toml")).expect("run.toml"),
        run_toml
    );
    assert_eq!(
        std::fs::read(run.join("metrics.jsonl")).expect("metrics"),
        metrics
    );
    // A branch refused for the same reason leaves its new run directory as it found it, so the
    // corrected command runs.
    let ckpt = run.join("checkpoints").join("step-00000004");
    assert!(ckpt.is_dir(), "{}", ckpt.display());
    let branch = dir.path().join("branch");
    let args = |steps: &'static str| {
        vec![
            "train".to_string(),
            "--config".into(),
            s(&config).into(),
            "--run-dir".into(),
            s(&branch).into(),
            "--from-checkpoint".into(),
            s(&ckpt).into(),
            "--max-steps".into(),
            steps.into(),
        ]
    };
    let refused = args("3");
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    let err = fails(&qwen_burn(&refused, &[]));
    assert!(err.contains("max_steps"), "{err}");
    let left: Vec<String> = std::fs::read_dir(&branch)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n != "train.lock")
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
    let fixed = args("6");
    let fixed: Vec<&str> = fixed.iter().map(String::as_str).collect();
    ok(&qwen_burn(&fixed, &[]));
    assert!(branch.join("checkpoints").join("step-00000006").is_dir());
}

/// SIGTERM on a plain (batch) `train`: the step in progress ends, a checkpoint is written at
/// it, the exit code is 143, and `--resume` continues from it.
#[test]
fn sigterm_ends_a_batch_run_with_a_checkpoint_and_code_143() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 100_000, 100_000, "");
    let run = dir.path().join("run");
    let child = qwen_burn_command()
        .args(["train", "--config", s(&config), "--run-dir", s(&run)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("qwen-burn starts");
    let start = Instant::now();
    let logged = |run: &Path| {
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .map(|t| t.matches("\"split\":\"train\"").count())
            .unwrap_or(0)
    };
    while logged(&run) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no steps logged"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let out = child.wait_with_output().expect("qwen-burn ends");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(143), "{stdout}\n{}", stderr(&out));
    assert!(stdout.contains("stopped by SIGTERM"), "{stdout}");
    let step: usize = stdout
        .split("stopped: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("stopped: N steps");
    assert!(
        run.join(format!("checkpoints/step-{step:08}/state.json"))
            .is_file()
    );
    let more = (step + 2).to_string();
    let resumed = ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--resume",
            "--max-steps",
            &more,
        ],
        &[],
    ));
    assert!(
        resumed.contains(&format!("resumed at step {step}")),
        "{resumed}"
    );
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

/// A branch from a checkpoint whose path is not UTF-8: the run starts (branch.json holds the
/// path as text) instead of panicking.
#[test]
fn a_branch_from_a_non_utf8_path_runs() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 2, 2, "");
    let parent = dir.path().join(OsStr::from_bytes(b"parent-\xff"));
    let run = |args: &[&OsStr]| {
        qwen_burn_command()
            .args(args)
            .output()
            .expect("qwen-burn runs")
    };
    let os = OsStr::new;
    ok(&run(&[
        os("train"),
        os("--config"),
        config.as_os_str(),
        os("--run-dir"),
        parent.as_os_str(),
    ]));
    let ckpt = parent.join("checkpoints").join("step-00000002");
    let branch = dir.path().join("branch");
    ok(&run(&[
        os("train"),
        os("--config"),
        config.as_os_str(),
        os("--run-dir"),
        branch.as_os_str(),
        os("--from-checkpoint"),
        ckpt.as_os_str(),
        os("--max-steps"),
        os("3"),
    ]));
    let record = std::fs::read_to_string(branch.join("branch.json")).expect("branch.json");
    assert!(record.contains("parent-\u{fffd}"), "{record}");
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

/// A resumed run whose `[eval]` tasks cannot be scored (more shots than the task has other
/// questions) fails before it trains or writes anything, not at its first scoring.
#[test]
fn eval_tasks_are_checked_before_a_resumed_run_trains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = repo_root().join("datasets/tasks/austen_cloze.jsonl");
    let extra = format!(
        "\n[eval]\ntasks = [\"{}\"]\ninterval = 1000\nlimit = 4\n",
        task.display()
    );
    let config = tiny_config(dir.path(), false, 2, 2, &extra);
    let run = dir.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    let run_toml = std::fs::read(run.join("run.toml")).expect("run.toml");
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--resume",
            "--max-steps",
            "4",
            "--set",
            "eval.shots=100000",
        ],
        &[],
    ));
    assert!(err.contains("shots"), "{err}");
    assert_eq!(
        std::fs::read(run.join("run.toml")).expect("run.toml"),
        run_toml
    );
    assert!(!run.join("checkpoints/step-00000003").exists());
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
