//! Hostile input through the binary, continued: damaged and half-written checkpoints, a new
//! batch shape on resume, a full disk (the rest is in `hostile.rs`).

mod common;
use std::path::{Path, PathBuf};

use common::*;

/// A run of 6 steps with checkpoints at 3 and 6, whose newest checkpoint is then truncated.
fn run_with_corrupt_newest(tmp: &Path) -> (PathBuf, PathBuf) {
    let config = tiny_config(tmp, false, 6, 3, "");
    let run = tmp.join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    let model = run.join("checkpoints/step-00000006/model.bpk");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    (config, run)
}

#[test]
fn a_corrupt_newest_checkpoint_falls_back_to_the_previous_one_and_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, run) = run_with_corrupt_newest(tmp.path());
    let tokens = tmp.path().join("tokens.json");
    std::fs::write(&tokens, r#"{"input_ids": [[1, 2, 3, 4, 5]]}"#).unwrap();
    for args in [
        vec![
            "generate",
            "--model",
            s(&run),
            "--prompt-ids",
            "1,2",
            "--max-new-tokens",
            "2",
        ],
        vec![
            "eval",
            "--model",
            s(&run),
            "--text",
            "datasets/austen/austen_persuasion.txt.gz",
            "--context",
            "32",
            "--max-tokens",
            "100",
        ],
        vec!["score", "--model", s(&run), "--tokens", s(&tokens)],
        vec!["export", "--checkpoint", s(&run), "--out", "/dev/null/x"],
    ] {
        let out = qwen_burn(&args, &[]);
        let err = stderr(&out);
        assert!(
            err.contains("step-00000006") && err.contains("falling back"),
            "{args:?}: {err}"
        );
        if args[0] != "export" {
            ok(&out);
        }
    }
    let out = qwen_burn(
        &[
            "export",
            "--checkpoint",
            s(&run),
            "--out",
            s(&tmp.path().join("hf")),
        ],
        &[],
    );
    ok(&out);
    assert!(tmp.path().join("hf/model.safetensors").is_file());
    // A checkpoint named explicitly is not replaced by another one.
    fails(&qwen_burn(
        &[
            "generate",
            "--model",
            s(&run.join("checkpoints/step-00000006")),
            "--prompt-ids",
            "1,2",
        ],
        &[],
    ));
    // --resume continues from step 3 and keeps the unreadable one aside.
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--resume",
            "--max-steps",
            "9",
        ],
        &[],
    );
    ok(&out);
    let err = stderr(&out);
    assert!(
        err.contains("step-00000006") && err.contains("falling back"),
        "{err}"
    );
    assert!(
        run.join("checkpoints/step-00000006.corrupt/model.bpk")
            .is_file()
    );
    assert!(run.join("checkpoints/step-00000009/state.json").is_file());
    let steps: Vec<u64> = train_losses(&run).iter().map(|(s, _)| *s).collect();
    assert_eq!(
        steps,
        (1..=9).collect::<Vec<_>>(),
        "metrics cut back to step 3"
    );
}

#[test]
fn resume_refuses_a_new_batch_shape_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 3, 3, "");
    let run = tmp.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    for set in ["training.batch_size=2", "training.seq_len=16"] {
        let err = fails(&qwen_burn(
            &[
                "train",
                "--config",
                s(&config),
                "--run-dir",
                s(&run),
                "--resume",
                "--max-steps",
                "6",
                "--set",
                set,
            ],
            &[],
        ));
        let key = set.split('=').next().unwrap();
        assert!(
            err.contains("(--resume or --from-checkpoint) cannot change") && err.contains(key),
            "{err}"
        );
        assert!(!err.contains("changed since the checkpoint"), "{err}");
    }
}

/// Run `qwen-burn train` with its run directory on a tmpfs of `size` (a private mount, in a
/// user and mount namespace), and list what the run directory holds afterwards.
fn train_on_small_disk(tmp: &Path, size: &str, steps: usize) -> (String, String) {
    let config = tiny_config(tmp, false, steps, 3, "");
    let disk = tmp.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let script = format!(
        "mount -t tmpfs -o size={size} tmpfs '{disk}' || exit 99; \
         '{bin}' train --config '{config}' --run-dir '{disk}/run'; echo \"exit=$?\" >&2; \
         cd '{disk}/run' && find . | sort",
        disk = disk.display(),
        bin = env!("CARGO_BIN_EXE_qwen-burn"),
        config = config.display(),
    );
    let out = std::process::Command::new("unshare")
        .env(
            "QWEN_BURN_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen-burn-cache"),
        )
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
        .current_dir(repo_root())
        .output()
        .expect("unshare runs");
    assert_ne!(
        out.status.code(),
        Some(99),
        "could not mount a tmpfs: {}",
        stderr(&out)
    );
    // The listing's lines, not the progress lines that train printed before it.
    let files = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('.'))
        .collect::<Vec<_>>()
        .join("\n");
    (files, stderr(&out))
}

/// Whether this machine lets an unprivileged process mount a private tmpfs (a user and mount
/// namespace), and why not.
fn private_mounts() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let script = format!(
        "mount -t tmpfs -o size=64k tmpfs '{}'",
        dir.path().display()
    );
    match std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(stderr(&out)),
        Err(e) => Err(format!("unshare: {e}")),
    }
}

#[test]
fn a_full_disk_leaves_no_partial_files_behind() {
    // A full disk is simulated with a small private tmpfs, which needs user namespaces. Where the
    // machine has none, the test says so and stops; set QWEN_BURN_REQUIRE_MOUNTS=1 to make that
    // a failure.
    if let Err(why) = private_mounts() {
        assert!(
            std::env::var_os("QWEN_BURN_REQUIRE_MOUNTS").is_none(),
            "no private tmpfs: {why}"
        );
        eprintln!("skipped: this machine cannot mount a private tmpfs ({why})");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // Too small for the tokenizer copy (546 KB).
    let (files, err) = train_on_small_disk(tmp.path(), "256k", 3);
    assert!(err.contains("No space left"), "{err}");
    assert!(!err.contains("exit=0"), "{err}");
    assert!(!files.contains(".tmp"), "left behind:\n{files}");
    // Room for the tokenizer and the step-3 checkpoint, not for step 6's.
    let (files, err) = train_on_small_disk(tmp.path(), "4600k", 9);
    assert!(err.contains("No space left"), "{err}");
    assert!(
        files.contains("./checkpoints/step-00000003/state.json"),
        "{files}\n{err}"
    );
    assert!(!files.contains(".tmp"), "left behind:\n{files}\n{err}");
}

#[test]
fn a_damaged_byte_that_still_parses_is_found_by_the_checkpoint_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 6, 3, "");
    let run = tmp.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    // Flip one bit in the last weight: the record still parses, the values are wrong.
    let model = run.join("checkpoints/step-00000006/model.bpk");
    let mut bytes = std::fs::read(&model).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0x10;
    std::fs::write(&model, bytes).unwrap();
    let out = qwen_burn(
        &[
            "generate",
            "--model",
            s(&run),
            "--prompt-ids",
            "1,2",
            "--max-new-tokens",
            "2",
        ],
        &[],
    );
    ok(&out);
    let err = stderr(&out);
    assert!(
        err.contains("model.bpk") && err.contains("damaged"),
        "{err}"
    );
}
