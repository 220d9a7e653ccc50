//! Live progress: an indicatif bar on a terminal, plain lines otherwise, or the dashboard.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use super::dashboard::Dashboard;
use super::records::MetricsRecord;
use crate::error::{Result, TrainError};

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
