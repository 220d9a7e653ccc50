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

/// The weight files of the model in `dir`, if any: `model.safetensors`, and a sharded index
/// with the shards it lists (plain names ending in `.safetensors` only).
pub fn weight_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = Vec::new();
    if dir.join("model.safetensors").is_file() {
        files.push("model.safetensors".into());
    }
    let index = dir.join("model.safetensors.index.json");
    if let Ok(text) = std::fs::read_to_string(&index) {
        files.push("model.safetensors.index.json".into());
        if let Some(map) = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("weight_map")?.as_object().cloned())
        {
            files.extend(
                map.values()
                    .filter_map(|f| f.as_str())
                    .filter(|name| {
                        Path::new(name).file_name().is_some_and(|f| f == *name)
                            && name.ends_with(".safetensors")
                    })
                    .map(str::to_string),
            );
        }
    }
    files.sort();
    files.dedup();
    files
}

/// After a model's weights (`written`) went into `dir`: remove the weight files of the model
/// that was there before (`before`, from [`weight_files`]) that the new one does not use, which
/// loaders would otherwise read (qwen-burn prefers an index; transformers the single file). An
/// old index goes first: shards without an index read as no model.
pub fn remove_stale_weights(dir: &Path, before: &[String], written: &[String]) -> Result<()> {
    let mut stale: Vec<&String> = before.iter().filter(|f| !written.contains(f)).collect();
    stale.sort_by_key(|f| !f.ends_with(".index.json"));
    for name in stale {
        let path = dir.join(name);
        if path.is_file() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
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
