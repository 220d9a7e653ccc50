//! Metrics: `RUN/metrics.jsonl` (one JSON object per line with `step`, `split` and `loss` at
//! least), live progress (an indicatif bar on a terminal, plain lines otherwise), and the FLOP
//! accounting behind MFU.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use qwen_burn_model::Qwen3Config;
use serde_json::Value;

use crate::error::{Result, TrainError};

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
            std::fs::write(&tmp, text).map_err(|e| TrainError::io("write", &tmp, e))?;
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

/// Live progress.
pub struct Progress {
    bar: Option<ProgressBar>,
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
        Self { bar }
    }

    /// Report progress of the current step (`msg` is shown in the bar).
    pub fn step(&self, step: usize, msg: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(step as u64);
            bar.set_message(msg.to_string());
        }
    }

    /// A line that must stay visible (log lines, validation, samples).
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => {
                println!("{text}");
                let _ = std::io::stdout().flush();
            }
        }
    }

    /// Close the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
