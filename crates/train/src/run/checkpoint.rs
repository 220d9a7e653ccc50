//! Step checkpoints: the whole run state, written atomically.
//!
//! A checkpoint is a directory `RUN/checkpoints/step-XXXXXXXX/` holding `model.bpk` (Burn
//! record: every parameter with its id, LoRA adapters and MoE routing biases included),
//! `optimizer.bpk` (AdamW moments, keyed by parameter id), `config.json` (HF model config),
//! `run.toml` (the resolved run config) and `state.json` (step, tokens seen, data cursor, seed,
//! validation loss, git revision). It is written under `step-XXXXXXXX.tmp/`, every file is
//! fsynced, `state.json` last (with the SHA-256 of every other file, checked on load), and only
//! then renamed into place: a kill at any moment leaves either the old set of checkpoints or the
//! old set plus a complete new one, never a torn one.
//! Directories still ending in `.tmp` are leftovers of a crash and are ignored and removed.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::module::{Lora, Module, ParamGroup};
use burn::optim::ModuleOptimizer;
use burn::store::ModuleRecord;
use burn::tensor::{DType, Device, FloatDType};
use qwen_burn_data::Cursor;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{BaseDtype, LoraConfig};
use crate::error::{Result, TrainError};

/// Bump when the layout changes.
pub const FORMAT_VERSION: u32 = 1;

/// Everything besides tensors that a resumed run needs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainState {
    /// Checkpoint layout version.
    pub format_version: u32,
    /// Optimizer steps completed.
    pub step: usize,
    /// Training tokens consumed (inputs, padding included).
    pub tokens_seen: u64,
    /// Of those, the tokens that are not padding. Absent in checkpoints written before it
    /// existed: a run resumed from one does not log it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_padding_tokens_seen: Option<u64>,
    /// Data sampler cursor after the last consumed batch (`null` before the first step).
    pub data_cursor: Option<Cursor>,
    /// Seed of init and data order.
    pub seed: u64,
    /// Validation loss at this step, if one was measured.
    pub val_loss: Option<f64>,
    /// Training wall time so far, seconds.
    pub elapsed_secs: f64,
    /// `git rev-parse HEAD` of the code that wrote it ("unknown" outside a repository).
    pub git_revision: String,
    /// LoRA adapters present in `model.bpk`.
    pub lora: Option<LoraConfig>,
    /// SHA-256 of each other file of the checkpoint, checked when it is loaded, so that a
    /// damaged file is found even where its format would still parse. Absent in checkpoints
    /// written before it existed (then nothing is checked).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sha256: BTreeMap<String, String>,
}

/// The files of a checkpoint that `state.json` lists with their SHA-256.
const HASHED_FILES: [&str; 4] = ["model.bpk", "optimizer.bpk", "config.json", "run.toml"];

/// SHA-256 of a file, hex.
fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(|e| TrainError::io("open", path, e))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| TrainError::io("read", path, e))?;
    Ok(hex::encode(hasher.finalize()))
}

/// Compare the files of checkpoint `dir` with the hashes its `state.json` lists.
pub fn verify_checkpoint(dir: &Path, state: &TrainState) -> Result<()> {
    for (name, expected) in &state.sha256 {
        if !HASHED_FILES.contains(&name.as_str()) {
            return Err(TrainError::Checkpoint {
                path: dir.to_path_buf(),
                reason: format!("state.json lists an unknown file `{name}`"),
            });
        }
        let found = sha256_file(&dir.join(name))?;
        if &found != expected {
            return Err(TrainError::Checkpoint {
                path: dir.join(name),
                reason: format!(
                    "the file is damaged: its SHA-256 is {found}, state.json recorded {expected}"
                ),
            });
        }
    }
    Ok(())
}

fn step_dir_name(step: usize) -> String {
    format!("step-{step:08}")
}

/// Complete checkpoints of a run, oldest first.
pub fn list_checkpoints(run_dir: &Path) -> Vec<(usize, PathBuf)> {
    let dir = run_dir.join("checkpoints");
    let mut found: Vec<(usize, PathBuf)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix("step-")?.parse::<usize>().ok()?;
            let path = entry.path();
            path.join("state.json").is_file().then_some((step, path))
        })
        .collect();
    found.sort();
    found
}

/// The newest complete checkpoint of a run.
pub fn latest_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    list_checkpoints(run_dir).pop().map(|(_, p)| p)
}

/// Remove `*.tmp` leftovers of an interrupted checkpoint write.
pub fn remove_partial_checkpoints(run_dir: &Path) {
    let dir = run_dir.join("checkpoints");
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".tmp") {
            tracing::warn!("removing incomplete checkpoint {}", entry.path().display());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn fsync(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| TrainError::io("sync", path, e))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| TrainError::io("write", path, e))?;
    fsync(path)
}

/// Test hook: abort the process half-way through writing checkpoint `step`
/// (`QWEN_BURN_ABORT_IN_CHECKPOINT=step`), to prove a kill never tears the latest checkpoint.
fn maybe_abort_in_checkpoint(step: usize) {
    if std::env::var("QWEN_BURN_ABORT_IN_CHECKPOINT")
        .ok()
        .and_then(|v| v.parse().ok())
        == Some(step)
    {
        eprintln!("QWEN_BURN_ABORT_IN_CHECKPOINT: aborting while writing checkpoint {step}");
        std::process::abort();
    }
}

/// Write a checkpoint atomically and return its directory.
pub fn save_checkpoint(
    run_dir: &Path,
    state: &TrainState,
    model: &Qwen3ForCausalLM,
    optimizer: &ModuleOptimizer,
    run_toml: &str,
) -> Result<PathBuf> {
    let parent = run_dir.join("checkpoints");
    std::fs::create_dir_all(&parent).map_err(|e| TrainError::io("create directory", &parent, e))?;
    let name = step_dir_name(state.step);
    let tmp = parent.join(format!("{name}.tmp"));
    let final_dir = parent.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| TrainError::io("remove", &tmp, e))?;
    }
    std::fs::create_dir(&tmp).map_err(|e| TrainError::io("create directory", &tmp, e))?;
    // A failed write (a full disk) removes its partial directory at once instead of leaving it
    // for the next start.
    write_checkpoint_files(&tmp, state, model, optimizer, run_toml).inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&tmp);
    })?;

    if final_dir.exists() {
        // Re-saving a step (e.g. the final step after a resume that had nothing left to do).
        std::fs::remove_dir_all(&final_dir).map_err(|e| TrainError::io("remove", &final_dir, e))?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(|e| TrainError::io("rename", &tmp, e))?;
    fsync(&parent)?;
    Ok(final_dir)
}

/// The files of a checkpoint, each fsynced, `state.json` last.
fn write_checkpoint_files(
    tmp: &Path,
    state: &TrainState,
    model: &Qwen3ForCausalLM,
    optimizer: &ModuleOptimizer,
    run_toml: &str,
) -> Result<()> {
    let model_path = tmp.join("model.bpk");
    model
        .clone()
        .into_record()
        .save(&model_path)
        .map_err(|e| TrainError::Checkpoint {
            path: model_path.clone(),
            reason: e.to_string(),
        })?;
    fsync(&model_path)?;
    maybe_abort_in_checkpoint(state.step);
    let optim_path = tmp.join("optimizer.bpk");
    optimizer
        .save(&optim_path)
        .map_err(|e| TrainError::Checkpoint {
            path: optim_path.clone(),
            reason: e.to_string(),
        })?;
    fsync(&optim_path)?;
    let config =
        serde_json::to_string_pretty(&model.config.to_hf_json()).expect("config serialises");
    write_file(&tmp.join("config.json"), config.as_bytes())?;
    write_file(&tmp.join("run.toml"), run_toml.as_bytes())?;
    let mut state = state.clone();
    for name in HASHED_FILES {
        state
            .sha256
            .insert(name.to_string(), sha256_file(&tmp.join(name))?);
    }
    let state_json = serde_json::to_string_pretty(&state).expect("state serialises");
    write_file(&tmp.join("state.json"), state_json.as_bytes())?;
    fsync(tmp)
}

/// Keep the newest `keep_last` checkpoints and, with `keep_best`, the one with the lowest
/// validation loss; delete the rest.
pub fn apply_retention(run_dir: &Path, keep_last: usize, keep_best: bool) -> Result<()> {
    let all = list_checkpoints(run_dir);
    let best = if keep_best {
        all.iter()
            .filter_map(|(step, path)| load_state(path).ok()?.val_loss.map(|l| (l, *step)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, step)| step)
    } else {
        None
    };
    let cutoff = all.len().saturating_sub(keep_last);
    for (i, (step, path)) in all.iter().enumerate() {
        if i < cutoff && Some(*step) != best {
            std::fs::remove_dir_all(path).map_err(|e| TrainError::io("remove", path, e))?;
        }
    }
    Ok(())
}

/// Read `state.json` of a checkpoint.
pub fn load_state(dir: &Path) -> Result<TrainState> {
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io("read", &path, e))?;
    let state: TrainState = serde_json::from_str(&text).map_err(|e| TrainError::Checkpoint {
        path: dir.to_path_buf(),
        reason: format!("state.json: {e}"),
    })?;
    if state.format_version != FORMAT_VERSION {
        return Err(TrainError::Checkpoint {
            path: dir.to_path_buf(),
            reason: format!(
                "format version {} is not supported (expected {FORMAT_VERSION})",
                state.format_version
            ),
        });
    }
    Ok(state)
}

/// The parameter group LoRA adapts: the 2-D weights of the named projections.
pub fn lora_group(lora: &LoraConfig) -> ParamGroup {
    let names: Vec<&str> = lora.targets.iter().map(|t| t.as_str()).collect();
    let pattern = format!(r"\.({})\.weight$", names.join("|"));
    ParamGroup::from_regex(pattern).expect("projection names form a valid regex")
}

/// Attach LoRA adapters to `model`, its matrices first stored as `lora.base_dtype` says (a
/// no-op when they already are). The adapters are f32 whatever the base's storage.
pub fn apply_lora(model: Qwen3ForCausalLM, lora: &LoraConfig) -> Qwen3ForCausalLM {
    let model = match lora.base_dtype {
        BaseDtype::F32 => model,
        BaseDtype::Bf16 => model.with_matrices(DType::BF16),
    };
    model.apply_lora(
        Lora::new(lora.rank, lora.alpha)
            .set_param_group(lora_group(lora))
            .set_dtype(FloatDType::F32),
    )
}

/// Rebuild the model of a checkpoint on `device`.
pub fn load_checkpoint_model(dir: &Path, device: &Device) -> Result<Qwen3ForCausalLM> {
    let state = load_state(dir)?;
    verify_checkpoint(dir, &state)?;
    let config_path = dir.join("config.json");
    let config = Qwen3Config::from_file(&config_path)?;
    config.check_fits_in_memory(&format!("the model of {}", config_path.display()))?;
    let mut model = Qwen3ForCausalLM::new(&config, device);
    if let Some(lora) = &state.lora {
        model = apply_lora(model, lora);
    }
    let path = dir.join("model.bpk");
    let record = ModuleRecord::load(&path).map_err(|e| TrainError::Checkpoint {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    model
        .try_load_record(record)
        .map_err(|e| TrainError::Checkpoint {
            path,
            reason: e.to_string(),
        })
}

/// What a model path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelDir {
    /// One of our checkpoints (`state.json` + `model.bpk`).
    Checkpoint(PathBuf),
    /// An HF model directory (`config.json` + safetensors).
    Hf(PathBuf),
}

impl ModelDir {
    /// The `config.json` of the model.
    pub fn config_path(&self) -> PathBuf {
        match self {
            ModelDir::Checkpoint(p) | ModelDir::Hf(p) => p.join("config.json"),
        }
    }
}

/// Resolve a model path: a checkpoint directory, a run directory (its newest checkpoint), or an
/// HF model directory, in that order; a hub id (`Qwen/Qwen3-0.6B[@rev]`) that names no path is
/// its snapshot in the Hugging Face cache ([`qwen_burn_model::hub`]).
pub fn resolve_model_dir(path: &Path) -> Result<ModelDir> {
    let path = &qwen_burn_model::hub::resolve(path)?;
    if path.join("state.json").is_file() {
        Ok(ModelDir::Checkpoint(path.to_path_buf()))
    } else if let Some(latest) = latest_checkpoint(path) {
        Ok(ModelDir::Checkpoint(latest))
    } else if path.join("run.toml").is_file() {
        Err(TrainError::Checkpoint {
            path: path.to_path_buf(),
            reason: "this run directory has no complete checkpoint yet".into(),
        })
    } else if path.join("config.json").is_file() {
        Ok(ModelDir::Hf(path.to_path_buf()))
    } else {
        Err(TrainError::Checkpoint {
            path: path.to_path_buf(),
            reason: "neither an HF model directory (config.json), a checkpoint (state.json) nor a \
                     run directory with checkpoints"
                .into(),
        })
    }
}

/// A file that belongs with a model: `name` in the model directory, or in its parent or
/// grandparent (a checkpoint's run directory holds `tokenizer.json` and
/// `generation_config.json` for all its checkpoints).
pub fn find_beside(model_path: &Path, name: &str) -> Option<PathBuf> {
    model_path
        .ancestors()
        .take(3)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Load from the newest complete checkpoint of `run_dir` that `load` accepts. A newer one that
/// fails to load (a corrupt or truncated file) is reported on stderr, naming it and why, and
/// skipped; nothing is deleted. When none loads, the newest one's error is returned. A
/// checkpoint that vanishes while being read (retention by a run still training) is skipped
/// silently.
pub fn load_newest_good<T>(
    run_dir: &Path,
    mut load: impl FnMut(&Path) -> Result<T>,
) -> Result<(PathBuf, T)> {
    let all = list_checkpoints(run_dir);
    let mut first_error = None;
    for (_, dir) in all.iter().rev() {
        match load(dir) {
            Ok(value) => return Ok((dir.clone(), value)),
            Err(_) if !dir.join("state.json").is_file() => continue,
            Err(e) => {
                eprintln!(
                    "warning: checkpoint {} cannot be loaded ({e}); falling back to the previous \
                     complete checkpoint (the unreadable one is kept for inspection)",
                    dir.display()
                );
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or_else(|| TrainError::Checkpoint {
        path: run_dir.to_path_buf(),
        reason: "this run directory has no complete checkpoint".into(),
    }))
}

/// Move unreadable checkpoints newer than the one a run resumes from out of the checkpoint
/// list (`step-N` -> `step-N.corrupt`), so that the resumed run neither overwrites nor, by
/// retention, deletes them, and no reader picks them again. Returns the new paths.
pub fn set_aside_newer(run_dir: &Path, resumed_step: usize) -> Result<Vec<PathBuf>> {
    let mut moved = Vec::new();
    for (step, dir) in list_checkpoints(run_dir) {
        if step <= resumed_step {
            continue;
        }
        let name = step_dir_name(step);
        let mut aside = dir.with_file_name(format!("{name}.corrupt"));
        let mut n = 1;
        while aside.exists() {
            aside = dir.with_file_name(format!("{name}.corrupt.{n}"));
            n += 1;
        }
        std::fs::rename(&dir, &aside).map_err(|e| TrainError::io("rename", &dir, e))?;
        moved.push(aside);
    }
    Ok(moved)
}

/// Load a model from an HF directory, a checkpoint directory, or a run directory (its newest
/// checkpoint that loads, see [`load_newest_good`]), with LoRA adapters merged into the weights.
///
/// Safe while the run trains (no lock needed): checkpoints appear by an atomic rename, and if
/// retention deletes the one being read, the next newest is read.
pub fn load_model_merged(path: &Path, device: &Device) -> Result<Qwen3ForCausalLM> {
    if path.join("state.json").is_file() {
        return load_checkpoint_model(path, device).map(merged);
    }
    if !list_checkpoints(path).is_empty() {
        let (_, model) = load_newest_good(path, |dir| load_checkpoint_model(dir, device))?;
        return Ok(merged(model));
    }
    match resolve_model_dir(path)? {
        ModelDir::Checkpoint(dir) => load_checkpoint_model(&dir, device).map(merged),
        ModelDir::Hf(dir) => Ok(Qwen3ForCausalLM::from_pretrained(&dir, device)?),
    }
}

/// The adapters merged into the weights, in f32: a bf16 LoRA base is widened first, so the
/// merged weight is `bf16(W) + scale * A B` rounded once, to f32.
fn merged(model: Qwen3ForCausalLM) -> Qwen3ForCausalLM {
    model.with_matrices(DType::F32).materialize()
}

/// Load a model for inference (no autodiff) from any path [`resolve_model_dir`] accepts.
pub fn load_model_any(path: &Path, device: &Device) -> Result<Qwen3ForCausalLM> {
    Ok(load_model_merged(path, device)?.valid().materialize())
}
