//! The run: a config-file training run from its start (fresh, resumed or branched) through
//! its steps to its last checkpoint, and what keeps it alive: the lock, the NaN guard,
//! checkpoints with exact resume, signals, the data pipeline and the memory check.
//!
//! Written by hand rather than with burn-train's `SupervisedTraining`: that runner checkpoints
//! per epoch only, restarts the data loader at an epoch boundary, clips per tensor and keeps a
//! stateful scheduler, while a pretraining run needs step checkpoints with the data cursor,
//! global-norm clipping and bit-exact resume.
//!
//! Files in the order a run meets them: [`setup`] (checks, then model, optimizer and data),
//! [`lock`], [`memory`], [`resume`] and [`start`] (where a run starts), [`data`], [`steps`] (the
//! loop, in phases), [`guard`], [`side`] (validation, tasks, samples and checkpoints between
//! steps), [`checkpoint`], [`signals`], [`refused`], [`hooks`] (test hooks).

pub mod checkpoint;
pub mod data;
pub mod guard;
pub mod hooks;
pub mod lock;
pub mod memory;
pub mod preference_data;
mod prepared;
pub mod prompt_data;
pub mod refused;
pub mod resume;
mod setup;
mod side;
pub mod signals;
pub mod start;
mod steps;

use std::path::{Path, PathBuf};

use qwen_burn_kernels::{in_pool, with_kernels};
use qwen_burn_model::DeviceSet;

use crate::config::RunConfig;
use crate::error::Result;

/// How to launch a run (what the CLI flags say).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Devices (override `training.device`).
    pub device: Option<DeviceSet>,
    /// Run directory (default `runs/<config file stem>`).
    pub run_dir: PathBuf,
    /// Continue from the newest good checkpoint in `run_dir`.
    pub resume: bool,
    /// Start `run_dir` from this checkpoint of another run (its weights, optimizer state and
    /// data cursor), with this run's config: see [`start::branch_from`].
    pub from_checkpoint: Option<PathBuf>,
}

/// Summary of a finished run.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Steps completed.
    pub step: usize,
    /// Last validation loss.
    pub val_loss: Option<f64>,
    /// Training wall time, seconds (this process).
    pub elapsed_secs: f64,
    /// Mean training tokens per second (this process).
    pub tokens_per_sec: f64,
    /// Directory of the final checkpoint.
    pub checkpoint: Option<PathBuf>,
    /// The run was stopped before `max_steps` with the dashboard's stop key or a signal (after
    /// writing the checkpoint of its last step).
    pub stopped: bool,
    /// The signal that stopped it (SIGTERM, SIGINT), if one did: `train` exits with
    /// `128 + signal`.
    pub stopped_by: Option<i32>,
}

/// Run (or resume) training as the config says.
///
/// The run executes on a thread of rayon's pool, so that the parallel kernels of each step share
/// their work with it instead of handing it off (`qwen_burn_kernels::in_pool`). Its options
/// (fused kernels, activation checkpointing, the objective) belong to this call: another run in
/// the same process keeps its own.
pub fn train(config: &RunConfig, opts: &RunOptions) -> Result<RunSummary> {
    in_pool(|| {
        let precision = config.training.precision.kernels();
        with_kernels(config.fused_kernels(), precision, || {
            let objective = crate::objective::of_run(config)?;
            let (run, start) = setup::prepare(config, opts, objective.as_ref())?;
            run.run(start)
        })
    })
}

/// Default run directory of a config file: `runs/<file stem>`.
pub fn default_run_dir(config_path: &Path) -> PathBuf {
    let stem = config_path
        .file_stem()
        .map_or("run".into(), |s| s.to_string_lossy().to_string());
    PathBuf::from("runs").join(stem)
}
