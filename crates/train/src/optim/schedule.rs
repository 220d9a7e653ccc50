//! Learning-rate schedule: linear warmup, then cosine / linear / constant decay to `min_lr`, or
//! warmup-stable-decay (WSD): the peak until the last `decay_fraction` of the run, then a
//! linear, cosine or `1 - sqrt` decay that reaches `min_lr` at the last step.
//!
//! A pure function of the step (no scheduler state to save), so a resumed run gets the same
//! learning rates by construction. Burn's `SequentialLrScheduler` is stateful and its cosine
//! scheduler rejects learning rates above 1; this is the nanoGPT `get_lr` with the same shape
//! as HF's `get_cosine_schedule_with_warmup` plus a floor.

use crate::config::{Decay, DecayShape, OptimizerConfig, ScheduleConfig};

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
    if sched.decay == Decay::Wsd {
        // The decay takes the last `decay_steps` steps (never the warmup's); its first step is
        // already below the peak and its last one is `min_lr`.
        let decay_steps = wsd_decay_steps(max_steps, sched).min(max_steps - warmup);
        let start = max_steps - decay_steps;
        if step < start || decay_steps == 0 {
            return peak;
        }
        let progress = ((step - start + 1) as f64 / decay_steps as f64).min(1.0);
        let left = match sched.decay_shape {
            DecayShape::Linear => 1.0 - progress,
            DecayShape::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
            DecayShape::Sqrt => 1.0 - progress.sqrt(),
        };
        return floor + (peak - floor) * left;
    }
    let decay_steps = max_steps.saturating_sub(warmup).max(1);
    let progress = ((step - warmup) as f64 / decay_steps as f64).min(1.0);
    match sched.decay {
        Decay::Constant | Decay::Wsd => peak,
        Decay::Linear => floor + (peak - floor) * (1.0 - progress),
        Decay::Cosine => {
            floor + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (peak - floor)
        }
    }
}

/// Steps of a WSD run's final decay: `decay_fraction` of the run, rounded, at least one.
pub fn wsd_decay_steps(max_steps: usize, sched: &ScheduleConfig) -> usize {
    ((max_steps as f64 * sched.decay_fraction).round() as usize).clamp(1, max_steps.max(1))
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
            ..ScheduleConfig::default()
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
            ..ScheduleConfig::default()
        };
        // 16 steps: warmup over all 16, peak at the last one, never above the peak.
        let lrs: Vec<f64> = (0..16)
            .map(|s| learning_rate(s, 16, &opt, &sched))
            .collect();
        assert!((lrs[0] - 1.0 / 16.0).abs() < 1e-12);
        assert!((lrs[15] - 1.0).abs() < 1e-12);
        assert!(lrs.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn wsd_holds_the_peak_then_decays_to_min_lr_at_the_last_step() {
        let opt = OptimizerConfig {
            lr: 1.0,
            ..OptimizerConfig::default()
        };
        for (shape, quarter) in [
            (DecayShape::Linear, 0.75),
            (
                DecayShape::Cosine,
                0.5 * (1.0 + (std::f64::consts::PI / 4.0).cos()),
            ),
            (DecayShape::Sqrt, 0.5),
        ] {
            let sched = ScheduleConfig {
                warmup_steps: 10,
                min_lr: 0.0,
                decay: Decay::Wsd,
                decay_fraction: 0.2,
                decay_shape: shape,
            };
            let lr = |s| learning_rate(s, 100, &opt, &sched);
            // Warmup 0..9, stable 9..79, decay over the last 20 steps 80..99.
            assert!((lr(0) - 0.1).abs() < 1e-12);
            assert_eq!(lr(9), 1.0);
            assert_eq!(lr(10), 1.0);
            assert_eq!(lr(79), 1.0, "{shape:?}: the last stable step");
            assert!(
                lr(80) < 1.0,
                "{shape:?}: the first decay step is below the peak"
            );
            // Progress 5/20 = 0.25 at step 84.
            assert!((lr(84) - quarter).abs() < 1e-12, "{shape:?}: {}", lr(84));
            assert_eq!(lr(99), 0.0, "{shape:?}: min_lr at the last step");
            let decaying: Vec<f64> = (79..100).map(lr).collect();
            assert!(decaying.windows(2).all(|w| w[1] < w[0]), "{shape:?}");
        }
        // A floor, and a decay fraction larger than what the warmup leaves.
        let sched = ScheduleConfig {
            warmup_steps: 10,
            min_lr: 0.25,
            decay: Decay::Wsd,
            decay_fraction: 1.0,
            decay_shape: DecayShape::Linear,
        };
        assert_eq!(learning_rate(9, 20, &opt, &sched), 1.0);
        assert!((learning_rate(14, 20, &opt, &sched) - (0.25 + 0.75 * 0.5)).abs() < 1e-12);
        assert_eq!(learning_rate(19, 20, &opt, &sched), 0.25);
    }
}
