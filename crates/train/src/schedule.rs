//! Learning-rate schedule: linear warmup, then cosine / linear / constant decay to `min_lr`.
//!
//! A pure function of the step (no scheduler state to save), so a resumed run gets the same
//! learning rates by construction. Burn's `SequentialLrScheduler` is stateful and its cosine
//! scheduler rejects learning rates above 1; this is the nanoGPT `get_lr` with the same shape
//! as HF's `get_cosine_schedule_with_warmup` plus a floor.

use crate::config::{Decay, OptimizerConfig, ScheduleConfig};

/// Learning rate of optimizer step `step` (0-based) of a run of `max_steps` steps.
pub fn learning_rate(
    step: usize,
    max_steps: usize,
    opt: &OptimizerConfig,
    sched: &ScheduleConfig,
) -> f64 {
    let (peak, floor) = (opt.lr, sched.min_lr);
    // A run shorter than its warmup clips the warmup (the config prints a warning).
    let warmup = sched.warmup_steps.min(max_steps);
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let decay_steps = max_steps.saturating_sub(warmup).max(1);
    let progress = ((step - warmup) as f64 / decay_steps as f64).min(1.0);
    match sched.decay {
        Decay::Constant => peak,
        Decay::Linear => floor + (peak - floor) * (1.0 - progress),
        Decay::Cosine => {
            floor + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (peak - floor)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let opt = OptimizerConfig {
            lr: 1.0,
            ..OptimizerConfig::default()
        };
        let sched = ScheduleConfig {
            warmup_steps: 10,
            min_lr: 0.1,
            decay: Decay::Cosine,
        };
        assert!((learning_rate(0, 110, &opt, &sched) - 0.1).abs() < 1e-12);
        assert!((learning_rate(9, 110, &opt, &sched) - 1.0).abs() < 1e-12);
        assert!((learning_rate(10, 110, &opt, &sched) - 1.0).abs() < 1e-12);
        assert!((learning_rate(60, 110, &opt, &sched) - 0.55).abs() < 1e-12);
        assert!((learning_rate(110, 110, &opt, &sched) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn a_run_shorter_than_its_warmup_clips_the_warmup() {
        let opt = OptimizerConfig {
            lr: 1.0,
            ..OptimizerConfig::default()
        };
        let sched = ScheduleConfig {
            warmup_steps: 30,
            min_lr: 0.1,
            decay: Decay::Cosine,
        };
        // 16 steps: warmup over all 16, peak at the last one, never above the peak.
        let lrs: Vec<f64> = (0..16)
            .map(|s| learning_rate(s, 16, &opt, &sched))
            .collect();
        assert!((lrs[0] - 1.0 / 16.0).abs() < 1e-12);
        assert!((lrs[15] - 1.0).abs() < 1e-12);
        assert!(lrs.windows(2).all(|w| w[0] < w[1]));
    }
}
