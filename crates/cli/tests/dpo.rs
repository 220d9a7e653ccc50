//! Preference fine-tuning through the binary (issue 38): a DPO run from an HF model writes its
//! reference log-probabilities once and its TRL-named figures; `--resume` reuses the reference
//! and continues bit for bit; a changed pair file is refused on resume; `eval --pairs` agrees
//! with the run's own step-0 validation (with RPO's `sft_weight` too); bad settings and rows
//! name the key, file and line.

mod common;
use common::*;

use std::path::Path;

/// A DPO config for the tiny model in `hf`, on the shipped pairs (train and validation).
fn dpo_config(dir: &Path, hf: &Path, pairs: &Path, steps: usize) -> std::path::PathBuf {
    let root = repo_root();
    let text = format!(
        r#"[model]
from = "{hf}"
[data]
kind = "preference"
inputs = ["{pairs}"]
val_inputs = ["{val}"]
[preference]
loss = "sigmoid"
beta = 0.1
[optimizer]
lr = 1e-3
[training]
seed = 3
batch_size = 4
seq_len = 96
max_steps = {steps}
eval_interval = 2
eval_batches = 2
sample_interval = 0
[checkpoint]
interval = 2
[logging]
interval = 1
"#,
        hf = hf.display(),
        pairs = pairs.display(),
        val = root
            .join("datasets/preference/austen_next_sentence_val.jsonl")
            .display(),
    );
    let path = dir.join(format!("dpo{steps}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn train_records(run: &Path) -> Vec<String> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"split\":\"train\""))
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            for k in ["tokens_per_sec", "mfu", "elapsed_secs"] {
                v.as_object_mut().unwrap().remove(k);
            }
            v.to_string()
        })
        .collect()
}

#[test]
fn a_dpo_run_keeps_its_reference_resumes_exactly_and_eval_pairs_agrees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let pairs = dir.path().join("pairs.jsonl");
    let all =
        std::fs::read_to_string(repo_root().join("datasets/preference/austen_next_sentence.jsonl"))
            .unwrap();
    std::fs::write(&pairs, all.lines().take(40).collect::<Vec<_>>().join("\n")).unwrap();

    let straight = dir.path().join("straight");
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&dpo_config(dir.path(), &hf, &pairs, 4)),
            "--run-dir",
            s(&straight),
        ],
        &[],
    ));
    let reference = std::fs::read_to_string(straight.join("reference_logps.json")).unwrap();
    let records = train_records(&straight);
    assert_eq!(records.len(), 4);
    for key in [
        "rewards/chosen",
        "rewards/margins",
        "rewards/accuracies",
        "logps/rejected",
    ] {
        assert!(records[0].contains(key), "{key} missing: {}", records[0]);
    }
    // Step 1: the policy is the reference, so the loss is ln 2.
    let first: serde_json::Value = serde_json::from_str(&records[0]).unwrap();
    assert!(
        (first["loss"].as_f64().unwrap() - std::f64::consts::LN_2).abs() < 1e-4,
        "{first}"
    );

    // Killed right after step 2 (its checkpoint written), then --resume: the same records and
    // the same reference file.
    let resumed = dir.path().join("resumed");
    let four = dpo_config(dir.path(), &hf, &pairs, 4);
    let out = qwen_burn(
        &["train", "--config", s(&four), "--run-dir", s(&resumed)],
        &[("QWEN_BURN_ABORT_AFTER_STEP", "2")],
    );
    assert!(!out.status.success());
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&four),
            "--run-dir",
            s(&resumed),
            "--resume",
        ],
        &[],
    ));
    assert_eq!(train_records(&resumed), records);
    assert_eq!(
        std::fs::read_to_string(resumed.join("reference_logps.json")).unwrap(),
        reference
    );

    // Other pairs under a resumed run: refused, naming the reference file.
    std::fs::write(
        &pairs,
        all.lines().skip(1).take(40).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&dpo_config(dir.path(), &hf, &pairs, 6)),
            "--run-dir",
            s(&resumed),
            "--resume",
        ],
        &[],
    ));
    assert!(
        err.contains("reference_logps.json") && err.contains("other preference pairs"),
        "{err}"
    );

    // eval --pairs on the starting model equals the run's step-0 validation accuracy, on the
    // same pairs (the run validates on its first eval_batches x batch_size = 8).
    let val_all = repo_root().join("datasets/preference/austen_next_sentence_val.jsonl");
    let val = dir.path().join("val8.jsonl");
    let text = std::fs::read_to_string(&val_all).unwrap();
    std::fs::write(&val, text.lines().take(8).collect::<Vec<_>>().join("\n")).unwrap();
    let out = ok(&qwen_burn(
        &["eval", "--model", s(&hf), "--pairs", s(&val)],
        &[],
    ));
    let eval: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let step0 = metrics(&straight)
        .into_iter()
        .find(|r| r["split"] == "val" && r["step"] == 0)
        .unwrap();
    assert_eq!(eval["pairs"], 8);
    assert_eq!(
        eval["preference_accuracy"], step0["figures"]["preference_accuracy"],
        "eval --pairs {eval} against the run's step 0 {step0}"
    );
    let with_ref = ok(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&straight),
            "--pairs",
            s(&val),
            "--reference",
            s(&hf),
        ],
        &[],
    ));
    let with_ref: serde_json::Value = serde_json::from_str(with_ref.trim()).unwrap();
    assert!(with_ref["loss"].as_f64().unwrap() > 0.0 && with_ref["reward_accuracy"].is_number());
}

#[test]
fn bad_preference_settings_and_rows_name_the_key_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let pairs = dir.path().join("pairs.jsonl");
    std::fs::write(&pairs, "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"prompt\": \"a\", \"chosen\": \" b\"}\n").unwrap();
    let config = dpo_config(dir.path(), &hf, &pairs, 2);
    let run = dir.path().join("run");
    let err = fails(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    assert!(
        err.contains("pairs.jsonl:2") && err.contains("\"rejected\""),
        "{err}"
    );
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            "preference.label_smoothing=0.1",
        ],
        &[],
    ));
    assert!(
        err.contains("preference.label_smoothing") && err.contains("robust"),
        "{err}"
    );
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            "preference.beta=0",
        ],
        &[],
    ));
    assert!(err.contains("preference.beta"), "{err}");
    // RPO's NLL term: negative, or on a loss that is not DPOTrainer's.
    for (sets, want) in [
        (vec!["preference.sft_weight=-1"], "0 or above"),
        (
            vec!["preference.sft_weight=0.5", "preference.loss=\"simpo\""],
            "sigmoid, hinge, ipo or robust",
        ),
    ] {
        let mut args = vec!["train", "--config", s(&config), "--run-dir", s(&run)];
        for set in &sets {
            args.extend(["--set", set]);
        }
        let err = fails(&qwen_burn(&args, &[]));
        assert!(
            err.contains("preference.sft_weight") && err.contains(want),
            "{err}"
        );
    }
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            "preference.loss=\"kto\"",
        ],
        &[],
    ));
    assert!(
        err.contains("preference.loss") && err.contains("simpo"),
        "{err}"
    );
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            "preference.gamma=0.3",
        ],
        &[],
    ));
    assert!(
        err.contains("preference.gamma") && err.contains("simpo"),
        "{err}"
    );
    let err = fails(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--pairs",
            s(&pairs),
            "--loss",
            "ipo",
        ],
        &[],
    ));
    assert!(err.contains("--reference"), "{err}");
}

/// The reference-free losses train without a reference (no `reference_logps.json`), log
/// ORPO's figures, and `eval --pairs --loss` reports their loss without `--reference`.
#[test]
fn simpo_and_orpo_train_without_a_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let all =
        std::fs::read_to_string(repo_root().join("datasets/preference/austen_next_sentence.jsonl"))
            .unwrap();
    let pairs = dir.path().join("pairs.jsonl");
    std::fs::write(&pairs, all.lines().take(24).collect::<Vec<_>>().join("\n")).unwrap();
    let config = dpo_config(dir.path(), &hf, &pairs, 2);
    for loss in ["simpo", "orpo"] {
        let run = dir.path().join(loss);
        ok(&qwen_burn(
            &[
                "train",
                "--config",
                s(&config),
                "--run-dir",
                s(&run),
                "--set",
                &format!("preference.loss=\"{loss}\""),
            ],
            &[],
        ));
        assert!(!run.join("reference_logps.json").exists(), "{loss}");
        let records = metrics(&run);
        let train = records.iter().find(|r| r["split"] == "train").unwrap();
        let figures = &train["figures"];
        assert!(figures["rewards/chosen"].is_number(), "{loss}: {train}");
        assert_eq!(
            figures["nll_loss"].is_number(),
            loss == "orpo",
            "{loss}: {train}"
        );
        let out = ok(&qwen_burn(
            &[
                "eval",
                "--model",
                s(&run),
                "--pairs",
                s(&pairs),
                "--loss",
                loss,
            ],
            &[],
        ));
        let eval: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert!(eval["loss"].as_f64().unwrap().is_finite(), "{loss}: {eval}");
        assert_eq!(eval["loss_type"], loss);
    }
}

#[test]
fn an_rpo_runs_validation_loss_equals_eval_pairs_with_the_same_weight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let pairs = repo_root().join("datasets/preference/austen_next_sentence.jsonl");
    let config = dpo_config(dir.path(), &hf, &pairs, 1);
    let run = dir.path().join("run");
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            "preference.sft_weight=0.5",
        ],
        &[],
    ));
    let records = metrics(&run);
    let step0 = records
        .iter()
        .find(|r| r["split"] == "val" && r["step"] == 0)
        .unwrap();
    let train = records.iter().find(|r| r["split"] == "train").unwrap();
    assert!(
        train["figures"]["sft_loss"].as_f64().unwrap() > 0.0,
        "{train}"
    );
    // The run validates on its first eval_batches x batch_size = 8 pairs, against the model it
    // starts from.
    let val_all = repo_root().join("datasets/preference/austen_next_sentence_val.jsonl");
    let val = dir.path().join("val8.jsonl");
    let text = std::fs::read_to_string(&val_all).unwrap();
    std::fs::write(&val, text.lines().take(8).collect::<Vec<_>>().join("\n")).unwrap();
    let eval = |weight: &str| -> f64 {
        let out = ok(&qwen_burn(
            &[
                "eval",
                "--model",
                s(&hf),
                "--pairs",
                s(&val),
                "--reference",
                s(&hf),
                "--sft-weight",
                weight,
            ],
            &[],
        ));
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["loss"].as_f64().unwrap()
    };
    let (with, without) = (eval("0.5"), eval("0"));
    let run_loss = step0["figures"]["preference/loss"].as_f64().unwrap();
    assert!(
        (with - run_loss).abs() <= 1e-5 * run_loss,
        "eval --pairs {with} against the run's step 0 {run_loss}"
    );
    // At step 0 the policy is the reference: DPO's part is ln 2, the rest is the NLL term.
    assert!((without - std::f64::consts::LN_2).abs() < 1e-6, "{without}");
    assert!(with - without > 1.0, "{with} {without}");
}
