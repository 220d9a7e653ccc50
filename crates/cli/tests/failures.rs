//! Failure behaviour: non-finite loss, a failing checkpoint write, an architecture change on
//! resume, bad configs.

mod common;
use common::*;

#[test]
fn failed_checkpoint_write_is_reported_and_keeps_the_good_one() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 6, 3, "");
    let run = tmp.path().join("run");
    // Step 6's checkpoint directory cannot be created: a file is in the way (as root, which this
    // runs as, permissions cannot make the write fail).
    let blocked = run.join("checkpoints/step-00000006.tmp");
    std::fs::create_dir_all(blocked.parent().unwrap()).unwrap();
    std::fs::write(&blocked, b"in the way").unwrap();
    let out = qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("step-00000006.tmp"), "{err}");
    let good = run.join("checkpoints/step-00000003");
    assert!(good.join("state.json").is_file());
    assert!(!run.join("checkpoints/step-00000006").exists());
    ok(&qwen_burn(
        &[
            "generate",
            "--model",
            s(&good),
            "--prompt-ids",
            "1,2",
            "--max-new-tokens",
            "2",
            "--json",
        ],
        &[],
    ));
}

#[test]
fn resume_with_another_architecture_is_refused_listing_the_differences() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 3, 3, "");
    let run = tmp.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    let out = qwen_burn(
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
            "model.hidden_size=48",
            "--set",
            "model.num_hidden_layers=3",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("architecture differs"), "{err}");
    assert!(
        err.contains("hidden_size: checkpoint 32 vs config 48"),
        "{err}"
    );
    assert!(
        err.contains("num_hidden_layers: checkpoint 2 vs config 3"),
        "{err}"
    );
    // Changing only the schedule length is fine.
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--resume",
            "--max-steps",
            "6",
        ],
        &[],
    ));
}

#[test]
fn bad_configs_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 3, 3, "");
    let run = tmp.path().join("run");
    for (set, needle) in [
        ("optimizer.lrr=1", "lrr"),
        ("training.batch_size=0", "training.batch_size"),
        ("model.head_dim=7", "model.head_dim"),
        ("data.sampling=\"sideways\"", "data.sampling"),
    ] {
        let out = qwen_burn(
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
        );
        assert!(!out.status.success(), "{set} must be refused");
        let err = stderr(&out);
        assert!(err.contains(needle), "{set}: {err}");
    }
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "[model\nx=1").unwrap();
    let out = qwen_burn(&["train", "--config", s(&bad)], &[]);
    assert!(stderr(&out).contains("bad.toml"), "{}", stderr(&out));
}

/// `score` of `model` on a fixed pair of rows (ids below the tiny vocab of 8192).
fn score_loss(dir: &std::path::Path, model: &std::path::Path) -> Option<f64> {
    let tokens = dir.join("tokens.json");
    std::fs::write(
        &tokens,
        r#"{"input_ids": [[5, 17, 300, 42, 7, 99, 1000, 3], [8, 8, 8, 8, 9, 9, 9, 9]]}"#,
    )
    .unwrap();
    let out = ok(&qwen_burn(
        &["score", "--model", s(model), "--tokens", s(&tokens)],
        &[],
    ));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("score prints JSON");
    v["loss"].as_f64()
}

/// Divergence with a checkpoint every step and no clipping: lr 1e4 (the issue's case, where the
/// update of the last step before the loss turns NaN already ruins the weights) and 1e30. The
/// run stops naming the step, and the checkpoint it keeps as "last good" scores a finite loss.
#[test]
fn divergence_never_leaves_a_bad_last_good_checkpoint() {
    for lr in ["1e4", "1e30"] {
        diverge(lr);
    }
}

fn diverge(lr: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 40, 1, "");
    let run = tmp.path().join("run");
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            &format!("optimizer.lr={lr}"),
            "--set",
            "optimizer.grad_clip=0",
            "--set",
            "schedule.warmup_steps=0",
            "--set",
            "schedule.min_lr=0",
        ],
        &[],
    );
    assert!(!out.status.success(), "lr {lr}: the run must diverge");
    let err = stderr(&out);
    println!("lr {lr}: {}", err.lines().next().unwrap_or_default());
    assert!(
        err.contains("non-finite") && err.contains("at step"),
        "{err}"
    );
    assert!(err.contains("last good checkpoint"), "{err}");
    let latest = qwen_burn_train::run::checkpoint::latest_checkpoint(&run).expect("a checkpoint");
    let loss = score_loss(tmp.path(), &latest);
    assert!(
        loss.is_some_and(f64::is_finite),
        "{} scores {loss:?}",
        latest.display()
    );
}

/// A NaN gradient with a finite loss (injected into `model.norm.weight` at step 3).
#[test]
fn a_non_finite_gradient_norm_stops_before_the_update_naming_the_parameter() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 6, 1, "");
    let run = tmp.path().join("run");
    let poison = [("QWEN_BURN_POISON_GRAD_AT_STEP", "3")];
    let out = qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &poison,
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("non-finite gradient norm (NaN) at step 3")
            && err.contains("first in parameter model.norm.weight")
            && err.contains("step-00000002"),
        "{err}"
    );
    let latest = qwen_burn_train::run::checkpoint::latest_checkpoint(&run).unwrap();
    assert!(latest.ends_with("step-00000002"), "{}", latest.display());

    // With on_nonfinite = "skip" the step's update is dropped and training goes on.
    let run2 = tmp.path().join("run2");
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run2),
            "--set",
            "training.on_nonfinite=\"skip\"",
        ],
        &poison,
    );
    let stdout = ok(&out);
    assert!(
        stdout.contains("step      3 | skipped: non-finite gradient norm"),
        "{stdout}"
    );
    let records: Vec<serde_json::Value> = std::fs::read_to_string(run2.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["split"] == "train")
        .collect();
    let skipped: Vec<u64> = records
        .iter()
        .filter(|v| v["skipped"] == true)
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(skipped, vec![3]);
    assert_eq!(records.len(), 6);
    // Skipping step 3's update: step 2's weights see step 4's batch.
    let loss = score_loss(tmp.path(), &run2);
    assert!(loss.is_some_and(f64::is_finite), "{loss:?}");
}

#[test]
fn a_run_shorter_than_its_warmup_trains_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 20, 0, "");
    let run = tmp.path().join("run");
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            "schedule.warmup_steps=30",
            "--max-steps",
            "3",
        ],
        &[],
    );
    ok(&out);
    let err = stderr(&out);
    assert!(err.contains("warmup is clipped to 3 steps"), "{err}");
    let lrs: Vec<f64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["split"] == "train")
        .map(|v| v["lr"].as_f64().unwrap())
        .collect();
    // Warmup over the 3 steps to the peak 3e-3.
    let want = [1e-3, 2e-3, 3e-3];
    for (got, want) in lrs.iter().zip(want) {
        assert!((got - want).abs() < 1e-12, "{lrs:?}");
    }
}

/// `--resume` accepts a new schedule horizon and new loss coefficients, printing what changed.
#[test]
fn resume_with_changed_horizon_and_coefficients_prints_the_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), true, 3, 3, "");
    let run = tmp.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--resume",
            "--max-steps",
            "5",
            "--set",
            "model.router_aux_loss_coef=0.02",
            "--set",
            "model.router_z_loss_coef=0.0",
        ],
        &[],
    );
    ok(&out);
    let err = stderr(&out);
    for needle in [
        "training.max_steps: 3 -> 5 (the learning-rate schedule is re-planned over 5 steps",
        "model.router_aux_loss_coef: 0.01 -> 0.02",
        "model.router_z_loss_coef: 0.001 -> 0 (applies from the next step)",
    ] {
        assert!(err.contains(needle), "missing `{needle}` in:\n{err}");
    }
    assert_eq!(train_losses(&run).len(), 5);
    // The new coefficient is the one the resumed run saved.
    let ckpt = qwen_burn_train::run::checkpoint::latest_checkpoint(&run).unwrap();
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("config.json")).unwrap()).unwrap();
    assert_eq!(saved["router_aux_loss_coef"], 0.02);
}

#[test]
fn ddp_on_a_cpu_device_list_fails_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 3, 3, "");
    let run = tmp.path().join("run");
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--device",
            "flex,flex",
            "--set",
            "training.grad_accum=2",
            "--set",
            "training.parallel=\"ddp\"",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("training.parallel") && err.contains("CUDA"),
        "{err}"
    );
    assert!(!run.join("metrics.jsonl").exists(), "nothing was trained");
}
