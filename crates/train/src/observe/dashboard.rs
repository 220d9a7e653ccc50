//! The live training view: burn-train's terminal dashboard (`TuiMetricsRendererWrapper`, what
//! every Burn example shows), driven from our own loop instead of burn-train's `Learner`.
//!
//! What it is fed:
//! - plots (each metric a tab; training values red, validation blue): loss (training and
//!   validation), learning rate, gradient norm, tokens/s, MFU, validation bits per byte, each
//!   `[eval]` task's `acc_norm`, and for MoE the worst layer's max/mean expert load;
//! - text: the step and tokens seen, and the newest line of the run's log;
//! - progress and ETA over the whole run, also after `--resume`: the steps are cut into
//!   "epochs" of `gcd(first step, max_steps)` steps, so that the steps done before are whole
//!   epochs behind the dashboard's checkpoint (its ETA counts from there) and the bar stands
//!   where the run stands. The records of `metrics.jsonl` up to the resumed step are replayed
//!   into the plots first.
//!
//! Its stop key (`q`, then `s`) sets the interrupter the loop polls after every step; the loop
//! then writes a checkpoint and returns. The dashboard owns the screen in raw mode, so while it
//! runs every other line of the run goes to `RUN/train.log` ([`super::progress::Progress`]).

use std::collections::HashSet;
use std::io::IsTerminal;
use std::sync::Arc;

use burn_train::Interrupter;
use burn_train::logger::TrainingProgressLogger;
use burn_train::metric::{
    MetricAttributes, MetricDefinition, MetricEntry, MetricId, NumericAttributes, NumericEntry,
    SerializedEntry,
};
use burn_train::renderer::tui::TuiMetricsRendererWrapper;
use burn_train::renderer::{MetricState, MetricsRenderer, MetricsRendererTraining};

use super::records::{MetricsRecord, TaskRecord, TrainRecord, ValRecord};

const LOSS: &str = "Loss";
const LR: &str = "Learning rate";
const GRAD_NORM: &str = "Gradient norm";
const TOKENS_PER_SEC: &str = "Tokens/s";
const MFU: &str = "MFU";
const BPB: &str = "Bits per byte";
const MOE_LOAD: &str = "MoE router's own choice: worst layer max/mean load";
const STEP: &str = "Step";
const LOG: &str = "Log";

/// The dashboard of one run (see the module docs).
pub struct Dashboard {
    tui: TuiMetricsRendererWrapper,
    interrupter: Interrupter,
    /// Steps per dashboard "epoch".
    chunk: usize,
    max_steps: usize,
    registered: HashSet<String>,
}

impl Dashboard {
    /// Whether this process can show it: stdout and stdin are a terminal.
    pub fn available() -> bool {
        std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
    }

    /// Take over the terminal for a run of `max_steps` steps continuing after `start_step`,
    /// with the records written so far (`history`, replayed into the plots).
    pub fn start(
        label: &str,
        start_step: usize,
        max_steps: usize,
        history: &[MetricsRecord],
    ) -> Self {
        let chunk = gcd(start_step, max_steps).max(1);
        let done = start_step / chunk;
        let interrupter = Interrupter::new();
        let tui = TuiMetricsRendererWrapper::new(interrupter.clone(), (done > 0).then_some(done));
        let mut dashboard = Self {
            tui,
            interrupter,
            chunk,
            max_steps,
            registered: HashSet::new(),
        };
        // Registration fixes the tabs' order.
        for name in [LOSS, LR, GRAD_NORM, TOKENS_PER_SEC, MFU, BPB] {
            dashboard.register(name, true);
        }
        for name in [STEP, LOG] {
            dashboard.register(name, false);
        }
        let tui = &mut dashboard.tui;
        tui.start(max_steps / chunk, done + 1, Some(chunk), Some(label));
        tui.start_split("train", chunk);
        for record in history {
            dashboard.record(record);
        }
        dashboard
    }

    fn register(&mut self, name: &str, numeric: bool) {
        if !self.registered.insert(name.to_string()) {
            return;
        }
        let attributes = if numeric {
            NumericAttributes {
                unit: None,
                higher_is_better: false,
            }
            .into()
        } else {
            MetricAttributes::None
        };
        self.tui.register_metric(MetricDefinition {
            metric_id: id(name),
            name: Arc::new(name.to_string()),
            description: None,
            attributes,
        });
    }

    /// One plotted value (`valid`: the validation line).
    fn value(&mut self, name: &str, value: f64, text: String, valid: bool) {
        self.register(name, true);
        let state = MetricState::Numeric(
            MetricEntry::new(id(name), SerializedEntry::new(text, value.to_string())),
            Some(NumericEntry::Value(value)),
        );
        if valid {
            self.tui.update_valid(state);
        } else {
            self.tui.update_train(state);
        }
    }

    /// One text line.
    fn text(&mut self, name: &str, text: String) {
        self.register(name, false);
        let entry = MetricEntry::new(id(name), SerializedEntry::new(text.clone(), text));
        self.tui.update_train(MetricState::Generic(entry));
    }

    /// A record of `metrics.jsonl`, into its plots.
    pub fn record(&mut self, record: &MetricsRecord) {
        match record {
            MetricsRecord::Train(r) => self.train(r),
            MetricsRecord::Val(r) => self.val(r),
            MetricsRecord::Task(r) => self.task(r),
        }
    }

    /// A training record (a logged step).
    fn train(&mut self, r: &TrainRecord) {
        self.value(LOSS, r.loss, format!("{:.4}", r.loss), false);
        self.value(LR, r.lr, format!("{:.3e}", r.lr), false);
        self.value(GRAD_NORM, r.grad_norm, format!("{:.3}", r.grad_norm), false);
        let tps = r.tokens_per_sec;
        self.value(TOKENS_PER_SEC, tps, format!("{tps:.0}"), false);
        let mfu = r.mfu * 100.0;
        self.value(MFU, mfu, format!("{mfu:.1} %"), false);
        if let Some(w) = &r.moe_worst {
            self.value(MOE_LOAD, w.router_max_over_mean_load, w.describe(), false);
        }
        // The objective's figures (a preference run's rewards, an RL run's rewards and
        // lengths), each its own plot.
        for (name, &v) in &r.figures {
            self.value(name, v, format!("{v:.4}"), false);
        }
        let step = format!(
            "{}/{} ({:.2}M tokens seen)",
            r.step,
            self.max_steps,
            r.tokens_seen as f64 / 1e6
        );
        self.text(STEP, step);
    }

    /// A validation record.
    fn val(&mut self, r: &ValRecord) {
        self.value(
            LOSS,
            r.loss,
            format!("{:.4} (step {})", r.loss, r.step),
            true,
        );
        if let Some(bpb) = r.bpb {
            self.value(BPB, bpb, format!("{bpb:.4} (step {})", r.step), true);
        }
        for (name, &v) in &r.figures {
            self.value(name, v, format!("{v:.4} (step {})", r.step), true);
        }
    }

    /// A task's score (shown as its own validation plot).
    fn task(&mut self, r: &TaskRecord) {
        let name = format!("{} acc_norm", r.task);
        let text = format!(
            "{:.3} ± {:.3} (step {}, chance {:.3})",
            r.acc_norm, r.acc_norm_stderr, r.step, r.chance
        );
        self.value(&name, r.acc_norm, text, true);
    }

    /// The newest line of the run's log.
    pub fn log(&mut self, line: &str) {
        self.text(LOG, line.to_string());
    }

    /// `step` steps done (1-based, increasing).
    pub fn progress(&mut self, step: usize) {
        if step == 0 || step > self.max_steps {
            return;
        }
        let epoch = (step - 1) / self.chunk;
        self.tui.update_epoch(epoch);
        self.tui.update_split(step - epoch * self.chunk);
    }

    /// Whether the stop key was pressed.
    pub fn stop_requested(&self) -> bool {
        self.interrupter.should_stop()
    }

    /// Give the terminal back (restored: main screen, cursor, cooked mode).
    pub fn close(mut self) {
        let _ = self.tui.on_train_end(None);
    }
}

fn id(name: &str) -> MetricId {
    MetricId::new(Arc::new(name.to_string()))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::gcd;

    #[test]
    fn resumed_steps_are_whole_chunks() {
        // A fresh run is one chunk; a resume at step N of M cuts M into chunks that N ends.
        for (start, max) in [(0, 500), (300, 500), (137, 500), (500, 500), (1, 1)] {
            let chunk = gcd(start, max).max(1);
            assert_eq!(max % chunk, 0, "{start} {max}");
            assert_eq!(start % chunk, 0, "{start} {max}");
        }
        assert_eq!(gcd(0, 500), 500);
        assert_eq!(gcd(300, 500), 100);
        assert_eq!(gcd(137, 500), 1);
    }
}
