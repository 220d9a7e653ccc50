//! The RL loss's two paths and its temperature (issue 39), through a model: on-policy without
//! a KL term the row-sum path (the fused head's) equals the per-token path, values and
//! gradients, for every loss type and REINFORCE; and the per-token log-probabilities are taken
//! at the sampling temperature.

mod common;
use common::rl::{close, empty_batch, fixtures, tensor};

use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_data::{Batch, IGNORE_INDEX};
use qwen_burn_train::RunConfig;
use qwen_burn_train::config::{RlAlgorithm, RlConfig, RlLossType};
use qwen_burn_train::objective::preference::sequence_logps;
use qwen_burn_train::objective::rl::loss::{TokenInputs, rl_loss, rl_loss_rows};
use qwen_burn_train::objective::rl::rollout::{host_token_logps, token_logps};
use qwen_burn_train::run::start::build_model;
use qwen_burn_train::step::input_tensors;

/// On-policy without a KL term, the loss from each row's summed log-probability (the fused
/// head's path) equals the per-token loss, value and gradients, for every loss type and
/// REINFORCE, through the model.
#[test]
fn the_row_sum_path_equals_the_per_token_path_on_policy() {
    let device = Device::flex().autodiff();
    let mut config = RunConfig::load(&fixtures().join("dpo/policy.toml"), &[]).unwrap();
    config.training.seed = 11;
    let model = build_model(&config, &device).unwrap();
    // Rows of 10 positions: a 3-token prompt, then completions of 6, 2, 5 and 4 tokens.
    let (b, t, p) = (4usize, 10usize, 3usize);
    let lengths = [6usize, 2, 5, 4];
    let mut batch = empty_batch(b, t);
    for (r, &len) in lengths.iter().enumerate() {
        let ids: Vec<u32> = (0..t)
            .map(|k| ((r * 37 + k * 11) % 100) as u32 + 1)
            .collect();
        for k in 0..t {
            batch.inputs.push(ids[k]);
            batch
                .attention_mask
                .as_mut()
                .unwrap()
                .push(u8::from(k < p + len));
            batch.targets.push(if k + 1 >= p && k + 1 < p + len {
                i64::from(ids[k + 1])
            } else {
                IGNORE_INDEX
            });
        }
    }
    let tokens: Vec<f64> = batch
        .targets
        .chunks(t)
        .map(|r| r.iter().filter(|&&x| x >= 0).count() as f64)
        .collect();
    assert_eq!(tokens, [6.0, 2.0, 5.0, 4.0]);
    let mask: Vec<Vec<f32>> = batch
        .targets
        .chunks(t)
        .map(|r| r.iter().map(|&x| f32::from(u8::from(x >= 0))).collect())
        .collect();
    let adv =
        || Tensor::<1>::from_data(TensorData::new(vec![0.7f32, -1.2, 0.4, 0.3], [b]), &device);
    let forward = || {
        let (ids, am) = input_tensors(&batch, &device);
        model.forward_hidden(ids, am, None).0
    };
    for (algorithm, loss_type) in [
        (RlAlgorithm::Grpo, RlLossType::Dapo),
        (RlAlgorithm::Grpo, RlLossType::Grpo),
        (RlAlgorithm::Grpo, RlLossType::Bnpo),
        (RlAlgorithm::Grpo, RlLossType::DrGrpo),
        (RlAlgorithm::Reinforce, RlLossType::Dapo),
    ] {
        let cfg = RlConfig {
            algorithm,
            loss_type,
            max_new_tokens: 6,
            ..RlConfig::default()
        };
        let (logps, _) = token_logps(&model, forward(), &batch, &device);
        let (per_token, _) = rl_loss(
            &cfg,
            TokenInputs {
                logps,
                old: None,
                reference: None,
                mask: tensor(&mask, &device),
                advantages: adv(),
            },
        );
        let sums = sequence_logps(&model, forward(), &batch, &device);
        let (rows, _) = rl_loss_rows(&cfg, sums, &tokens, adv());
        let what = format!("{algorithm:?} {}", loss_type.as_str());
        let (a, r) = (
            f64::from(per_token.clone().into_scalar::<f32>()),
            f64::from(rows.clone().into_scalar::<f32>()),
        );
        close(r, a, 1e-5, &format!("{what}: value"));
        let (ga, gr) = (
            GradientsParams::from_grads(per_token.backward(), &model),
            GradientsParams::from_grads(rows.backward(), &model),
        );
        let (worst, count) = common::worst_grad_diff(&model, &ga, &gr);
        assert!(
            count > 0 && worst <= 1e-5,
            "{what}: gradients differ by {worst}"
        );
    }
}

/// The old and reference log-probabilities (and the loss's, through the same [`tempered`]) are
/// those of the sampling distribution, the logits divided by `rl.temperature`, as TRL's
/// `GRPOTrainer` takes them: against the composed `log_softmax(logits / T)` of the model's own
/// forward, and different from the untempered ones.
#[test]
fn rl_log_probabilities_are_taken_at_the_sampling_temperature() {
    use burn::tensor::activation::log_softmax;
    let device = Device::flex();
    let mut config = RunConfig::load(&fixtures().join("dpo/policy.toml"), &[]).unwrap();
    config.training.seed = 11;
    let model = build_model(&config, &device).unwrap();
    let vocab = model.config.vocab_size;
    let (b, t) = (2usize, 6usize);
    let inputs: Vec<u32> = (0..b * t).map(|i| (i * 7 % vocab) as u32).collect();
    let targets: Vec<i64> = (0..b * t)
        .map(|i| {
            if i % t >= 2 {
                ((i * 5 + 3) % vocab) as i64
            } else {
                IGNORE_INDEX
            }
        })
        .collect();
    let batch = Batch {
        batch_size: b,
        seq_len: t,
        inputs,
        targets: targets.clone(),
        attention_mask: Some(vec![1; b * t]),
        positions: None,
        pairs: None,
    };
    let (ids, _) = input_tensors(&batch, &device);
    let logits = model.forward(ids, None, None).logits;
    for temperature in [0.7, 1.0, 1.6] {
        let ours = host_token_logps(&model, &batch, temperature).unwrap();
        let composed = log_softmax(logits.clone().div_scalar(temperature), 2)
            .try_into_vec_as::<f32>()
            .unwrap();
        let untempered = log_softmax(logits.clone(), 2)
            .try_into_vec_as::<f32>()
            .unwrap();
        for (k, &target) in targets.iter().enumerate() {
            if target < 0 {
                continue;
            }
            let want = composed[k * vocab + target as usize];
            assert!(
                (ours[k] - want).abs() <= 1e-5 * want.abs().max(1.0),
                "temperature {temperature}, token {k}: {} vs {want}",
                ours[k]
            );
            let plain = untempered[k * vocab + target as usize];
            if temperature != 1.0 {
                assert!(
                    (ours[k] - plain).abs() > 1e-4,
                    "temperature {temperature} changed nothing"
                );
            }
        }
    }
}
