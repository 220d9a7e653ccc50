//! `RUN/metrics.jsonl` and `RUN/samples.jsonl`: append-only JSONL files (one object per line,
//! with `step`), cut back to the resumed step when a run resumes.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

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
            let mut text = kept.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            crate::files::write_replacing(&path, text)?;
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
