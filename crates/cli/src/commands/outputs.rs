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

/// Whether the existing `out` is `input` or lies inside the directory `input` (which a command
/// may read recursively: a data directory, a model or run directory).
fn reads_into(out: &Path, input: &Path) -> bool {
    match (out.canonicalize(), input.canonicalize()) {
        (Ok(out), Ok(input)) => out == input || (input.is_dir() && out.starts_with(&input)),
        _ => false,
    }
}

/// Before a command writes the file `out` (given as `flag`): it is not one of the files the
/// command reads (`inputs`, or a file inside an input directory), not a directory, and its
/// directory exists. Checked before any work; the file is then written through a temporary
/// file beside it ([`write_atomic`]).
pub fn check_file_out(flag: &str, out: &Path, inputs: &[&Path]) -> Result<()> {
    if let Some(input) = inputs.iter().find(|input| reads_into(out, input)) {
        let what = if input.is_dir() { "a file of " } else { "" };
        bail!(
            "{flag} {} would overwrite {what}{}, which this command reads; choose another file",
            out.display(),
            input.display()
        );
    }
    if out.is_dir() {
        bail!("{flag} {} is a directory; give a file name", out.display());
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        bail!(
            "{flag} {}: the directory {} does not exist",
            out.display(),
            parent.display()
        );
    }
    Ok(())
}

/// Write `out` through a temporary file beside it (`write` fills it), renamed into place only
/// when complete: an error or a kill leaves `out` as it was.
pub fn write_atomic(
    out: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<()>,
) -> Result<()> {
    use std::io::Write;
    let tmp = out.with_extension(format!("tmp.{}", std::process::id()));
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut file = std::io::BufWriter::new(file);
    let written = write(&mut file).and_then(|()| {
        file.flush()
            .with_context(|| format!("writing {}", tmp.display()))
    });
    drop(file);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).with_context(|| format!("renaming into {}", out.display()))
}

/// Copy `src` to `dest` through a temporary file beside `dest`, renamed into place.
pub fn copy_atomic(src: &Path, dest: &Path) -> Result<()> {
    let tmp = dest.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::copy(src, &tmp).with_context(|| format!("copying {}", src.display()))?;
    std::fs::rename(&tmp, dest).with_context(|| format!("renaming into {}", dest.display()))?;
    Ok(())
}
