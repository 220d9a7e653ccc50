//! The sections of a run config, with their defaults. Every section is `deny_unknown_fields`,
//! and choices are enums, so a typo is an error naming the key and the accepted values.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use super::data_keys::{DataConfig, DataKind};
use super::training_choices::{ActivationCheckpointing, Precision, Reproducible};

/// `[optimizer]`: AdamW, every hyperparameter explicit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Peak learning rate. Required.
    pub lr: f64,
    /// Adam beta1.
    pub beta1: f64,
    /// Adam beta2.
    pub beta2: f64,
    /// Adam epsilon (PyTorch's default 1e-8, not Burn's 1e-5).
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices (linear and embedding weights) only; norm
    /// gains, biases and routing biases are not decayed (nanoGPT / GPT-3 convention).
    pub weight_decay: f64,
    /// Clip the global gradient L2 norm to this value (`torch.nn.utils.clip_grad_norm_`); 0 = off.
    pub grad_clip: f64,
    /// `"adamw"` for every parameter, or `"muon"` for the hidden matrices (AdamW, with the
    /// settings above, for the rest).
    pub kind: OptimizerKind,
    /// `[optimizer.muon]`: the Muon group's settings (`kind = "muon"` only).
    pub muon: MuonSettings,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            lr: 0.0,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            kind: OptimizerKind::AdamW,
            muon: MuonSettings::default(),
        }
    }
}

/// `optimizer.kind`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// AdamW everywhere.
    #[default]
    AdamW,
    /// Muon on the 2-D hidden matrices (attention and MLP projections, each MoE expert's own,
    /// LoRA adapters of those), AdamW on embeddings, the LM head, norms, routers and vectors.
    Muon,
}

impl OptimizerKind {
    /// The name as written in configs.
    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerKind::AdamW => "adamw",
            OptimizerKind::Muon => "muon",
        }
    }
}

/// `optimizer.muon.adjust_lr`: how a matrix's shape scales the Muon learning rate, as
/// `torch.optim.Muon`'s `adjust_lr_fn` means it, for a weight of `out` outputs and `in` inputs.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AdjustLr {
    /// Keller Jordan's `sqrt(max(1, out / in))`.
    #[default]
    Original,
    /// Moonlight's `0.2 * sqrt(max(out, in))`: an update RMS like AdamW's, so AdamW's learning
    /// rate and weight decay carry over.
    MatchRmsAdamw,
}

/// `[optimizer.muon]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MuonSettings {
    /// Peak learning rate of the Muon group (the schedule scales it as it scales
    /// `optimizer.lr`).
    pub lr: f64,
    /// Decoupled weight decay of the Muon group (`w *= 1 - lr * weight_decay`).
    pub weight_decay: f64,
    /// Momentum (Nesterov).
    pub momentum: f64,
    /// Newton-Schulz iterations (quintic, coefficients 3.4445, -4.7750, 2.0315).
    pub ns_steps: usize,
    /// The learning-rate scale by shape.
    pub adjust_lr: AdjustLr,
}

impl Default for MuonSettings {
    fn default() -> Self {
        Self {
            lr: 0.02,
            weight_decay: 0.0,
            momentum: 0.95,
            ns_steps: 5,
            adjust_lr: AdjustLr::Original,
        }
    }
}

/// `schedule.decay`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// Half a cosine from the peak to `min_lr`.
    #[default]
    Cosine,
    /// A straight line from the peak to `min_lr`.
    Linear,
    /// The peak throughout (after warmup).
    Constant,
    /// Warmup-stable-decay ("trapezoidal"): the peak until the last `decay_fraction` of the
    /// run, then `decay_shape` down to `min_lr`, reached at the last step.
    Wsd,
}

/// `schedule.decay_shape`: the shape of a WSD run's final decay.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DecayShape {
    /// A straight line.
    #[default]
    Linear,
    /// Half a cosine.
    Cosine,
    /// `1 - sqrt(progress)` (MiniCPM / "Scaling Laws and Compute-Optimal Training Beyond
    /// Fixed Training Durations"): fast at first, flat at the end.
    Sqrt,
}

/// `[schedule]`: linear warmup, then cosine (or linear, or constant, or warmup-stable-decay)
/// decay to `min_lr`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    /// Warmup steps (lr rises linearly from lr/warmup to lr); clipped to a shorter run.
    pub warmup_steps: usize,
    /// Final learning rate (0 allowed).
    pub min_lr: f64,
    /// Decay after the warmup.
    pub decay: Decay,
    /// `decay = "wsd"`: the share of the run's steps spent decaying, at its end, in (0, 1].
    pub decay_fraction: f64,
    /// `decay = "wsd"`: the shape of that decay.
    pub decay_shape: DecayShape,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            warmup_steps: 0,
            min_lr: 0.0,
            decay: Decay::Cosine,
            decay_fraction: 0.2,
            decay_shape: DecayShape::Linear,
        }
    }
}

/// `training.on_nonfinite`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnNonFinite {
    /// Stop with an error naming the step and the first offending parameter.
    #[default]
    Stop,
    /// Drop the step's gradients (no update; the data and the schedule move on), as Megatron
    /// and fp16 loss scalers do. The run still stops after [`MAX_CONSECUTIVE_SKIPS`] skipped
    /// steps in a row, or when the weights themselves are no longer finite.
    Skip,
}

/// With `on_nonfinite = "skip"`, this many non-finite steps in a row stop the run.
pub const MAX_CONSECUTIVE_SKIPS: usize = 10;

/// `training.parallel`: how data-parallel replicas combine their gradients
/// (see `parallel.rs`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ParallelStrategy {
    /// `ddp` for several CUDA devices, `gather` otherwise.
    #[default]
    Auto,
    /// Sum on the first device (every backend).
    Gather,
    /// Burn's collective all-reduce (CUDA only).
    Ddp,
}

/// `[training]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingConfig {
    /// Seed of weight init and data order.
    pub seed: u64,
    /// Sequences per micro-batch. Required.
    pub batch_size: usize,
    /// Tokens per sequence. Required.
    pub seq_len: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// Optimizer steps (the schedule's length). Required.
    pub max_steps: usize,
    /// Default device (the `--device` flag wins).
    pub device: String,
    /// Validate every N steps (0 = only at the end).
    pub eval_interval: usize,
    /// Validation batches per evaluation.
    pub eval_batches: usize,
    /// Print a sample every N steps (0 = never).
    pub sample_interval: usize,
    /// Prompt of the periodic samples.
    pub sample_prompt: String,
    /// Length of the periodic samples.
    pub sample_tokens: usize,
    /// Temperature of the periodic samples (0 = greedy).
    pub sample_temperature: f32,
    /// What a NaN/Inf loss or gradient norm does: stop the run (default) or skip that step's
    /// update and go on.
    pub on_nonfinite: OnNonFinite,
    /// How data-parallel replicas combine gradients.
    pub parallel: ParallelStrategy,
    /// Use the fused Flex kernels (`qwen_burn_kernels`); `false` runs the composed Burn
    /// ops they replace, for A/B runs and debugging. Other backends always run the composed ops.
    /// Unset, `QWEN_BURN_FUSED_KERNELS=0` turns them off.
    pub fused_kernels: bool,
    /// `"layers"`: keep only each decoder layer's input from the forward and recompute the
    /// layer in the backward (less memory, one more forward of the stack per step); `"none"`
    /// (default) keeps every activation.
    pub activation_checkpointing: ActivationCheckpointing,
    /// What the run repeats bit for bit: `"rerun"` (default: the same config, seed and binary,
    /// at any thread count) or `"bitwise"` (also under any split of the global batch into
    /// micro-batches and replicas).
    pub reproducible: Reproducible,
    /// `"f32"` (default) or `"bf16"`: mixed precision, bf16 products with f32 accumulation and
    /// f32 weights (`Precision::Bf16`; fused Flex kernels only).
    pub precision: Precision,
}

impl Default for TrainingConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            batch_size: 0,
            seq_len: 0,
            grad_accum: 1,
            max_steps: 0,
            device: "flex".into(),
            eval_interval: 100,
            eval_batches: 10,
            sample_interval: 0,
            sample_prompt: String::new(),
            sample_tokens: 64,
            sample_temperature: 0.8,
            on_nonfinite: OnNonFinite::Stop,
            parallel: ParallelStrategy::Auto,
            fused_kernels: true,
            activation_checkpointing: ActivationCheckpointing::None,
            reproducible: Reproducible::Rerun,
            precision: Precision::F32,
        }
    }
}

/// `[checkpoint]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Save every N steps (0 = only at the end); the final step is always saved.
    pub interval: usize,
    /// Keep this many most recent checkpoints.
    pub keep_last: usize,
    /// Also keep the checkpoint with the lowest validation loss.
    pub keep_best: bool,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            interval: 0,
            keep_last: 2,
            keep_best: true,
        }
    }
}

/// `[eval]`: multiple-choice tasks scored during training (`qwen-burn eval --task` on the
/// run's model). Their metrics go into `metrics.jsonl` as `"split": "task"` records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Task files (JSONL or Parquet in a layout `qwen-burn eval --task` reads).
    pub tasks: Vec<PathBuf>,
    /// Score the tasks every N steps (and at step 0 and the last step); 0: with validation,
    /// every `training.eval_interval` steps.
    pub interval: usize,
    /// Score at most the first N questions of each task (0: all).
    pub limit: usize,
    /// Few-shot examples before each question.
    pub shots: usize,
    /// Seed of the few-shot draw.
    pub seed: u64,
    /// Few-shot splits, one per task in `tasks`' order (a train or dev split in the task's
    /// layout); empty: each task's other questions.
    pub fewshot_files: Vec<PathBuf>,
    /// How the examples are picked from a few-shot split: `random` (a seeded draw) or
    /// `first_n` (its first `shots` questions, as lm-evaluation-harness's MMLU).
    pub fewshot_sampler: FewshotSamplerKind,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            tasks: Vec::new(),
            interval: 0,
            limit: 0,
            shots: 0,
            seed: 1234,
            fewshot_files: Vec::new(),
            fewshot_sampler: FewshotSamplerKind::Random,
        }
    }
}

/// `eval.fewshot_sampler`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FewshotSamplerKind {
    /// A seeded uniform draw without replacement.
    #[default]
    Random,
    /// The split's first `shots` questions.
    FirstN,
}

impl FewshotSamplerKind {
    /// The data crate's sampler.
    pub fn sampler(self) -> qwen_burn_data::FewshotSampler {
        match self {
            FewshotSamplerKind::Random => qwen_burn_data::FewshotSampler::Random,
            FewshotSamplerKind::FirstN => qwen_burn_data::FewshotSampler::FirstN,
        }
    }
}

/// `[logging]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// Log training metrics every N steps.
    pub interval: usize,
    /// Show burn-train's live dashboard (plots, progress and ETA, a stop key that writes a
    /// checkpoint) instead of progress lines, when stdout is a terminal; `train --tui` sets it.
    pub dashboard: bool,
    /// Peak TFLOP/s of one device of the named kind, for MFU, e.g. `{ cuda = 67.0 }`. It applies
    /// to that device kind only; other kinds use the peak measured by `qwen-burn bench peak`
    /// (cached per machine), else the backend's assumed figure.
    pub peak_tflops: PeakTflops,
    /// Also write every scalar of `metrics.jsonl` as TensorBoard event files in
    /// `RUN/tensorboard/` (`tensorboard --logdir runs`).
    pub tensorboard: bool,
}

/// `logging.peak_tflops`: a peak per device kind (TFLOP/s of one device).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(
    deny_unknown_fields,
    expecting = "a table of TFLOP/s per device kind (flex, ndarray, wgpu, cuda), e.g. \
                 `{ cuda = 67.0 }`: a figure applies to its device kind only"
)]
pub struct PeakTflops {
    /// The Flex CPU backend.
    pub flex: Option<f64>,
    /// The NdArray CPU backend.
    pub ndarray: Option<f64>,
    /// One wgpu adapter.
    pub wgpu: Option<f64>,
    /// One CUDA GPU.
    pub cuda: Option<f64>,
}

impl PeakTflops {
    /// The configured peak of `kind` in FLOP/s, if any.
    pub fn for_kind(&self, kind: qwen_burn_model::BackendKind) -> Option<f64> {
        use qwen_burn_model::BackendKind;
        let tflops = match kind {
            BackendKind::Flex => self.flex,
            BackendKind::Ndarray => self.ndarray,
            BackendKind::Wgpu => self.wgpu,
            BackendKind::Cuda(_) => self.cuda,
        };
        tflops.map(|t| t * 1e12)
    }
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            interval: 10,
            dashboard: false,
            peak_tflops: PeakTflops::default(),
            tensorboard: false,
        }
    }
}
