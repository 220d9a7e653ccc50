//! The policy losses of an RL step on per-token log-probabilities, as TRL 1.16.0's
//! `GRPOTrainer._compute_loss` computes them (token-level importance sampling), and nanochat's
//! REINFORCE.
//!
//! Per completion token, with `r = exp(logp - old)` (`old`: the log-probabilities at
//! generation; the current ones, detached, when the batch is used once) and `A` the sequence's
//! advantage: `grpo`: `-min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A)`, plus
//! `beta * r * (exp(ref - logp) - (ref - logp) - 1)` with a reference (TRL's k3 estimator with
//! its bias correction); `reinforce`: `-A logp`. How the tokens' losses are averaged is
//! `rl.loss_type` (see [`RlLossType`]): [`rl_units`] and [`rl_loss`] split it into a micro-batch
//! sum and the step's units, so that `k` micro-batches give TRL's loss under `k`-step
//! gradient accumulation.

use burn::tensor::Tensor;

use crate::config::{RlAlgorithm, RlConfig, RlLossType};
use crate::objective::Figure;

/// Per-token inputs of one micro-batch (`[rows, T]`, `T` the longest completion).
pub struct TokenInputs {
    /// The policy's log-probabilities of the completion tokens (differentiated).
    pub logps: Tensor<2>,
    /// Those at generation (`rl.num_iterations > 1`); `None`: the current ones, detached.
    pub old: Option<Tensor<2>>,
    /// The reference's (`rl.beta > 0`).
    pub reference: Option<Tensor<2>>,
    /// 1 on completion tokens, 0 on padding.
    pub mask: Tensor<2>,
    /// Each row's advantage, `[rows]`.
    pub advantages: Tensor<1>,
}

/// What the step's loss of a micro-batch is averaged over (see [`rl_loss`]): its completion
/// tokens (`dapo`, `reinforce`) or its rows.
pub fn rl_units(config: &RlConfig, rows: usize, tokens: usize) -> usize {
    match (config.algorithm, config.loss_type) {
        (RlAlgorithm::Reinforce, _) | (_, RlLossType::Dapo) => tokens,
        _ => rows,
    }
}

/// The micro-batch's loss summed over its [`rl_units`] (the step divides by the units of all
/// its micro-batches), and the figures TRL logs: `kl`, `clip_ratio/low_mean`,
/// `clip_ratio/high_mean`, `clip_ratio/region_mean`, token means over the step.
pub fn rl_loss(config: &RlConfig, inputs: TokenInputs) -> (Tensor<1>, Vec<Figure>) {
    let TokenInputs {
        logps,
        old,
        reference,
        mask,
        advantages,
    } = inputs;
    let [rows, _] = logps.dims();
    let adv = advantages.unsqueeze_dim::<2>(1);
    let mut figures = Vec::new();
    let token_mean = |name, x: Tensor<2>, mask: &Tensor<2>| Figure {
        name,
        sum: scalar(x.mul(mask.clone()).sum()),
        count: scalar(mask.clone().sum()),
    };
    let per_token = match config.algorithm {
        RlAlgorithm::Reinforce => logps.mul(adv).neg(),
        RlAlgorithm::Grpo => {
            let old = old.unwrap_or_else(|| logps.clone().detach());
            let ratio = (logps.clone() - old).exp();
            let (low, high) = (1.0 - config.epsilon, 1.0 + config.epsilon_high());
            let clipped = ratio.clone().clamp(low, high);
            let mut loss = ratio
                .clone()
                .mul(adv.clone())
                .min_pair(clipped.mul(adv.clone()))
                .neg();
            if let Some(reference) = reference.filter(|_| config.beta != 0.0) {
                let d = reference - logps.clone();
                let kl = (d.clone().exp() - d).sub_scalar(1.0);
                let kl = kl.mul(ratio.clone());
                figures.push(token_mean("kl", kl.clone().detach(), &mask));
                loss = loss + kl.mul_scalar(config.beta);
            }
            let r = ratio.detach();
            let negative = adv.clone().lower_elem(0.0).float();
            let positive = adv.greater_elem(0.0).float();
            let is_low = r.clone().lower_elem(low).float().mul(negative);
            let is_high = r.greater_elem(high).float().mul(positive);
            let region = (is_low.clone() + is_high.clone()).clamp_max(1.0);
            figures.push(token_mean("clip_ratio/low_mean", is_low, &mask));
            figures.push(token_mean("clip_ratio/high_mean", is_high, &mask));
            figures.push(token_mean("clip_ratio/region_mean", region, &mask));
            loss
        }
    };
    let masked = per_token.mul(mask.clone());
    let sum = match (config.algorithm, config.loss_type) {
        (RlAlgorithm::Reinforce, _) | (_, RlLossType::Dapo) => masked.sum(),
        (_, RlLossType::Grpo) => {
            let lengths = mask.sum_dim(1).clamp_min(1.0);
            (masked.sum_dim(1) / lengths).sum()
        }
        (_, RlLossType::Bnpo) => {
            let tokens = mask.sum().clamp_min(1.0);
            (masked.sum() / tokens).mul_scalar(rows as f64)
        }
        (_, RlLossType::DrGrpo) => masked.sum().div_scalar(config.max_new_tokens as f64),
    };
    (sum, figures)
}

fn scalar(t: Tensor<1>) -> f64 {
    t.try_into_scalar::<f32>().map_or(f64::NAN, f64::from)
}

/// [`rl_loss`] from each row's summed completion log-probability, for the cases where only
/// those sums matter: REINFORCE, and GRPO on-policy (the ratio is the current
/// log-probabilities over themselves detached, 1 at every token, so nothing is clipped) without
/// a KL term. Then the per-token loss `-A r` has the value `-A` and the gradient `-A ∇logp`, so
/// a row's tokens together contribute `-A (n + s - detach(s))` with `s` the row's summed
/// log-probability and `n` its completion tokens: the same value and gradient as [`rl_loss`]
/// without the `[rows, T, vocab]` log-softmax (the sums come from the fused LM head +
/// cross-entropy). The clip figures are 0, as they are there.
pub fn rl_loss_rows(
    config: &RlConfig,
    sums: Tensor<1>,
    tokens: &[f64],
    advantages: Tensor<1>,
) -> (Tensor<1>, Vec<Figure>) {
    let device = sums.device();
    let [rows] = sums.dims();
    let n = Tensor::<1>::from_data(
        burn::tensor::TensorData::new(tokens.iter().map(|&x| x as f32).collect::<Vec<_>>(), [rows]),
        &device,
    );
    let total: f64 = tokens.iter().sum();
    if config.algorithm == RlAlgorithm::Reinforce {
        return ((sums * advantages).neg().sum(), Vec::new());
    }
    let per_row = (n.clone() + sums.clone() - sums.detach())
        .mul(advantages)
        .neg();
    let sum = match config.loss_type {
        RlLossType::Dapo => per_row.sum(),
        RlLossType::Grpo => (per_row / n.clamp_min(1.0)).sum(),
        RlLossType::Bnpo => per_row
            .sum()
            .div_scalar(total.max(1.0))
            .mul_scalar(rows as f64),
        RlLossType::DrGrpo => per_row.sum().div_scalar(config.max_new_tokens as f64),
    };
    let zero = |name| Figure {
        name,
        sum: 0.0,
        count: total,
    };
    let figures = vec![
        zero("clip_ratio/low_mean"),
        zero("clip_ratio/high_mean"),
        zero("clip_ratio/region_mean"),
    ];
    (sum, figures)
}
