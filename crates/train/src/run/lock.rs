//! One writer per run directory: an exclusive OS lock on the run directory itself, and on
//! `RUN/train.lock`.
//!
//! The locks are `flock`-style (`std::fs::File::try_lock`), so the kernel releases them when the
//! process dies, however it dies: a run killed with SIGKILL leaves the file behind but no lock,
//! and `--resume` takes it again. The lock that counts is the one on the directory (on Unix,
//! where a directory can be opened as a file): deleting `train.lock` during a run cannot let a
//! second writer in, since the directory stays locked. The file holds the PID of the holder,
//! which is what a refused second writer reports, and is the lock on systems without directory
//! locks. Readers (`generate`, `score`, `eval`, `export`) never take it: they
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
    // Kept open: closing them would release the locks.
    _dir: Option<File>,
    _file: File,
    path: PathBuf,
}

/// The outcome of locking the directory itself.
enum DirLock {
    /// Locked; the handle keeps it.
    Held(File),
    /// Another process holds it.
    Busy,
    /// Not possible here (a directory cannot be opened as a file outside Unix).
    Unsupported,
}

/// Lock the directory itself (Unix: a directory opens read-only as a file).
fn lock_directory(run_dir: &Path) -> Result<DirLock> {
    if !cfg!(unix) {
        return Ok(DirLock::Unsupported);
    }
    let dir = File::open(run_dir).map_err(|e| TrainError::io("open", run_dir, e))?;
    match dir.try_lock() {
        Ok(()) => Ok(DirLock::Held(dir)),
        Err(TryLockError::WouldBlock) => Ok(DirLock::Busy),
        Err(TryLockError::Error(e)) => Err(TrainError::io("lock", run_dir, e)),
    }
}

/// The refusal, naming the holder's PID when the lock file still holds it.
fn locked(run_dir: &Path, file: Option<&mut File>) -> TrainError {
    let mut holder = String::new();
    if let Some(file) = file {
        let _ = file.read_to_string(&mut holder);
    } else if let Ok(text) = std::fs::read_to_string(run_dir.join(LOCK_FILE)) {
        holder = text;
    }
    let holder = holder.trim();
    TrainError::RunDirLocked {
        path: run_dir.to_path_buf(),
        holder: if holder.is_empty() {
            "another process".into()
        } else {
            format!("PID {holder}")
        },
    }
}

impl RunLock {
    /// Take the lock of `run_dir` (created if needed), or fail naming the holder's PID.
    pub fn acquire(run_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(run_dir)
            .map_err(|e| TrainError::io("create directory", run_dir, e))?;
        let dir = match lock_directory(run_dir)? {
            DirLock::Held(dir) => Some(dir),
            DirLock::Busy => return Err(locked(run_dir, None)),
            DirLock::Unsupported => None,
        };
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
            Err(TryLockError::WouldBlock) => return Err(locked(run_dir, Some(&mut file))),
            Err(TryLockError::Error(e)) => return Err(TrainError::io("lock", &path, e)),
        }
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(|_| ()))
            .and_then(|()| write!(file, "{}", std::process::id()))
            .and_then(|()| file.sync_all())
            .map_err(|e| TrainError::io("write", &path, e))?;
        Ok(Self {
            _dir: dir,
            _file: file,
            path,
        })
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

    #[test]
    fn deleting_the_lock_file_does_not_let_a_second_writer_in() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(dir.path()).unwrap();
        std::fs::remove_file(first.path()).unwrap();
        let err = RunLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        drop(first);
        RunLock::acquire(dir.path()).unwrap();
    }
}
