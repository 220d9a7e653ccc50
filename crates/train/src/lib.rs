//! Training for qwen-burn: run configs, the training loop (AdamW or Muon, schedules,
//! global-norm clipping, gradient accumulation, MoE losses and balancing), step checkpoints
//! with exact resume, fine-tuning (full or LoRA), evaluation, metrics, plots and benchmarks.
//!
//! Rooms, in reading order:
//! - [`config`]: the run config (TOML), checked before anything runs.
//! - [`run`]: a run from start to last checkpoint: setup, the loop in phases, resume,
//!   checkpoints, the lock, the NaN guard, signals, the data pipeline, the memory check.
//! - [`objective`]: what a step differentiates ([`objective::Objective`]): next-token
//!   cross-entropy so far.
//! - [`step`]: one step's gradient, common to every objective: forward, router losses,
//!   accumulation, activation checkpointing, replicas, the step's statistics.
//! - [`optim`]: AdamW, Muon, clipping, the learning-rate schedules, the routing-bias move.
//! - [`eval`]: validation, multiple-choice tasks, samples.
//! - [`observe`]: records, progress, dashboard, plots, MFU and the peak, benchmarks.

pub mod config;
pub mod error;
pub mod eval;
mod files;
pub mod objective;
pub mod observe;
pub mod optim;
pub mod run;
pub mod step;

pub use config::RunConfig;
pub use error::{Result, TrainError};
pub use run::{RunOptions, RunSummary, train};
