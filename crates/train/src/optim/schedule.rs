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

/// A schedule: the learning rate's settings and the run's length.
pub struct Schedule<'a> {
    pub max_steps: usize,
    pub optimizer: &'a OptimizerConfig,
    pub schedule: &'a ScheduleConfig,
}

impl Schedule<'_> {
    fn lr(&self, step: usize) -> f64 {
        learning_rate(step, self.max_steps, self.optimizer, self.schedule)
    }

    /// The first step (0-based) of a WSD run's decay; None for the other schedules.
    fn decay_start(&self) -> Option<usize> {
        (self.schedule.decay == Decay::Wsd).then(|| {
            let warmup = self.schedule.warmup_steps.min(self.max_steps);
            let steps = wsd_decay_steps(self.max_steps, self.schedule).min(self.max_steps - warmup);
            self.max_steps - steps
        })
    }
}

/// A branch taken after `step` steps of `parent` continues under `child`'s schedule: the
/// warning to print when `child`'s learning rate at that point (its last step, `step - 1`)
/// is not the one the parent trained with, which would make the learning rate jump at the
/// branch. The usual WSD branch (from the stable phase, into a decay that starts after the
/// branch point) gives none.
pub fn branch_lr_warning(
    step: usize,
    parent: &Schedule<'_>,
    child: &Schedule<'_>,
) -> Option<String> {
    let last = step.checked_sub(1)?;
    let (p, c) = (parent.lr(last), child.lr(last));
    if (p - c).abs() <= 1e-9 * p.abs().max(c.abs()) {
        return None;
    }
    let mut why = String::new();
    if parent.decay_start().is_some_and(|start| start <= last) {
        why.push_str("; the checkpoint was taken during the parent's WSD decay");
    }
    if let Some(start) = child.decay_start().filter(|&start| start <= last) {
        why.push_str(&format!(
            "; this run's WSD decay starts at step {}, before the branch point",
            start + 1
        ));
    }
    Some(format!(
        "warning: branching after step {step}: the parent trained there at learning rate {p:.3e}, \
         this run's schedule gives {c:.3e}{why}. The learning rate jumps at the branch; for a \
         WSD cool-down, branch from the stable phase into a run whose decay \
         (training.max_steps x schedule.decay_fraction) starts after step {step}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_branch_warns_when_the_learning_rate_jumps() {
        let opt = OptimizerConfig {
            lr: 1e-3,
            ..OptimizerConfig::default()
        };
        let wsd = ScheduleConfig {
            decay: Decay::Wsd,
            decay_fraction: 0.2,
            warmup_steps: 10,
            min_lr: 0.0,
            ..ScheduleConfig::default()
        };
        let run = |max_steps| Schedule {
            max_steps,
            optimizer: &opt,
            schedule: &wsd,
        };
        // Parent of 1000 steps (decay from step 801); branch after 600 into 700 steps (decay
        // from step 561: before the branch) warns; into 800 steps (decay from 641) does not.
        let w = branch_lr_warning(600, &run(1000), &run(700)).expect("a jump");
        assert!(w.contains("starts at step 561"), "{w}");
        assert_eq!(branch_lr_warning(600, &run(1000), &run(800)), None);
        // From the parent's decay (after step 900) into a longer run: warns, naming it.
        let w = branch_lr_warning(900, &run(1000), &run(2000)).expect("a jump");
        assert!(w.contains("during the parent's WSD decay"), "{w}");
        // A cosine parent branched into another length: the cosine moves, it warns.
        let cosine = ScheduleConfig::default();
        let (a, b) = (
            Schedule {
                max_steps: 1000,
                optimizer: &opt,
                schedule: &cosine,
            },
            Schedule {
                max_steps: 500,
                optimizer: &opt,
                schedule: &cosine,
            },
        );
        assert!(branch_lr_warning(300, &a, &b).is_some());
        assert_eq!(branch_lr_warning(0, &a, &b), None);
    }

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
