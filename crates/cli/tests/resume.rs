//! Exact resume: 2N steps in one run equal N steps, a killed process, `--resume`, N more steps,
//! bit for bit (dense and MoE on flex). Also a kill in the middle of a checkpoint write.

mod common;
use common::*;

/// `extra`: more `train` flags for all three runs (e.g. data-parallel replicas).
fn exact_resume(moe: bool, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), moe, 6, 3, "");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let args = |run: &std::path::Path, resume: bool| {
        let mut v = vec!["train".to_string(), "--config".into(), s(&config).into()];
        v.extend(["--run-dir".to_string(), s(run).to_string()]);
        v.extend(extra.iter().map(|x| x.to_string()));
        if resume {
            v.push("--resume".into());
        }
        v
    };
    let run = |run: &std::path::Path, resume: bool, envs: &[(&str, &str)]| {
        let v = args(run, resume);
        qwen_burn(&v.iter().map(String::as_str).collect::<Vec<_>>(), envs)
    };

    ok(&run(&a, false, &[]));

    // Killed right after step 3 and its checkpoint (abort: no destructors, no flushing).
    let killed = run(&b, false, &[("QWEN_BURN_ABORT_AFTER_STEP", "3")]);
    assert!(
        !killed.status.success(),
        "the first half must have been killed"
    );
    ok(&run(&b, true, &[]));

    let (la, lb) = (train_losses(&a), train_losses(&b));
    assert_eq!(la.len(), 6);
    println!("moe={moe} {extra:?}: uninterrupted {la:?}\nresumed {lb:?}");
    for ((sa, xa), (sb, xb)) in la.iter().zip(&lb) {
        assert_eq!(sa, sb);
        assert_eq!(
            xa.to_bits(),
            xb.to_bits(),
            "step {sa}: loss {xa} vs resumed {xb}"
        );
    }
    assert_eq!(la.len(), lb.len());
}

#[test]
fn dense_resume_is_bit_exact() {
    exact_resume(false, &[]);
}

#[test]
fn moe_resume_is_bit_exact() {
    exact_resume(true, &[]);
}

#[test]
fn dense_resume_with_muon_is_bit_exact() {
    exact_resume(false, &["--set", "optimizer.kind=muon"]);
}

#[test]
fn moe_resume_with_muon_is_bit_exact() {
    exact_resume(true, &["--set", "optimizer.kind=muon"]);
}

/// Muon trains differently from AdamW (the hidden matrices are routed to it), and a run cannot
/// switch optimizer on resume.
#[test]
fn muon_changes_the_run_and_resume_refuses_another_optimizer() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 3, 3, "");
    let (adamw, muon) = (tmp.path().join("adamw"), tmp.path().join("muon"));
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&adamw)],
        &[],
    ));
    let set = [
        "--set",
        "optimizer.kind=muon",
        "--set",
        "optimizer.muon.lr=0.05",
    ];
    let mut args = vec!["train", "--config", s(&config), "--run-dir", s(&muon)];
    args.extend(set);
    ok(&qwen_burn(&args, &[]));
    let (a, m) = (train_losses(&adamw), train_losses(&muon));
    assert_eq!(
        a[0], m[0],
        "the same first step loss: the same weights and batch"
    );
    assert!(
        a[1].1 != m[1].1,
        "after one update the optimizers differ: {a:?} vs {m:?}"
    );
    // Resuming the AdamW run (done at step 3) with more steps under Muon is refused.
    let mut args = vec![
        "train",
        "--config",
        s(&config),
        "--run-dir",
        s(&adamw),
        "--resume",
    ];
    args.extend(["--max-steps", "6"]);
    args.extend(set);
    let out = qwen_burn(&args, &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot change optimizer.kind from \"adamw\"") && err.contains("\"muon\""),
        "{err}"
    );
}

/// The README's main job trains with two replicas on the CPU (`--device flex,flex`).
#[test]
fn resume_with_two_replicas_is_bit_exact() {
    let two = ["--device", "flex,flex", "--set", "training.grad_accum=2"];
    exact_resume(false, &two);
    exact_resume(true, &two);
}

#[test]
fn kill_during_checkpoint_write_keeps_the_previous_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 6, 3, "");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&a)],
        &[],
    ));

    let killed = qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&b)],
        &[("QWEN_BURN_ABORT_IN_CHECKPOINT", "6")],
    );
    assert!(!killed.status.success());
    let ckpt = b.join("checkpoints");
    assert!(
        ckpt.join("step-00000003/state.json").is_file(),
        "previous checkpoint intact"
    );
    assert!(
        !ckpt.join("step-00000006").exists(),
        "torn checkpoint must not appear under its final name"
    );
    assert!(
        ckpt.join("step-00000006.tmp").exists(),
        "the write was interrupted half-way"
    );

    // The previous checkpoint loads and the run resumes from it to the same result.
    ok(&qwen_burn(
        &[
            "generate",
            "--model",
            s(&ckpt.join("step-00000003")),
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "4",
            "--json",
        ],
        &[],
    ));
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&b),
            "--resume",
        ],
        &[],
    ));
    assert!(!ckpt.join("step-00000006.tmp").exists());
    let (la, lb) = (train_losses(&a), train_losses(&b));
    assert_eq!(la, lb);
}

fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `(step, split, loss bits)` of every metrics record: one per step and split, in order.
fn records(run: &std::path::Path) -> Vec<(u64, String, u64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["split"].as_str().unwrap().to_string(),
                v["loss"].as_f64().unwrap().to_bits(),
            )
        })
        .collect()
}

/// A real SIGKILL after step 4 of 6 (checkpoints at 3 and 6): steps 4.. are re-run from the
/// step-3 checkpoint, `metrics.jsonl` and `samples.jsonl` are truncated to step 3 first, and the
/// result is the uninterrupted run's, bit for bit. While the first process lives, a second
/// writer is refused (naming its PID) and readers load the newest complete checkpoint.
#[test]
fn sigkill_between_checkpoints_resumes_exactly_and_the_run_dir_has_one_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 6, 3, "");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let train = |run: &std::path::Path, resume: bool| {
        let mut v: Vec<String> = ["train", "--config", s(&config), "--run-dir", s(run)]
            .iter()
            .map(|x| x.to_string())
            .collect();
        v.extend(
            [
                "--set",
                "training.sample_interval=1",
                "--set",
                "training.sample_tokens=4",
            ]
            .map(String::from),
        );
        if resume {
            v.push("--resume".into());
        }
        v
    };
    ok(&qwen_burn(&as_refs(&train(&a, false)), &[]));

    // Run b pauses after step 4 (its records written, its checkpoint still step 3).
    let log = tmp.path().join("b.stderr");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_qwen-burn"))
        .args(train(&b, false))
        .current_dir(repo_root())
        .env("QWEN_BURN_PAUSE_AFTER_STEP", "4")
        .env(
            "QWEN_BURN_CACHE_DIR",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen-burn-cache"),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("paused after step 4")
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "run b ended early: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(std::time::Instant::now() < deadline, "run b never paused");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // A second writer is refused and changes nothing.
    let metrics_before = std::fs::read(b.join("metrics.jsonl")).unwrap();
    for resume in [false, true] {
        let out = qwen_burn(&as_refs(&train(&b, resume)), &[]);
        assert!(!out.status.success(), "a second writer must be refused");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("in use by PID {}", child.id())),
            "{err}"
        );
    }
    assert_eq!(
        std::fs::read(b.join("metrics.jsonl")).unwrap(),
        metrics_before
    );
    // Readers need no lock and see the newest complete checkpoint (step 3).
    let generated = ok(&qwen_burn(
        &[
            "generate",
            "--model",
            s(&b),
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "2",
            "--json",
        ],
        &[],
    ));
    assert!(generated.contains("new_token_ids"), "{generated}");
    let exported = tmp.path().join("exported");
    ok(&qwen_burn(
        &["export", "--checkpoint", s(&b), "--out", s(&exported)],
        &[],
    ));
    assert!(exported.join("model.safetensors").is_file());

    // SIGKILL (std's `kill` on Unix), between the step-3 and step-6 checkpoints.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        records(&b).iter().any(|r| r.0 == 4),
        "step 4 was recorded before the kill"
    );
    assert_eq!(
        qwen_burn_train::run::checkpoint::latest_checkpoint(&b)
            .unwrap()
            .file_name()
            .unwrap(),
        "step-00000003"
    );

    // The dead process's lock does not block --resume.
    ok(&qwen_burn(&as_refs(&train(&b, true)), &[]));
    let (ra, rb) = (records(&a), records(&b));
    println!("uninterrupted {ra:?}\nresumed {rb:?}");
    assert_eq!(
        ra, rb,
        "metrics: one record per step and split, losses bit-identical"
    );
    assert_eq!(
        std::fs::read_to_string(a.join("samples.jsonl")).unwrap(),
        std::fs::read_to_string(b.join("samples.jsonl")).unwrap(),
        "samples truncated and re-generated identically"
    );
}

/// `--from-checkpoint` branches a new run from a stable-phase checkpoint of a WSD run with a
/// shorter horizon: its first step equals the parent's bit for bit (same weights, optimizer
/// state and data), at its own lower learning rate, then it cools down; no warning, since the
/// learning rate does not jump at the branch point. A branch from the parent's decay warns.
/// Its directory records where it branched, and a used run directory is refused.
#[test]
fn a_branch_equals_its_parent_until_its_own_decay() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 10, 3, "");
    let (parent, branch) = (tmp.path().join("parent"), tmp.path().join("branch"));
    // 10 steps, decay over the last 2 (0-based steps 8 and 9); checkpoints at 6, 9, 10 kept.
    let wsd = [
        "--set",
        "schedule.decay=wsd",
        "--set",
        "schedule.decay_fraction=0.2",
    ];
    let mut args = vec!["train", "--config", s(&config), "--run-dir", s(&parent)];
    args.extend(wsd);
    ok(&qwen_burn(&args, &[]));
    // The branch: from step 6 to 8 steps in all, so its decay is at 0-based steps 6 and 7.
    let from = parent.join("checkpoints/step-00000006");
    let mut args = vec!["train", "--config", s(&config), "--run-dir", s(&branch)];
    args.extend(wsd);
    args.extend(["--from-checkpoint", s(&from), "--max-steps", "8"]);
    let out = qwen_burn(&args, &[]);
    ok(&out);
    assert!(
        !stderr(&out).contains("warning: branching"),
        "{}",
        stderr(&out)
    );

    let records = |run: &std::path::Path| -> Vec<(u64, f64, f64)> {
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["split"] == "train")
            .map(|v| {
                let f = |k: &str| v[k].as_f64().unwrap();
                (v["step"].as_u64().unwrap(), f("loss"), f("lr"))
            })
            .collect()
    };
    let (p, b) = (records(&parent), records(&branch));
    assert_eq!(
        b.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    // Steps 1-6 of the branch's records are the parent's, copied. Step 7 is the branch's own
    // first step, its first decay step: the parent's loss (computed from the same weights and
    // data, before the update), at a lower learning rate; from step 8 on the weights differ.
    assert_eq!(
        p[6].1.to_bits(),
        b[6].1.to_bits(),
        "step 7: loss {p:?} vs {b:?}"
    );
    assert!(b[6].2 < p[6].2, "the branch decays from step 7: {b:?}");
    assert!(b[7].1 != p[7].1, "different weights after step 7");
    // From the parent's decay (its step 9) into a longer run: the learning rate would jump.
    let late = tmp.path().join("late");
    let mut args = vec!["train", "--config", s(&config), "--run-dir", s(&late)];
    args.extend(wsd);
    let from_decay = parent.join("checkpoints/step-00000009");
    args.extend(["--from-checkpoint", s(&from_decay), "--max-steps", "20"]);
    let out = qwen_burn(&args, &[]);
    ok(&out);
    assert!(
        stderr(&out).contains("warning: branching after step 9")
            && stderr(&out).contains("during the parent's WSD decay"),
        "{}",
        stderr(&out)
    );
    let origin: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(branch.join("branch.json")).unwrap())
            .unwrap();
    assert_eq!(origin["step"], 6);
    assert!(
        origin["parent_checkpoint"]
            .as_str()
            .unwrap()
            .ends_with("step-00000006")
    );

    // Branching into a directory that has checkpoints is refused.
    let mut args = vec!["train", "--config", s(&config), "--run-dir", s(&branch)];
    args.extend(["--from-checkpoint", s(&from)]);
    let out = qwen_burn(&args, &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("already has checkpoints"),
        "{}",
        stderr(&out)
    );
}

/// `non_padding_tokens_seen` equals `tokens_seen` on pretraining rows (no padding), and a run
/// resumed from a checkpoint written before the count existed leaves it out instead of
/// restarting it from 0.
#[test]
fn a_checkpoint_without_the_non_padding_count_resumes_without_it() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 6, 3, "");
    let run = tmp.path().join("run");
    let args = ["train", "--config", s(&config), "--run-dir", s(&run)];
    let killed = qwen_burn(&args, &[("QWEN_BURN_ABORT_AFTER_STEP", "3")]);
    assert!(
        !killed.status.success(),
        "the first half must have been killed"
    );
    let state_path = run.join("checkpoints/step-00000003/state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    assert_eq!(state["non_padding_tokens_seen"], state["tokens_seen"]);
    state
        .as_object_mut()
        .unwrap()
        .remove("non_padding_tokens_seen");
    std::fs::write(&state_path, state.to_string()).unwrap();
    ok(&qwen_burn(&[&args[..], &["--resume"]].concat(), &[]));

    let train = train_metrics(&run);
    assert_eq!(train.len(), 6, "{train:?}");
    for r in &train {
        let step = r["step"].as_u64().unwrap();
        if step <= 3 {
            assert_eq!(
                r["non_padding_tokens_seen"], r["tokens_seen"],
                "step {step}"
            );
        } else {
            assert!(
                r.get("non_padding_tokens_seen").is_none(),
                "step {step}: {r}"
            );
        }
    }
}
