//! A prepared run: what [`super::setup::prepare`] hands the loop ([`Loop`], and the
//! [`Start`] it trains from).

use std::path::PathBuf;

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use qwen_burn_data::McTask;
use qwen_burn_model::{DeviceSet, Qwen3ForCausalLM};

use super::checkpoint::TrainState;
use super::data::DataPipeline;
use super::lock::RunLock;
use crate::config::{EvalConfig, RunConfig};
use crate::eval::tasks::{DEFAULT_BATCH, TaskOptions};
use crate::observe::log::MetricsLog;
use crate::observe::tensorboard::EventWriter;
use crate::step::{Replicas, Step};

/// Where the loop starts: the model, its optimizer and the training state.
pub(super) type Start = (Qwen3ForCausalLM, ModuleOptimizer, TrainState);

/// A prepared run: its config, devices, data, outputs and step. Its phases are in
/// [`super::steps`], the work between steps in [`super::side`].
pub(super) struct Loop<'a> {
    pub(super) config: &'a RunConfig,
    /// The objective and the per-run options of the gradient.
    pub(super) step: Step<'a>,
    pub(super) device: Device,
    pub(super) replicas: Replicas,
    pub(super) devices: DeviceSet,
    pub(super) run_dir: PathBuf,
    pub(super) run_toml: String,
    pub(super) metrics: MetricsLog,
    pub(super) samples: MetricsLog,
    pub(super) data: DataPipeline,
    /// Bytes of text per token id, for bits per byte.
    pub(super) token_bytes: Vec<u32>,
    /// The `[eval]` tasks, read before training starts.
    pub(super) tasks: Vec<McTask>,
    /// The memory estimate, for the header.
    pub(super) memory_line: String,
    /// TensorBoard's event file (`logging.tensorboard`).
    pub(super) tensorboard: Option<EventWriter>,
    /// Held until the run ends: one writer per run directory.
    pub(super) _lock: RunLock,
}

/// How a run scores its `[eval]` tasks.
pub(super) fn task_options(e: &EvalConfig) -> TaskOptions {
    TaskOptions {
        shots: e.shots,
        limit: (e.limit > 0).then_some(e.limit),
        seed: e.seed,
        batch: DEFAULT_BATCH,
    }
}
