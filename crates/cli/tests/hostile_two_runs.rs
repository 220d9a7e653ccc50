//! Hostile input, round two, through the binary: what a refused or interrupted run and a
//! command's outputs may and may not touch (the rest of round two is in `hostile_two.rs`).

mod common;
use std::path::Path;

use common::*;

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
