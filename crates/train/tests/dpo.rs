//! DPO against TRL (issue 38): on the pairs and models of `fixtures/dpo` (made by
//! `make_dpo_fixture.py` with TRL 1.16.0's `DPOTrainer`, and its CPO and ORPO trainers' loss
//! functions), each loss (sigmoid, hinge, ipo, robust, simpo, orpo, and sigmoid plus TRL's
//! "sft" term weighted 0.5: `preference.sft_weight`), its reward and
//! log-probability figures (and ORPO's), and its gradients with respect to four parameters
//! equal TRL's within 1e-5 (relative to their scale), for a dense model and an MoE one (router
//! gradients included).

mod common;
use common::assert_grads_equal_hf;

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::Device;
use qwen_burn_data::{ChatTemplate, Tok, Truncation, load_preferences};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_train::RunConfig;
use qwen_burn_train::config::{PreferenceConfig, PreferenceLoss};
use qwen_burn_train::objective::preference::{Preference, batch_logps};
use qwen_burn_train::run::start::build_model;
use qwen_burn_train::step::Step;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dpo")
}

fn model(file: &str, seed: u64, device: &Device) -> Qwen3ForCausalLM {
    let mut config = RunConfig::load(&fixtures().join(file), &[]).unwrap();
    config.training.seed = seed;
    build_model(&config, device).unwrap()
}

#[test]
fn dpo_losses_figures_and_gradients_equal_trls_dense() {
    check("policy.toml", "expected.json");
}

#[test]
fn dpo_losses_figures_and_gradients_equal_trls_moe() {
    check("moe.toml", "expected_moe.json");
}

fn check(config: &str, fixture: &str) {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join(fixture)).unwrap()).unwrap();
    let device = Device::flex().autodiff();
    let policy = model(config, 11, &device);
    let reference = model(config, 12, &device).valid();
    let tok = Tok::from_file(&fixtures().join("../../../../../datasets/tokenizer.json")).unwrap();
    let data = load_preferences(
        &fixtures().join("pairs.jsonl"),
        &tok,
        &ChatTemplate::chatml(),
        "<|endoftext|>",
        None,
        Truncation::KeepStart,
    )
    .unwrap();
    let n = data.pairs.len();
    let pad = tok.require_eos().unwrap();
    // Rows as long as the longest sequence, as TRL's collator pads them (and training does).
    let all: Vec<usize> = (0..n).collect();
    let batch = data.batch_to_longest(&all, 10_000, pad, 0);
    let ref_logps = batch_logps(&reference, &batch, &device.clone().without_autodiff()).unwrap();
    // Padding beyond the longest sequence changes no figure: rows of 24 more tokens give the
    // same log-probabilities (f32 sums in another blocking: within 1e-5 of their scale).
    let padded = data.batch(&all, batch.seq_len + 24, pad, 0);
    let padded_logps =
        batch_logps(&reference, &padded, &device.clone().without_autodiff()).unwrap();
    for (a, b) in ref_logps.iter().zip(&padded_logps) {
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} vs {b}");
    }
    let table: Vec<[f64; 2]> = (0..n).map(|i| [ref_logps[i], ref_logps[n + i]]).collect();
    let beta = expected["beta"].as_f64().unwrap();
    for (name, kind) in [
        ("sigmoid", PreferenceLoss::Sigmoid),
        ("hinge", PreferenceLoss::Hinge),
        ("ipo", PreferenceLoss::Ipo),
        ("robust", PreferenceLoss::Robust),
        ("simpo", PreferenceLoss::Simpo),
        ("orpo", PreferenceLoss::Orpo),
        ("sigmoid_sft", PreferenceLoss::Sigmoid),
    ] {
        let want = &expected["losses"][name];
        assert!(want.is_object(), "{name} missing from {fixture}");
        let config = PreferenceConfig {
            loss: kind,
            beta: want["beta"].as_f64().unwrap_or(beta),
            label_smoothing: want["label_smoothing"].as_f64().unwrap(),
            sft_weight: want["sft_weight"].as_f64().unwrap_or(0.0),
            ..PreferenceConfig::default()
        };
        // The reference-free losses must not need the table: give them none.
        let objective = if kind.needs_reference() {
            Preference::with_reference(config, table.clone())
        } else {
            Preference::new(config)
        };
        let step = Step {
            objective: &objective,
            checkpoint_layers: false,
            bitwise: false,
        };
        let (grads, stats) = step
            .run(&policy, std::slice::from_ref(&batch), &device)
            .unwrap();
        // TRL's MoE loss adds `router_aux_loss_coef * aux_loss` (its `aux_loss` figure); ours
        // logs the objective's loss and the aux loss apart, and differentiates their sum too.
        let aux = match &policy.config.moe {
            Some(moe) => {
                let ours = stats.aux_loss.expect("an MoE step's aux loss");
                let theirs = want["metrics"]["aux_loss"].as_f64().unwrap();
                assert!(
                    (ours - theirs).abs() <= 1e-5 * theirs.abs(),
                    "{name}: aux {ours} vs TRL {theirs}"
                );
                moe.router_aux_loss_coef * ours
            }
            None => 0.0,
        };
        let loss = want["loss"].as_f64().unwrap();
        let ours = stats.loss + aux;
        assert!(
            (ours - loss).abs() <= 1e-5 * loss.abs().max(1.0),
            "{name}: loss {ours} vs TRL {loss}"
        );
        let figures = stats.figure_means();
        for key in [
            "rewards/chosen",
            "rewards/rejected",
            "rewards/margins",
            "rewards/accuracies",
            "logps/chosen",
            "logps/rejected",
            "nll_loss",
            "log_odds_ratio",
            "log_odds_chosen",
        ] {
            let Some(theirs) = want["metrics"][key].as_f64() else {
                assert!(!figures.contains_key(key), "{name}: {key} is not TRL's");
                continue;
            };
            let ours = *figures
                .get(key)
                .unwrap_or_else(|| panic!("{name}: no {key} among {figures:?}"));
            assert!(
                (ours - theirs).abs() <= 1e-5 * theirs.abs().max(1.0),
                "{name}: {key} {ours} vs TRL {theirs}"
            );
        }
        assert_grads_equal_hf(&policy, &grads, &want["grads"], name);
    }
}
