//! Training for qwen-burn: run configs, the autodiff training loop (AdamW, warmup + cosine,
//! global-norm clipping, gradient accumulation, MoE losses and balancing), metrics, step
//! checkpoints with exact resume, fine-tuning (full or LoRA), plots and benchmarks.
//!
//! Files in reading order: [`config`], [`data`], [`schedule`], [`optim`], [`step`], [`trainer`], [`eval`],
//! [`guard`], [`checkpoint`], [`resume`], [`lock`], [`metrics`], [`dashboard`], [`plot`].

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod dashboard;
pub mod data;
pub mod error;
pub mod eval;
pub mod guard;
pub mod hooks;
pub mod lock;
pub mod memory;
pub mod metrics;
pub mod muon;
pub mod optim;
pub mod parallel;
pub mod peak;
pub mod plot;
pub mod records;
pub mod refused;
pub mod resume;
pub mod schedule;
pub mod signals;
pub mod step;
pub mod step_stats;
pub mod tasks;
pub mod trainer;

pub use config::RunConfig;
pub use error::{Result, TrainError};
pub use trainer::{RunOptions, RunSummary, train};
