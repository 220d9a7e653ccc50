//! Where a command may write: an output path is checked before any work, never names an input,
//! a checkpoint or a run, and replaces an existing model directory only when asked
//! (`--overwrite`), leaving it as every loader reads it.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// Whether two paths name the same existing file or directory.
pub fn same_entry(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// What an existing directory holds, for the refusal's wording: a checkpoint, a run or a model.
fn holds(dir: &Path) -> Option<&'static str> {
    if dir.join("state.json").is_file() {
        Some("a checkpoint (state.json)")
    } else if dir.join("checkpoints").is_dir() || dir.join("run.toml").is_file() {
        Some("a run directory (checkpoints/, run.toml)")
    } else if [
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
    ]
    .iter()
    .any(|f| dir.join(f).exists())
    {
        Some("a model (config.json or safetensors)")
    } else {
        None
    }
}

/// Before an HF model is written to `out` (`init`, `export`): a checkpoint or a run directory is
/// never a target (the model's config.json would replace the checkpoint's, which then reads as
/// damaged); an existing model directory is replaced only with `overwrite`.
pub fn check_model_out(out: &Path, overwrite: bool) -> Result<()> {
    if out.exists() && !out.is_dir() {
        bail!("--out {} exists and is not a directory", out.display());
    }
    match holds(out) {
        Some(what) if what.starts_with("a model") => {
            if !overwrite {
                bail!(
                    "--out {} already holds {what}; pass --overwrite to replace it, or choose a \
                     new directory",
                    out.display()
                );
            }
            Ok(())
        }
        Some(what) => bail!(
            "--out {} is {what}; writing a model there would replace its config.json and damage \
             it. Choose a new directory",
            out.display()
        ),
        None => Ok(()),
    }
}

/// After a single-file model (`model.safetensors`) is written into `dir`: remove a sharded
/// index and the shards it lists, left by an earlier model there, which loaders would read
/// instead of the new file (qwen-burn prefers the index; transformers the single file).
pub fn remove_stale_shards(dir: &Path) -> Result<()> {
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Ok(());
    }
    let text =
        std::fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
    let shards: Vec<String> = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("weight_map")?.as_object().cloned())
        .map(|map| {
            let mut files: Vec<String> = map
                .values()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect();
            files.sort();
            files.dedup();
            files
        })
        .unwrap_or_default();
    // Remove the index first: a directory with shards but no index reads as the new model.
    std::fs::remove_file(&index).with_context(|| format!("removing {}", index.display()))?;
    for name in shards {
        let plain = Path::new(&name)
            .file_name()
            .is_some_and(|f| f == name.as_str());
        if plain && name.ends_with(".safetensors") && name != "model.safetensors" {
            let path = dir.join(&name);
            if path.is_file() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

/// Copy `src` to `dest` through a temporary file beside `dest`, renamed into place.
pub fn copy_atomic(src: &Path, dest: &Path) -> Result<()> {
    let tmp = dest.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::copy(src, &tmp).with_context(|| format!("copying {}", src.display()))?;
    std::fs::rename(&tmp, dest).with_context(|| format!("renaming into {}", dest.display()))?;
    Ok(())
}
