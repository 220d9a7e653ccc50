//! GRPO against TRL (issue 39). On the fixed tensors of `fixtures/grpo/expected.json` (made by
//! `make_grpo_fixture.py` with TRL 1.16.0's own `GRPOTrainer._compute_loss`): for each
//! `loss_type`, with and without `beta`, with `epsilon_high`, on- and off-policy, in one
//! micro-batch and in two (gradient accumulation), our advantages, loss, gradient with respect
//! to the per-token log-probabilities and figures equal TRL's within 1e-6. Through a model
//! (`model.json`): the per-token log-probabilities of prompt + completion rows, the loss and
//! the gradients of four parameters equal TRL's on the HF fixture model within 1e-5.

mod common;
use common::assert_grads_equal_hf;
use common::rl::{close, empty_batch, fixtures, tensor};

use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_data::IGNORE_INDEX;
use qwen_burn_train::RunConfig;
use qwen_burn_train::config::{RlAlgorithm, RlConfig, RlLossType, ScaleRewards};
use qwen_burn_train::objective::rl::advantage::advantages;
use qwen_burn_train::objective::rl::loss::{TokenInputs, rl_loss, rl_units};
use qwen_burn_train::objective::rl::rollout::token_logps;
use qwen_burn_train::run::start::build_model;
use qwen_burn_train::step::input_tensors;
use serde_json::Value;

fn read(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

fn matrix(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn rl_config(case: &Value, max_len: usize) -> RlConfig {
    let name = case["loss_type"].as_str().unwrap();
    RlConfig {
        loss_type: [
            RlLossType::Grpo,
            RlLossType::Bnpo,
            RlLossType::DrGrpo,
            RlLossType::Dapo,
        ]
        .into_iter()
        .find(|l| l.as_str() == name)
        .unwrap(),
        beta: case["beta"].as_f64().unwrap(),
        epsilon: case["epsilon"].as_f64().unwrap(),
        epsilon_high: case["epsilon_high"].as_f64(),
        // The model case gives advantages directly: no scaling to read.
        scale_rewards: match case["scale_rewards"].as_str().unwrap_or("group") {
            "group" => ScaleRewards::Group,
            "batch" => ScaleRewards::Batch,
            _ => ScaleRewards::None,
        },
        max_new_tokens: max_len,
        ..RlConfig::default()
    }
}

#[test]
fn grpo_advantages_losses_gradients_and_figures_equal_trls() {
    let expected = read("grpo/expected.json");
    let device = Device::flex().autodiff();
    let (logps, old, reference, mask) = (
        matrix(&expected["logps"]),
        matrix(&expected["old"]),
        matrix(&expected["ref"]),
        matrix(&expected["mask"]),
    );
    let weights: Vec<f64> = expected["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_f64().unwrap())
        .collect();
    let rewards: Vec<f64> = matrix(&expected["rewards_per_func"])
        .iter()
        .map(|r| r.iter().zip(&weights).map(|(&x, w)| f64::from(x) * w).sum())
        .collect();
    let group = expected["group"].as_u64().unwrap() as usize;
    let max_len = expected["max_len"].as_u64().unwrap() as usize;
    let cases = expected["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 32);
    for case in cases {
        let cfg = rl_config(case, max_len);
        let what = format!(
            "{} beta {} eps_high {:?} {} accum {} on-policy {}",
            case["loss_type"],
            cfg.beta,
            cfg.epsilon_high,
            case["scale_rewards"],
            case["accum"],
            case["on_policy"]
        );
        let (adv, figures) = advantages(&rewards, group, cfg.scale_rewards, RlAlgorithm::Grpo);
        for (a, t) in adv.iter().zip(case["advantages"].as_array().unwrap()) {
            close(*a, t.as_f64().unwrap(), 1e-6, &format!("{what}: advantage"));
        }
        for (name, value) in figures {
            close(
                value,
                case[name].as_f64().unwrap(),
                1e-6,
                &format!("{what}: {name}"),
            );
        }
        let x = tensor(&logps, &device).require_grad();
        let accum = case["accum"].as_u64().unwrap() as usize;
        let rows = logps.len();
        let parts: Vec<std::ops::Range<usize>> = (0..accum)
            .map(|k| k * rows / accum..(k + 1) * rows / accum)
            .collect();
        let tokens = |r: &std::ops::Range<usize>| -> usize {
            mask[r.clone()]
                .iter()
                .flatten()
                .filter(|&&m| m > 0.0)
                .count()
        };
        let units: usize = parts
            .iter()
            .map(|r| rl_units(&cfg, r.len(), tokens(r)))
            .sum();
        let mut total = None;
        let mut sums: std::collections::BTreeMap<&str, (f64, f64)> = Default::default();
        for r in &parts {
            let on_policy = case["on_policy"].as_bool().unwrap();
            let inputs = TokenInputs {
                logps: x.clone().slice(r.clone()),
                old: (!on_policy).then(|| tensor(&old[r.clone()], &device)),
                reference: (cfg.beta > 0.0).then(|| tensor(&reference[r.clone()], &device)),
                mask: tensor(&mask[r.clone()], &device),
                advantages: Tensor::from_data(
                    TensorData::new(
                        adv[r.clone()].iter().map(|&a| a as f32).collect::<Vec<_>>(),
                        [r.len()],
                    ),
                    &device,
                ),
            };
            let (sum, figures) = rl_loss(&cfg, inputs);
            for f in figures {
                let e = sums.entry(f.name).or_default();
                e.0 += f.sum;
                e.1 += f.count;
            }
            let part = sum / units as f64;
            total = Some(match total {
                None => part,
                Some(t) => t + part,
            });
        }
        let total = total.unwrap();
        let value = f64::from(total.clone().into_scalar::<f32>());
        close(
            value,
            case["loss"].as_f64().unwrap(),
            1e-6,
            &format!("{what}: loss"),
        );
        let grads = total.backward();
        let ours: Vec<f32> = x.grad(&grads).unwrap().try_into_vec_as::<f32>().unwrap();
        let theirs = matrix(&case["grad"]).concat();
        let scale = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0, "{what}: a zero gradient compares nothing");
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * scale.max(1.0),
                "{what}: gradient [{i}] ours {a}, TRL {b}"
            );
        }
        // TRL averages each micro-batch's token mean; ours are token means over the step,
        // which agree in one micro-batch.
        if accum == 1 {
            let want = case["figures"].as_object().unwrap();
            for (name, (sum, count)) in &sums {
                let theirs = want[*name].as_f64().unwrap();
                close(sum / count, theirs, 1e-6, &format!("{what}: {name}"));
            }
            for name in [
                "kl",
                "clip_ratio/low_mean",
                "clip_ratio/high_mean",
                "clip_ratio/region_mean",
            ] {
                assert_eq!(
                    sums.contains_key(name),
                    want.contains_key(name),
                    "{what}: {name} logged by one side only"
                );
            }
        }
    }
}

#[test]
fn grpo_through_the_model_equals_trls_gradients() {
    let want = read("grpo/model.json");
    let device = Device::flex().autodiff();
    let mut config = RunConfig::load(&fixtures().join("dpo/policy.toml"), &[]).unwrap();
    config.training.seed = 11;
    let model = build_model(&config, &device).unwrap();
    let ints = |v: &Value| -> Vec<Vec<u32>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            })
            .collect()
    };
    let (prompts, completions) = (ints(&want["prompt_ids"]), ints(&want["completion_ids"]));
    let lengths: Vec<usize> = want["completion_lengths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let (b, p, c) = (prompts.len(), prompts[0].len(), completions[0].len());
    let t = p + c;
    let mut batch = empty_batch(b, t);
    // Completion token j sits at position p + j and is predicted at position p - 1 + j.
    let spread = |rows: &[Vec<f32>]| -> Vec<Vec<f32>> {
        rows.iter()
            .map(|r| {
                (0..t)
                    .map(|k| {
                        if k + 1 >= p && k + 1 - p < c {
                            r[k + 1 - p]
                        } else {
                            0.0
                        }
                    })
                    .collect()
            })
            .collect()
    };
    for r in 0..b {
        let ids: Vec<u32> = prompts[r].iter().chain(&completions[r]).copied().collect();
        for k in 0..t {
            let real = k < p + lengths[r];
            batch.inputs.push(ids[k]);
            batch.attention_mask.as_mut().unwrap().push(u8::from(real));
            batch.targets.push(if k + 1 >= p && k + 1 < p + lengths[r] {
                i64::from(ids[k + 1])
            } else {
                IGNORE_INDEX
            });
        }
    }
    let mask: Vec<Vec<f32>> = batch
        .targets
        .chunks(t)
        .map(|r| r.iter().map(|&x| f32::from(u8::from(x >= 0))).collect())
        .collect();
    let cfg = rl_config(&want, c);
    let (inputs_ids, am) = input_tensors(&batch, &device);
    let (hidden, _) = model.forward_hidden(inputs_ids, am, None);
    let (logps, _) = token_logps(&model, hidden, &batch, &device);
    // Our per-token log-probabilities equal the HF model's at every completion token.
    let ours: Vec<f32> = logps.clone().try_into_vec_as::<f32>().unwrap();
    let theirs = spread(&matrix(&want["logps"])).concat();
    for (i, (a, m)) in ours.iter().zip(mask.concat()).enumerate() {
        if m > 0.0 {
            assert!(
                (a - theirs[i]).abs() <= 1e-5 * theirs[i].abs().max(1.0),
                "logp [{i}]: {a} vs {}",
                theirs[i]
            );
        }
    }
    let adv: Vec<f32> = want["advantages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_f64().unwrap() as f32)
        .collect();
    let tokens = mask.iter().flatten().filter(|&&m| m > 0.0).count();
    let (sum, _) = rl_loss(
        &cfg,
        TokenInputs {
            logps,
            old: Some(tensor(&spread(&matrix(&want["old"])), &device)),
            reference: Some(tensor(&spread(&matrix(&want["ref"])), &device)),
            mask: tensor(&mask, &device),
            advantages: Tensor::from_data(TensorData::new(adv, [b]), &device),
        },
    );
    let loss = sum / rl_units(&cfg, b, tokens) as f64;
    close(
        f64::from(loss.clone().into_scalar::<f32>()),
        want["loss"].as_f64().unwrap(),
        1e-5,
        "loss through the model",
    );
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    assert_grads_equal_hf(&model, &grads, &want["grads"], "grpo");
}
