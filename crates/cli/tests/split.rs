//! The data of a step depends on the global batch (`batch_size x grad_accum`), never on its
//! split (issue 40): the same run as 4 x 1, 2 x 2 and 1 x 4 trains on the same rows (its
//! losses agree to float rounding; before, each split drew other windows and step 1's loss
//! differed in the third digit), and a run resumed under another split continues the same
//! data.

mod common;
use common::*;

fn run(
    dir: &std::path::Path,
    name: &str,
    sets: &[String],
    resume: bool,
    env: &[(&str, &str)],
) -> std::process::Output {
    let config = tiny_config(dir, false, 4, 2, "");
    let run_dir = dir.join(name);
    let mut args = vec![
        "train".to_string(),
        "--config".into(),
        s(&config).into(),
        "--run-dir".into(),
        s(&run_dir).into(),
    ];
    for set in sets {
        args.extend(["--set".to_string(), set.clone()]);
    }
    if resume {
        args.push("--resume".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    qwen_burn(&args, env)
}

fn split(b: usize) -> Vec<String> {
    vec![
        format!("training.batch_size={b}"),
        format!("training.grad_accum={}", 4 / b),
    ]
}

#[test]
fn the_split_of_a_global_batch_changes_no_row_and_a_resume_may_change_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut losses = Vec::new();
    for b in [4, 2, 1] {
        ok(&run(dir.path(), &format!("b{b}"), &split(b), false, &[]));
        losses.push(train_losses(&dir.path().join(format!("b{b}"))));
    }
    for other in &losses[1..] {
        assert_eq!(other.len(), losses[0].len());
        for ((step, a), (_, b)) in losses[0].iter().zip(other) {
            assert!((a - b).abs() <= 1e-5 * a.abs(), "step {step}: {a} vs {b}");
        }
    }
    // Killed after step 2 as 4 x 1, resumed as 1 x 4: the same rows as 1 x 4 throughout.
    let out = run(
        dir.path(),
        "switch",
        &split(4),
        false,
        &[("QWEN_BURN_ABORT_AFTER_STEP", "2")],
    );
    assert!(!out.status.success());
    ok(&run(dir.path(), "switch", &split(1), true, &[]));
    let switched = train_losses(&dir.path().join("switch"));
    for ((step, a), (_, b)) in losses[2].iter().zip(&switched).skip(2) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "step {step}: {a} vs {b}");
    }
}
