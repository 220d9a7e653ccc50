//! Failure behaviour: non-finite loss, a failing checkpoint write, an architecture change on
//! resume, bad configs.

mod common;
use common::*;

#[test]
fn nan_loss_stops_naming_the_step_and_keeps_the_last_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 20, 1, "");
    let run = tmp.path().join("run");
    // An absurd learning rate blows the weights up within a few steps.
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            "optimizer.lr=1e30",
            "--set",
            "schedule.min_lr=0",
            "--set",
            "schedule.warmup_steps=0",
            "--set",
            "optimizer.grad_clip=0",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("non-finite loss") && err.contains("at step"),
        "{err}"
    );
    assert!(err.contains("last good checkpoint"), "{err}");
    let ckpts = std::fs::read_dir(run.join("checkpoints")).unwrap().count();
    assert!(ckpts >= 1, "the checkpoints before the bad step are kept");
    let latest = qwen_burn_train::checkpoint::latest_checkpoint(&run).unwrap();
    ok(&qwen_burn(
        &[
            "generate",
            "--model",
            s(&latest),
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
