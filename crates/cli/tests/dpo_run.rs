//! A whole DPO run against TRL's `DPOTrainer`, step for step: the policy `init` makes from
//! `fixtures/dpo_run/model.toml` trained by `qwen-burn train` with `fixtures/dpo_run/run.toml`
//! (every step on all six pairs, the starting policy as reference, AdamW with weight decay,
//! clipping, a constant learning rate) logs, at every step, the loss, gradient norm and TRL
//! figures that TRL 1.16.0 logged training the same policy with the same settings
//! (`fixtures/dpo_run/make_dpo_run_fixture.py`, `expected.json`). The per-pair parity tests
//! (`crates/train/tests/dpo.rs`) check one step's loss and gradients; this checks that the
//! optimizer, the clipping, the reference table, the batching and the logged figures carry a
//! run as TRL carries it.

mod common;
use common::*;

use serde_json::Value;

const FIXTURE: &str = "crates/cli/tests/fixtures/dpo_run";

/// `|ours - theirs| <= tol * max(1, |theirs|)`, with a message naming the step and figure.
fn close(step: u64, name: &str, ours: f64, theirs: f64, tol: f64) {
    assert!(
        (ours - theirs).abs() <= tol * theirs.abs().max(1.0),
        "step {step} {name}: ours {ours}, TRL {theirs} (tolerance {tol} relative)"
    );
}

#[test]
fn a_dpo_run_logs_what_trls_dpo_trainer_logs_step_for_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy");
    let model = format!("{FIXTURE}/model.toml");
    ok(&qwen_burn(
        &["init", "--config", &model, "--out", s(&policy)],
        &[],
    ));
    let run = dir.path().join("run");
    let from = format!("model.from=\"{}\"", policy.display());
    let config = format!("{FIXTURE}/run.toml");
    let args = [
        "train",
        "--config",
        &config,
        "--run-dir",
        s(&run),
        "--set",
        &from,
    ];
    ok(&qwen_burn(&args, &[]));

    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join(FIXTURE).join("expected.json"))
            .expect("expected.json"),
    )
    .expect("expected.json parses");
    let theirs = expected["steps"].as_array().expect("steps");
    let ours: Vec<Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON record"))
        .filter(|v| v["split"] == "train")
        .collect();
    assert_eq!(ours.len(), theirs.len(), "one record a step on both sides");
    assert!(theirs.len() >= 10, "the fixture covers a run, not a step");
    for (o, t) in ours.iter().zip(theirs) {
        let step = t["step"].as_u64().expect("step");
        assert_eq!(o["step"].as_u64(), Some(step));
        close(
            step,
            "lr",
            o["lr"].as_f64().unwrap(),
            t["learning_rate"].as_f64().unwrap(),
            1e-9,
        );
        for (name, tol) in [("loss", LOSS_TOL), ("grad_norm", NORM_TOL)] {
            let (ours, theirs) = (o[name].as_f64().unwrap(), t[name].as_f64().unwrap());
            assert!(
                (ours - theirs).abs() <= tol * theirs.abs(),
                "step {step} {name}: ours {ours}, TRL {theirs} (tolerance {tol} relative)"
            );
        }
        // Tokenisation, truncation and batching: TRL's cumulative count of non-padding input
        // tokens (`num_tokens`, the attention mask's ones) exactly.
        assert_eq!(
            o["non_padding_tokens_seen"].as_f64(),
            t["num_tokens"].as_f64(),
            "step {step}: non-padding tokens so far"
        );
        for name in [
            "rewards/chosen",
            "rewards/rejected",
            "rewards/margins",
            "rewards/accuracies",
            "logps/chosen",
            "logps/rejected",
        ] {
            let ours = o["figures"][name]
                .as_f64()
                .unwrap_or_else(|| panic!("{name} at {step}"));
            close(step, name, ours, t[name].as_f64().unwrap(), FIGURE_TOL);
        }
    }
    // The run moved: a check of a run, not of a step-1 loss of ln 2.
    let last = theirs.last().unwrap()["loss"].as_f64().unwrap();
    assert!(
        last < 0.1,
        "TRL's last loss {last}: the fixture should train"
    );
}

/// Tolerances: f32 arithmetic in another order on each side, compounded over the run's Adam
/// steps. Measured (TRL 1.16.0, torch 2.15, AMD EPYC Zen 3): at most 3e-6 relative on the loss,
/// 8e-6 on the gradient norm, 1.1e-6 on the figures. A one-setting change on our side moves the
/// loss by 1.3e-3 (`optimizer.eps` 1e-7) to 4.7e-2 (`grad_clip` 1.1) relative; weight decay off,
/// `beta2` 0.96 or `preference.beta` 0.1001 by 4e-3 to 2e-2.
const LOSS_TOL: f64 = 1e-4;
const NORM_TOL: f64 = 1e-4;
/// Relative, floored at 1 absolute (the rewards start at 0).
const FIGURE_TOL: f64 = 1e-5;
