//! What a run watches of its MoE routers: the worst layer of a step ([`MoeWorst`]) and the
//! collapse warning ([`CollapseWatch`]).

use qwen_burn_model::RouterStats;

/// The worst MoE layer of a step: what the progress line, the dashboard and `metrics.jsonl`
/// (`moe_worst`) show at every logging interval, so a collapse is visible without reading
/// per-layer figures. `router_*` is the router's own choice (how validation, `eval`, `generate`
/// and an export route); `capped_*`, present only under a training-time capacity, is the
/// assignment the experts were trained on.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MoeWorst {
    /// The layer (index among the MoE layers) whose own choice has the largest max/mean load.
    pub layer: usize,
    /// That layer's max/mean expert load over the whole step (1 = balanced; `E / k` = every
    /// token of the layer on the same `k` experts).
    pub router_max_over_mean_load: f64,
    /// The largest share of experts that the router's own choice left without a token, over
    /// all MoE layers.
    pub router_idle_expert_fraction: f64,
    /// Under a capacity: the worst layer's max/mean load of the capped assignment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capped_max_over_mean_load: Option<f64>,
    /// Under a capacity: the largest idle-expert share of the capped assignment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capped_idle_expert_fraction: Option<f64>,
}

impl MoeWorst {
    /// The worst of a step's per-layer statistics of the router's own choice, with those of the
    /// capped assignment under a capacity; `None` without MoE layers.
    pub fn of(router: &[RouterStats], capped: Option<&[RouterStats]>) -> Option<Self> {
        let (layer, worst) = router
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.max_over_mean_load.total_cmp(&b.1.max_over_mean_load))?;
        let max_load =
            |l: &[RouterStats]| l.iter().map(|s| s.max_over_mean_load).fold(0.0, f64::max);
        let max_idle =
            |l: &[RouterStats]| l.iter().map(|s| s.idle_expert_fraction).fold(0.0, f64::max);
        Some(Self {
            layer,
            router_max_over_mean_load: worst.max_over_mean_load,
            router_idle_expert_fraction: max_idle(router),
            capped_max_over_mean_load: capped.map(max_load),
            capped_idle_expert_fraction: capped.map(max_idle),
        })
    }

    /// The figures as the progress line and the dashboard print them.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "router's own choice: worst layer {} max/mean load {:.2}, idle experts {:.0}%",
            self.layer,
            self.router_max_over_mean_load,
            self.router_idle_expert_fraction * 100.0
        );
        if let (Some(load), Some(idle)) = (
            self.capped_max_over_mean_load,
            self.capped_idle_expert_fraction,
        ) {
            text.push_str(&format!(
                "; capped (trained): {load:.2}, idle {:.0}%",
                idle * 100.0
            ));
        }
        text
    }
}

/// Watches every step's per-layer expert loads and says when a layer stays collapsed: its
/// max/mean load above [`CollapseWatch::THRESHOLD`] for [`CollapseWatch::STEPS`] steps in a row
/// (once per episode; a step back under the threshold ends it).
#[derive(Debug, Default)]
pub struct CollapseWatch {
    /// Per layer: consecutive steps over the threshold so far.
    streak: Vec<usize>,
}

impl CollapseWatch {
    /// Max/mean load above which a step counts as collapsed (2 = the busiest expert takes twice
    /// its share).
    pub const THRESHOLD: f64 = 2.0;
    /// Consecutive collapsed steps before the warning.
    pub const STEPS: usize = 20;

    /// Record one step; returns a warning for each layer whose collapse just reached
    /// [`Self::STEPS`] steps.
    pub fn observe(&mut self, step: usize, layers: &[RouterStats]) -> Vec<String> {
        self.streak.resize(layers.len(), 0);
        let mut warnings = Vec::new();
        for (i, (l, streak)) in layers.iter().zip(&mut self.streak).enumerate() {
            if l.max_over_mean_load > Self::THRESHOLD {
                *streak += 1;
            } else {
                *streak = 0;
            }
            if *streak == Self::STEPS {
                let experts = l.tokens_per_expert.len();
                let dead = (l.idle_expert_fraction * experts as f64).round() as usize;
                warnings.push(format!(
                    "warning: MoE layer {i}'s router has been collapsed for {} steps (step {step}: \
                     its own choice's max/mean expert load {:.2} > {}, {dead} of {experts} experts \
                     idle); its routing is not balanced, so per-expert results of this run are not \
                     comparable",
                    Self::STEPS,
                    l.max_over_mean_load,
                    Self::THRESHOLD
                ));
            }
        }
        warnings
    }
}

#[cfg(test)]
mod collapse_tests {
    use super::*;

    fn layer(counts: &[usize]) -> RouterStats {
        RouterStats::from_counts(counts, 1.0)
    }

    #[test]
    fn a_layer_collapsed_for_twenty_steps_is_reported_once() {
        let mut watch = CollapseWatch::default();
        let balanced = layer(&[10, 10, 10, 10]);
        let collapsed = layer(&[40, 0, 0, 0]);
        let mut warned = Vec::new();
        for step in 1..=60 {
            // Layer 1 collapses from step 11 on, with one balanced step at 25 that restarts
            // the count; layer 0 stays balanced.
            let l1 = if step > 10 && step != 25 {
                collapsed.clone()
            } else {
                balanced.clone()
            };
            for w in watch.observe(step, &[balanced.clone(), l1]) {
                warned.push((step, w));
            }
        }
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert_eq!(warned[0].0, 45);
        assert!(warned[0].1.contains("MoE layer 1"), "{}", warned[0].1);
        assert!(
            warned[0].1.contains("3 of 4 experts idle"),
            "{}",
            warned[0].1
        );
        let worst = MoeWorst::of(&[balanced, collapsed, layer(&[20, 20, 0, 0])], None).unwrap();
        assert_eq!(worst.capped_max_over_mean_load, None);
        assert_eq!(worst.layer, 1);
        assert_eq!(worst.router_max_over_mean_load, 4.0);
        assert_eq!(worst.router_idle_expert_fraction, 0.75);
        // Under a capacity the router's own choice is the headline, the capped figure beside it.
        let capped =
            MoeWorst::of(&[layer(&[30, 10, 0, 0])], Some(&[layer(&[10, 10, 10, 10])])).unwrap();
        assert_eq!(capped.router_max_over_mean_load, 3.0);
        assert_eq!(capped.router_idle_expert_fraction, 0.5);
        assert_eq!(capped.capped_max_over_mean_load, Some(1.0));
        assert_eq!(capped.capped_idle_expert_fraction, Some(0.0));
        assert!(
            capped
                .describe()
                .contains("max/mean load 3.00, idle experts 50%")
        );
        assert!(
            capped
                .describe()
                .contains("capped (trained): 1.00, idle 0%")
        );
    }
}
