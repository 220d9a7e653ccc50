//! Where a run starts: fresh (the model built or read from `model.from`), resumed from its
//! newest good checkpoint after [`super::resume::check_resume`], or branched from another run's
//! checkpoint; and the files a run copies from an HF source model.

use std::path::{Path, PathBuf};

use burn::optim::ModuleOptimizer;
use burn::tensor::{DType, Device};
use qwen_burn_model::init::{init_lora_adapters, init_weights_as};
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};

use super::checkpoint::{
    FORMAT_VERSION, ModelDir, TrainState, apply_lora, latest_checkpoint, load_checkpoint_model,
    load_model_merged, load_newest_good, load_state, remove_partial_checkpoints, resolve_model_dir,
    set_aside_newer,
};
use super::resume::{check_resume, read_run_toml};
use crate::config::{ModelSource, RunConfig};
use crate::error::{Result, TrainError};
use crate::optim::build_optimizer;

/// `git rev-parse HEAD` of the source tree this binary was built from (see `build.rs`), or
/// "unknown" when it was built outside a git checkout.
pub const GIT_REVISION: &str = env!("QWEN_BURN_GIT_REVISION");

/// Build (or restore) the model for a run.
pub fn build_model(config: &RunConfig, device: &Device) -> Result<Qwen3ForCausalLM> {
    // A bf16 LoRA base is cast tensor by tensor as it is drawn or read, so the f32 model never
    // exists whole (a 4B model: 16 GB in f32, 8 GB in bf16).
    let matrices = config
        .lora
        .as_ref()
        .map_or(DType::F32, |lora| lora.base_dtype.dtype());
    let model = match &config.model {
        ModelSource::Scratch(model_config) => init_weights_as(
            Qwen3ForCausalLM::new(model_config, device),
            config.training.seed,
            matrices,
        ),
        ModelSource::Pretrained(path) => match resolve_model_dir(path)? {
            ModelDir::Hf(dir) => Qwen3ForCausalLM::from_pretrained_as(&dir, device, matrices)?,
            ModelDir::Checkpoint(_) => load_model_merged(path, device)?,
        },
    };
    Ok(match &config.lora {
        // Adapters drawn from the run's seed: the same run starts from the same adapters.
        Some(lora) => init_lora_adapters(apply_lora(model, lora), config.training.seed),
        None => model,
    })
}

/// The model config of a run: its `[model]` table, or the `config.json` of `model.from`.
pub fn model_config_of(config: &RunConfig) -> Result<Qwen3Config> {
    match &config.model {
        ModelSource::Scratch(c) => Ok((**c).clone()),
        ModelSource::Pretrained(path) => match resolve_model_dir(path) {
            Ok(dir) => Ok(Qwen3Config::from_file(&dir.config_path())?),
            // A hub id that is not cached: where it looked, and the download command.
            Err(TrainError::Model(e @ qwen_burn_model::ModelError::Hub { .. })) => {
                Err(TrainError::config("model.from", e.to_string()))
            }
            Err(_) => Err(TrainError::config(
                "model.from",
                format!(
                    "{} is neither an HF model directory (config.json), a checkpoint nor a run \
                     directory with checkpoints",
                    path.display()
                ),
            )),
        },
    }
}

/// The files of an HF model directory besides its weights and `config.json` that HF tools read
/// with it: the generation defaults, and the tokenizer's configuration (where Qwen3 keeps its
/// chat template; transformers 4.43 and later write it to `chat_template.jinja`) and
/// special-token files. A run copies them from an HF `model.from` (or from
/// the run a checkpoint belongs to), and `export` ships them.
pub const MODEL_SIDE_FILES: &[&str] = &[
    "generation_config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
];

/// Copy [`MODEL_SIDE_FILES`] of an HF source model into the run directory (each through a
/// temporary file), so that `generate` on the run uses the model's own stop tokens and
/// sampling defaults and an export of the run keeps the chat template.
pub fn copy_generation_config(config: &RunConfig, run_dir: &Path) -> Result<()> {
    let ModelSource::Pretrained(path) = &config.model else {
        return Ok(());
    };
    let source = match resolve_model_dir(path)? {
        ModelDir::Hf(dir) => dir,
        ModelDir::Checkpoint(dir) => match dir.parent().and_then(Path::parent) {
            Some(run) => run.to_path_buf(),
            None => return Ok(()),
        },
    };
    for name in MODEL_SIDE_FILES {
        let src = source.join(name);
        if src.is_file() {
            crate::files::copy_replacing(&src, &run_dir.join(name))?;
        }
    }
    Ok(())
}

/// Start `run_dir` as a branch of another run: copy the checkpoint `from` (after checking its
/// hashes) into `run_dir/checkpoints/`, and the parent run's `metrics.jsonl` and
/// `samples.jsonl` (the resume that follows cuts them at the branch step), and record the
/// origin in `run_dir/branch.json`. The run then resumes from that checkpoint with its own
/// config: a shorter `max_steps` under a WSD schedule cools the parent down from there.
pub fn branch_from(from: &Path, run_dir: &Path) -> Result<usize> {
    if latest_checkpoint(run_dir).is_some() {
        return Err(TrainError::Checkpoint {
            path: run_dir.to_path_buf(),
            reason: "--from-checkpoint starts a new run, but this run directory already has \
                     checkpoints; choose another --run-dir"
                .into(),
        });
    }
    let state = load_state(from)?;
    super::checkpoint::verify_checkpoint(from, &state)?;
    let name = from
        .file_name()
        .ok_or_else(|| TrainError::Checkpoint {
            path: from.to_path_buf(),
            reason: "expected a checkpoint directory (RUN/checkpoints/step-N)".into(),
        })?
        .to_owned();
    let dest_parent = run_dir.join("checkpoints");
    let tmp = dest_parent.join(format!("{}.tmp", name.to_string_lossy()));
    std::fs::create_dir_all(&tmp).map_err(|e| TrainError::io("create directory", &tmp, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| TrainError::io("read", from, e))? {
        let entry = entry.map_err(|e| TrainError::io("read", from, e))?;
        if entry.path().is_file() {
            let dest = tmp.join(entry.file_name());
            std::fs::copy(entry.path(), &dest)
                .map_err(|e| TrainError::io("copy", entry.path(), e))?;
        }
    }
    let dest = dest_parent.join(&name);
    std::fs::rename(&tmp, &dest).map_err(|e| TrainError::io("rename", &tmp, e))?;
    let parent_run = from.parent().and_then(Path::parent);
    if let Some(parent) = parent_run {
        for file in ["metrics.jsonl", "samples.jsonl"] {
            let src = parent.join(file);
            if src.is_file() {
                crate::files::copy_replacing(&src, &run_dir.join(file))?;
            }
        }
    }
    // Paths as text: a path that is not UTF-8 is written with U+FFFD for its odd bytes (JSON
    // holds only text), never a panic.
    let text = |p: &Path| {
        std::fs::canonicalize(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .to_string_lossy()
            .into_owned()
    };
    let record = serde_json::json!({
        "parent_checkpoint": text(from),
        "parent_run": parent_run.map(text),
        "step": state.step,
    });
    crate::files::write_replacing(&run_dir.join("branch.json"), format!("{record:#}\n"))?;
    Ok(state.step)
}

/// Where a run starts: its model, optimizer, training state, and the checkpoint it resumed from.
pub struct Start {
    /// The model (LoRA adapters attached when configured).
    pub model: Qwen3ForCausalLM,
    /// AdamW with its moments (restored on resume).
    pub optimizer: ModuleOptimizer,
    /// Step, tokens, data cursor, ...
    pub state: TrainState,
    /// The checkpoint resumed from, if any.
    pub resumed_from: Option<PathBuf>,
}

/// A fresh start, or (`resume`) the newest complete checkpoint of `run_dir` after the checks of
/// [`check_resume`]. A fresh start refuses a run directory that already has checkpoints.
pub fn start_run(
    config: &RunConfig,
    run_dir: &Path,
    resume: bool,
    model_config: &Qwen3Config,
    device: &Device,
) -> Result<Start> {
    remove_partial_checkpoints(run_dir);
    if !resume && latest_checkpoint(run_dir).is_some() {
        return Err(TrainError::Checkpoint {
            path: run_dir.to_path_buf(),
            reason: "the run directory already has checkpoints; pass --resume to continue it or \
                     choose another --run-dir"
                .into(),
        });
    }
    let resumed = if resume {
        if latest_checkpoint(run_dir).is_none() {
            return Err(TrainError::Checkpoint {
                path: run_dir.to_path_buf(),
                reason: "--resume given but the run directory has no complete checkpoint".into(),
            });
        }
        // The newest checkpoint whose every file loads; a corrupt newer one is skipped (and,
        // below, set aside), never deleted.
        let (dir, (state, model, optimizer)) = load_newest_good(run_dir, |dir| {
            let state = load_state(dir)?;
            let model = load_checkpoint_model(dir, device)?;
            let optim_path = dir.join("optimizer.bpk");
            let optimizer = build_optimizer(&model, &config.optimizer)
                .load(&optim_path)
                .map_err(|e| TrainError::Checkpoint {
                    path: optim_path,
                    reason: e.to_string(),
                })?;
            read_run_toml(dir)?;
            Ok((state, model, optimizer))
        })?;
        Some((dir, state, model, optimizer))
    } else {
        None
    };
    let resumed_from = resumed.as_ref().map(|(dir, ..)| dir.clone());
    let (model, optimizer, state) = match resumed {
        Some((dir, state, mut model, optimizer)) => {
            for notice in check_resume(&dir, config, model_config)? {
                eprintln!("resume: changed since the checkpoint: {notice}");
            }
            for aside in set_aside_newer(run_dir, state.step)? {
                eprintln!(
                    "warning: the unreadable newer checkpoint is kept as {} (the run continues \
                     from {})",
                    aside.display(),
                    dir.display()
                );
            }
            // Same architecture (checked above); the hyperparameters are this run's.
            model.config = model_config.clone();
            (model, optimizer, state)
        }
        None => {
            let model = build_model(config, device)?;
            let optimizer = build_optimizer(&model, &config.optimizer);
            let state = TrainState {
                format_version: FORMAT_VERSION,
                step: 0,
                tokens_seen: 0,
                non_padding_tokens_seen: Some(0),
                data_cursor: None,
                seed: config.training.seed,
                val_loss: None,
                elapsed_secs: 0.0,
                git_revision: GIT_REVISION.into(),
                lora: config.lora.clone(),
                sha256: Default::default(),
            };
            (model, optimizer, state)
        }
    };
    Ok(Start {
        model,
        optimizer,
        state,
        resumed_from,
    })
}
