//! Hostile input through the binary: each case is one that used to panic, allocate without
//! bound, lose a file or silently do something else than asked, and now gets a clear error (or
//! the documented behaviour).

mod common;
use std::path::{Path, PathBuf};

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
