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
