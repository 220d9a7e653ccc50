//! Advantages of a generation batch from its rewards, as TRL 1.16.0's `GRPOTrainer` computes
//! them (`multi_objective_aggregation = "sum_then_normalize"`), and nanochat's.

use crate::config::{RlAlgorithm, ScaleRewards};

/// The advantages of `rewards` (weighted sums, grouped: `group` consecutive rows share a
/// prompt) and the figures TRL logs about them: `reward` (mean), `reward_std` (over the batch),
/// `frac_reward_zero_std` (the share of rows whose scaling std is zero).
pub fn advantages(
    rewards: &[f64],
    group: usize,
    scale: ScaleRewards,
    algorithm: RlAlgorithm,
) -> (Vec<f64>, [(&'static str, f64); 3]) {
    let n = rewards.len();
    let group = group.max(1);
    let batch_std = std(rewards);
    let mut out = Vec::with_capacity(n);
    let mut zero_std = 0usize;
    for g in rewards.chunks(group) {
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let s = match scale {
            ScaleRewards::Group | ScaleRewards::None => std(g),
            ScaleRewards::Batch => batch_std,
        };
        if s.abs() <= 1e-8 {
            zero_std += g.len();
        }
        for &r in g {
            out.push(match (algorithm, scale) {
                // nanochat: reward minus the group mean, unscaled.
                (RlAlgorithm::Reinforce, _) | (_, ScaleRewards::None) => r - mean,
                _ => (r - mean) / (s + 1e-4),
            });
        }
    }
    let mean = rewards.iter().sum::<f64>() / n.max(1) as f64;
    let figures = [
        ("reward", mean),
        ("reward_std", batch_std),
        ("frac_reward_zero_std", zero_std as f64 / n.max(1) as f64),
    ];
    (out, figures)
}

/// The sample standard deviation (Bessel's correction, as torch and TRL's `nanstd`); 0 for
/// fewer than 2 values.
pub fn std(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 0.0;
    }
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (x.len() - 1) as f64;
    var.sqrt()
}
