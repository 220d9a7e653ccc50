//! One writer per run directory: an exclusive OS file lock on `RUN/train.lock`.
//!
//! The lock is `flock`-style (`std::fs::File::try_lock`), so the kernel releases it when the
//! process dies, however it dies: a run killed with SIGKILL leaves the file behind but no lock,
//! and `--resume` takes it again. The file holds the PID of the holder, which is what a refused
//! second writer reports. Readers (`generate`, `score`, `eval`, `export`) never take it: they
//! only read complete checkpoints, which appear by an atomic rename.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};

/// Name of the lock file inside a run directory.
pub const LOCK_FILE: &str = "train.lock";

/// Held for the life of a training process; dropping it (or dying) releases the lock.
#[derive(Debug)]
pub struct RunLock {
    // Kept open: closing the file would release the lock.
    _file: File,
    path: PathBuf,
}

impl RunLock {
    /// Take the lock of `run_dir` (created if needed), or fail naming the holder's PID.
    pub fn acquire(run_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(run_dir)
            .map_err(|e| TrainError::io("create directory", run_dir, e))?;
        let path = run_dir.join(LOCK_FILE);
        // Not truncated on open: the holder's PID must stay readable until we own the lock.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| TrainError::io("open", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(TrainError::RunDirLocked {
                    path: run_dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "another process".into()
                    } else {
                        format!("PID {holder}")
                    },
                });
            }
            Err(TryLockError::Error(e)) => return Err(TrainError::io("lock", &path, e)),
        }
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(|_| ()))
            .and_then(|()| write!(file, "{}", std::process::id()))
            .and_then(|()| file.sync_all())
            .map_err(|e| TrainError::io("write", &path, e))?;
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_with_the_holder_pid_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(dir.path()).unwrap();
        let err = RunLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&format!("PID {}", std::process::id())),
            "{err}"
        );
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        drop(first);
        let again = RunLock::acquire(dir.path()).unwrap();
        assert!(again.path().is_file());
    }
}
