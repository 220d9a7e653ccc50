//! A refused run leaves nothing behind: what a branch (`--from-checkpoint`) put into a new run
//! directory before a later check refused the run is removed again, so the corrected command
//! finds the directory as it was.

use std::path::{Path, PathBuf};

use super::lock::LOCK_FILE;

/// Whether `run_dir` holds nothing but the run lock (a directory this process just created or
/// an empty one).
pub fn only_lock(run_dir: &Path) -> bool {
    std::fs::read_dir(run_dir).is_ok_and(|entries| {
        entries
            .filter_map(|e| e.ok())
            .all(|e| e.file_name() == LOCK_FILE)
    })
}

/// Removes what was written into a run directory that held only its lock, unless disarmed
/// (the run started). Dropped on every error path of the run's set-up.
#[derive(Debug)]
pub struct Undo {
    run_dir: Option<PathBuf>,
}

impl Undo {
    /// Armed when `armed` (a branch into a directory that held only the lock).
    pub fn new(run_dir: &Path, armed: bool) -> Self {
        Self {
            run_dir: armed.then(|| run_dir.to_path_buf()),
        }
    }

    /// The run started: keep what was written.
    pub fn disarm(&mut self) {
        self.run_dir = None;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some(dir) = &self.run_dir else { return };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            if entry.file_name() == LOCK_FILE {
                continue;
            }
            let path = entry.path();
            // Best effort: the run is being refused with its own error, which must not be
            // replaced by a cleanup failure.
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}
