//! Metrics: `RUN/metrics.jsonl` (one JSON object per line with `step`, `split` and `loss` at
//! least), live progress (an indicatif bar on a terminal, plain lines otherwise, or the
//! dashboard), and the FLOP accounting behind MFU.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};

use std::cell::RefCell;

use indicatif::{ProgressBar, ProgressStyle};
use qwen_burn_model::{Qwen3Config, RouterStats};
use serde_json::Value;

use crate::dashboard::Dashboard;
use crate::error::{Result, TrainError};
use crate::records::MetricsRecord;

/// Append-only JSONL metrics file.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    /// Open `run_dir/<name>` (a JSONL file) for appending. When resuming from step `keep_until`, lines of
    /// later steps (written by the interrupted run after its last checkpoint) are dropped first,
    /// so the file reads as if the run had never stopped.
    pub fn open(run_dir: &Path, name: &str, keep_until: Option<usize>) -> Result<Self> {
        let path = run_dir.join(name);
        if let Some(last) = keep_until
            && path.exists()
        {
            let reader =
                BufReader::new(File::open(&path).map_err(|e| TrainError::io("open", &path, e))?);
            let kept: Vec<String> = reader
                .lines()
                .map_while(std::result::Result::ok)
                .filter(|line| {
                    serde_json::from_str::<Value>(line)
                        .ok()
                        .and_then(|v| v["step"].as_u64())
                        .is_some_and(|s| s as usize <= last)
                })
                .collect();
            let tmp = run_dir.join(format!("{name}.tmp"));
            let mut text = kept.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            std::fs::write(&tmp, text).map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                TrainError::io("write", &tmp, e)
            })?;
            std::fs::rename(&tmp, &path).map_err(|e| TrainError::io("rename", &path, e))?;
        } else if keep_until.is_none() && path.exists() {
            std::fs::remove_file(&path).map_err(|e| TrainError::io("remove", &path, e))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| TrainError::io("open", &path, e))?;
        Ok(Self { path, file })
    }

    /// Append one record (one JSON line).
    pub fn write(&mut self, record: &impl serde::Serialize) -> Result<()> {
        let line = serde_json::to_string(record).expect("records serialise");
        writeln!(self.file, "{line}").map_err(|e| TrainError::io("write", &self.path, e))
    }
}

/// Training FLOPs per token: `6 * active params + 12 * layers * heads * head_dim * seq`
/// (Kaplan et al. 6N plus the attention term of PaLM appendix B).
pub fn train_flops_per_token(config: &Qwen3Config, seq_len: usize) -> f64 {
    6.0 * config.active_params_per_token() as f64
        + 3.0 * config.attention_flops_per_token(seq_len) as f64
}

/// LoRA training FLOPs per token: the frozen model's forward and input-gradient backward
/// (`4 * active params`, no weight gradients), the attention term, and `6 *` the adapters.
/// For MoE the adapters of every expert are counted (an upper bound: a token uses `k`).
pub fn lora_flops_per_token(config: &Qwen3Config, seq_len: usize, adapter_params: usize) -> f64 {
    4.0 * config.active_params_per_token() as f64
        + 3.0 * config.attention_flops_per_token(seq_len) as f64
        + 6.0 * adapter_params as f64
}

/// Live progress: an indicatif bar on a terminal, plain lines otherwise, or the dashboard
/// ([`Dashboard`]), which owns the screen: its lines then go to the run's log file.
pub struct Progress {
    bar: Option<ProgressBar>,
    dashboard: Option<RefCell<DashboardView>>,
}

/// The dashboard and the log file its lines go to.
struct DashboardView {
    dashboard: Dashboard,
    log: File,
    log_path: PathBuf,
}

impl Progress {
    /// A bar on a terminal, plain lines otherwise.
    pub fn new(total: usize, start: usize) -> Self {
        let bar = std::io::stdout().is_terminal().then(|| {
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
                )
                .expect("valid template"),
            );
            bar.set_position(start as u64);
            bar
        });
        Self {
            bar,
            dashboard: None,
        }
    }

    /// The dashboard, with every line appended to `log_path` instead of the screen.
    pub fn with_dashboard(dashboard: Dashboard, log_path: &Path) -> Result<Self> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| TrainError::io("open", log_path, e))?;
        Ok(Self {
            bar: None,
            dashboard: Some(RefCell::new(DashboardView {
                dashboard,
                log,
                log_path: log_path.to_path_buf(),
            })),
        })
    }

    /// Report progress of the current step (`msg` is shown in the bar).
    pub fn step(&self, step: usize, msg: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(step as u64);
            bar.set_message(msg.to_string());
        }
        if let Some(view) = &self.dashboard {
            view.borrow_mut().dashboard.progress(step);
        }
    }

    /// A line that must stay visible (log lines, validation, samples).
    pub fn line(&self, text: &str) {
        if let Some(view) = &self.dashboard {
            let mut view = view.borrow_mut();
            // The log is a convenience copy (metrics.jsonl is the record): a failed write must
            // not stop the run.
            let _ = writeln!(view.log, "{text}");
            view.dashboard.log(text);
            return;
        }
        match &self.bar {
            Some(bar) => bar.println(text),
            None => {
                println!("{text}");
                let _ = std::io::stdout().flush();
            }
        }
    }

    /// A record just written to `metrics.jsonl`, for the dashboard's plots.
    pub fn record(&self, record: &MetricsRecord) {
        if let Some(view) = &self.dashboard {
            view.borrow_mut().dashboard.record(record);
        }
    }

    /// Whether the dashboard's stop key was pressed.
    pub fn stop_requested(&self) -> bool {
        self.dashboard
            .as_ref()
            .is_some_and(|v| v.borrow().dashboard.stop_requested())
    }

    /// Close the bar, or give the terminal back and say where the log is.
    pub fn finish(self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
        if let Some(view) = self.dashboard {
            let view = view.into_inner();
            view.dashboard.close();
            println!("the run's log: {}", view.log_path.display());
        }
    }
}

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
