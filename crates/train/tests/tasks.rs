//! Multiple-choice evaluation against HF transformers: on the committed fixture models (dense
//! and MoE) and a task file per layout, the prompts, the split of context and continuation into
//! tokens (lm-evaluation-harness's `_encode_pair`), every choice's log-likelihood (within 1e-4)
//! and acc / acc_norm with their standard errors equal what
//! `tests/fixtures/mc/make_mc_fixtures.py` computed with transformers, on the Flex device
//! (fused kernels, KV-cached context) and on NdArray (composed ops).
#![allow(deprecated)] // Device::ndarray: burn-ndarray is deprecated upstream but still supported.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use qwen_burn_data::{Tok, read_task};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_train::eval::tasks::{TaskOptions, choice_logliks, evaluate_task};
use serde_json::Value;

/// Summed log-likelihood tolerance (f32 logits on both sides; sums of up to ~10 tokens).
const LOGLIK_TOL: f64 = 1e-4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mc")
}

fn model(name: &str, device: &Device) -> Qwen3ForCausalLM {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures")
        .join(name);
    Qwen3ForCausalLM::from_pretrained(&dir, device).expect("fixture model loads")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check(model_name: &str, device: &Device) {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    let tok = Tok::from_file(&fixtures().join("tokenizer.json")).unwrap();
    let model = model(model_name, device);
    let layouts = expected["models"][model_name].as_object().unwrap();
    assert_eq!(layouts.len(), 5, "one task per layout");
    let mut worst = 0.0f64;
    for (layout, want) in layouts {
        let task = read_task(&fixtures().join(format!("{layout}.jsonl"))).unwrap();
        assert_eq!(task.layout.name(), layout);
        let opts = TaskOptions {
            shots: 0,
            limit: None,
            seed: 1234,
            batch: 2,
        };
        let (result, scores) = evaluate_task(&model, &tok, &task, &opts, device, |_| {}).unwrap();
        let questions = want["questions"].as_array().unwrap();
        assert_eq!(scores.len(), questions.len());
        for (got, q) in scores.iter().zip(questions) {
            let at = format!("{model_name} {layout} question {}", got.index);
            assert_eq!(got.encoded.context, q["context"].as_str().unwrap(), "{at}");
            let conts: Vec<&str> = q["continuations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            assert_eq!(got.encoded.continuations, conts, "{at}");
            assert_eq!(got.encoded.context_ids, ids(&q["context_ids"]), "{at}");
            let cont_ids: Vec<Vec<u32>> = q["continuation_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(ids)
                .collect();
            assert_eq!(got.encoded.continuation_ids, cont_ids, "{at}");
            assert_eq!(got.gold as u64, q["gold"].as_u64().unwrap(), "{at}");
            for (j, (ours, theirs)) in got
                .loglik
                .iter()
                .zip(q["loglik"].as_array().unwrap())
                .enumerate()
            {
                let theirs = theirs.as_f64().unwrap();
                let diff = (ours - theirs).abs();
                worst = worst.max(diff);
                assert!(
                    diff <= LOGLIK_TOL,
                    "{at} choice {j}: loglik {ours} vs HF {theirs} (diff {diff:.2e})"
                );
            }
        }
        for key in [
            "acc",
            "acc_norm",
            "acc_bytes",
            "acc_stderr",
            "acc_norm_stderr",
            "acc_bytes_stderr",
        ] {
            let ours = match key {
                "acc" => result.acc,
                "acc_norm" => result.acc_norm,
                "acc_bytes" => result.acc_bytes,
                "acc_stderr" => result.acc_stderr,
                "acc_norm_stderr" => result.acc_norm_stderr,
                _ => result.acc_bytes_stderr,
            };
            let theirs = want[key].as_f64().unwrap();
            assert!(
                (ours - theirs).abs() < 1e-12,
                "{model_name} {layout} {key}: {ours} vs {theirs}"
            );
        }
    }
    eprintln!("{model_name}: worst |loglik - HF| = {worst:.2e}");
}

#[test]
fn dense_matches_hf_on_flex() {
    check("dense", &Device::flex());
}

#[test]
fn moe_matches_hf_on_flex() {
    check("moe", &Device::flex());
}

#[test]
fn dense_matches_hf_on_ndarray() {
    check("dense", &Device::ndarray());
}

#[test]
fn moe_matches_hf_on_ndarray() {
    check("moe", &Device::ndarray());
}

/// The cached context plus batched choices gives what one full forward over context + choice
/// gives, also when the context must lose tokens on the left to fit the model.
#[test]
fn cached_context_equals_full_forwards_and_truncates_on_the_left() {
    let device = Device::flex();
    let model = model("dense", &device);
    let max = model.config.max_position_embeddings; // 64
    let context: Vec<u32> = (0..70).map(|i| (i * 7 + 3) % 128).collect();
    let choices = vec![vec![5u32, 9, 11], vec![17u32], vec![2u32, 4]];
    let (logliks, dropped) = choice_logliks(&model, &context, &choices, &device).unwrap();
    // The longest choice (3 tokens) leaves 61 context positions: 9 dropped.
    assert_eq!(dropped, 70 - (max - 3));
    for (choice, ours) in choices.iter().zip(&logliks) {
        let kept = &context[dropped..];
        let (alone, _) =
            choice_logliks(&model, kept, std::slice::from_ref(choice), &device).unwrap();
        assert!((alone[0] - ours).abs() < 1e-4, "{} vs {ours}", alone[0]);
        // By hand: one forward over the whole row, summing the log-probabilities.
        let row: Vec<i64> = kept.iter().chain(choice).map(|&i| i64::from(i)).collect();
        let n = row.len();
        let input = burn::tensor::Tensor::<2, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(row.clone(), [1, n]),
            &device,
        );
        let logp: Vec<f32> =
            burn::tensor::activation::log_softmax(model.forward(input, None, None).logits, 2)
                .try_into_vec_as::<f32>()
                .unwrap();
        let vocab = model.config.vocab_size;
        let by_hand: f64 = (0..choice.len())
            .map(|j| {
                let pos = kept.len() - 1 + j;
                f64::from(logp[pos * vocab + choice[j] as usize])
            })
            .sum();
        assert!((by_hand - ours).abs() < 1e-4, "{by_hand} vs {ours}");
    }
    // A continuation as long as the model's positions is refused, not truncated.
    let long = vec![vec![1u32; max]];
    let err = choice_logliks(&model, &context, &long, &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("leaves no room for its context"), "{err}");
}
