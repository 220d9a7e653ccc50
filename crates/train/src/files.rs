//! Files replaced whole: written (or copied) to a temporary file beside the target, named with
//! the process id (two processes may write one shared file, the peak cache), then renamed into
//! place, so a reader or a kill mid-write never meets half a file. A failed write removes its
//! temporary file.

use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};

fn temporary(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".tmp.{}", std::process::id()));
    PathBuf::from(name)
}

fn rename_into(tmp: &Path, path: &Path) -> Result<()> {
    std::fs::rename(tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(tmp);
        TrainError::io("rename", path, e)
    })
}

/// Replace `path` by `bytes`.
pub(crate) fn write_replacing(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    let tmp = temporary(path);
    std::fs::write(&tmp, bytes).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        TrainError::io("write", &tmp, e)
    })?;
    rename_into(&tmp, path)
}

/// Replace `dest` by a copy of `src`.
pub(crate) fn copy_replacing(src: &Path, dest: &Path) -> Result<()> {
    let tmp = temporary(dest);
    std::fs::copy(src, &tmp).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        TrainError::io("copy", src, e)
    })?;
    rename_into(&tmp, dest)
}
