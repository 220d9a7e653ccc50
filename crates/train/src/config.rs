//! The run configuration: one TOML file with `[model] [data] [optimizer] [schedule] [training]
//! [checkpoint] [logging]` (and `[lora]` for LoRA fine-tuning).
//!
//! Every section is strict: an unknown key or a bad value is an error naming `section.key`.
//! `--set section.key=value` overrides go through the same parse-and-validate path. Relative
//! paths are relative to the working directory (run commands from the repository root).

use std::path::{Path, PathBuf};

use qwen_burn_model::Qwen3Config;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// Where the model comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// A new model with this architecture, initialised from `training.seed`.
    Scratch(Box<Qwen3Config>),
    /// An HF model directory or a qwen-burn checkpoint (fine-tuning).
    Pretrained(PathBuf),
}

/// `[data]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// `text`: packed windows of a tokenised corpus; `sft`: chat JSONL with assistant-only loss.
    #[serde(default = "default_kind")]
    pub kind: String,
    /// Corpus files or directories (text: .txt, .jsonl, .gz; sft: one JSONL file).
    pub inputs: Vec<PathBuf>,
    /// Validation inputs for `sft` (text splits `val_fraction` off the corpus instead).
    #[serde(default)]
    pub val_inputs: Vec<PathBuf>,
    /// HF tokenizer.json.
    pub tokenizer: PathBuf,
    /// Where prepared token shards go (default `.cache/shards/<hash of inputs and tokenizer>`).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Fraction of documents held out for validation (text).
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f64,
    /// JSONL field holding the text.
    #[serde(default = "default_text_field")]
    pub text_field: String,
    /// `random` windows from a seeded RNG, or `epochs` over a seeded shuffle of windows.
    #[serde(default = "default_sampling")]
    pub sampling: String,
    /// SFT: pack several conversations per row (true) or one per row, padded (false).
    #[serde(default = "default_true")]
    pub pack: bool,
    /// Batches prepared ahead by the background loader.
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,
}

/// `[optimizer]`: AdamW, every hyperparameter explicit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Adam beta1.
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    /// Adam beta2.
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    /// Adam epsilon (PyTorch's default 1e-8, not Burn's 1e-5).
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices (linear and embedding weights) only; norm
    /// gains, biases and routing biases are not decayed (nanoGPT / GPT-3 convention).
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f64,
    /// Clip the global gradient L2 norm to this value (`torch.nn.utils.clip_grad_norm_`); 0 = off.
    #[serde(default = "default_grad_clip")]
    pub grad_clip: f64,
}

/// `[schedule]`: linear warmup, then cosine (or linear, or constant) decay to `min_lr`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Warmup steps (lr rises linearly from lr/warmup to lr).
    #[serde(default)]
    pub warmup_steps: usize,
    /// Final learning rate.
    #[serde(default)]
    pub min_lr: f64,
    /// `cosine`, `linear` or `constant`.
    #[serde(default = "default_decay")]
    pub decay: String,
}

/// `[training]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    /// Seed of weight init and data order.
    #[serde(default)]
    pub seed: u64,
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Micro-batches per optimizer step.
    #[serde(default = "default_one")]
    pub grad_accum: usize,
    /// Optimizer steps (the schedule's length).
    pub max_steps: usize,
    /// Default device (the `--device` flag wins).
    #[serde(default = "default_device")]
    pub device: String,
    /// Validate every N steps (0 = only at the end).
    #[serde(default = "default_eval_interval")]
    pub eval_interval: usize,
    /// Validation batches per evaluation.
    #[serde(default = "default_eval_batches")]
    pub eval_batches: usize,
    /// Print a sample every N steps (0 = never).
    #[serde(default)]
    pub sample_interval: usize,
    /// Prompt of the periodic samples.
    #[serde(default)]
    pub sample_prompt: String,
    /// Length of the periodic samples.
    #[serde(default = "default_sample_tokens")]
    pub sample_tokens: usize,
    /// Temperature of the periodic samples (0 = greedy).
    #[serde(default = "default_sample_temperature")]
    pub sample_temperature: f32,
    /// What a NaN/Inf loss or gradient norm does: stop the run (default) or skip that step's
    /// update and go on.
    #[serde(default)]
    pub on_nonfinite: OnNonFinite,
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

/// `[checkpoint]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Save every N steps (0 = only at the end); the final step is always saved.
    #[serde(default)]
    pub interval: usize,
    /// Keep this many most recent checkpoints.
    #[serde(default = "default_keep_last")]
    pub keep_last: usize,
    /// Also keep the checkpoint with the lowest validation loss.
    #[serde(default = "default_true")]
    pub keep_best: bool,
}

/// `[logging]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    /// Log training metrics every N steps.
    #[serde(default = "default_log_interval")]
    pub interval: usize,
    /// Peak FLOP/s of the device in TFLOP/s, for MFU (default: see `metrics::default_peak_tflops`).
    #[serde(default)]
    pub peak_tflops: Option<f64>,
}

/// `[lora]`: train low-rank adapters on the chosen projections instead of all weights.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Adapter rank.
    pub rank: usize,
    /// Scale numerator (delta = alpha / rank * A B).
    pub alpha: f64,
    /// Projection names to adapt (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`).
    pub targets: Vec<String>,
}

/// The whole run config.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The `[model]` table as written (kept for checkpoints and diffs).
    pub model_table: toml::Table,
    /// Resolved model source.
    pub model: ModelSource,
    /// `[data]`.
    pub data: DataConfig,
    /// `[optimizer]`.
    pub optimizer: OptimizerConfig,
    /// `[schedule]`.
    pub schedule: ScheduleConfig,
    /// `[training]`.
    pub training: TrainingConfig,
    /// `[checkpoint]`.
    pub checkpoint: CheckpointConfig,
    /// `[logging]`.
    pub logging: LoggingConfig,
    /// `[lora]`.
    pub lora: Option<LoraConfig>,
    /// The full TOML after overrides (what checkpoints store as `run.toml`).
    pub table: toml::Table,
    /// Settings that were adjusted, for the trainer to print (e.g. a warmup clipped to a
    /// shorter run).
    pub notices: Vec<String>,
}

/// `[data]` keys that only one data kind reads; naming one for the other kind is an error.
const TEXT_ONLY_KEYS: &[&str] = &["cache_dir", "val_fraction", "text_field", "sampling"];
const SFT_ONLY_KEYS: &[&str] = &["val_inputs", "pack"];

fn default_kind() -> String {
    "text".into()
}
fn default_val_fraction() -> f64 {
    0.01
}
fn default_text_field() -> String {
    "text".into()
}
fn default_sampling() -> String {
    "random".into()
}
fn default_true() -> bool {
    true
}
fn default_prefetch() -> usize {
    4
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.95
}
fn default_eps() -> f64 {
    1e-8
}
fn default_weight_decay() -> f64 {
    0.1
}
fn default_grad_clip() -> f64 {
    1.0
}
fn default_decay() -> String {
    "cosine".into()
}
fn default_one() -> usize {
    1
}
fn default_device() -> String {
    "flex".into()
}
fn default_eval_interval() -> usize {
    100
}
fn default_eval_batches() -> usize {
    10
}
fn default_sample_tokens() -> usize {
    64
}
fn default_sample_temperature() -> f32 {
    0.8
}
fn default_keep_last() -> usize {
    2
}
fn default_log_interval() -> usize {
    10
}

const SECTIONS: &[&str] = &[
    "model",
    "data",
    "optimizer",
    "schedule",
    "training",
    "checkpoint",
    "logging",
    "lora",
];

/// Deserialise one section, naming it in the error.
fn section<T: DeserializeOwned>(
    table: &toml::Table,
    name: &str,
    required: bool,
) -> Result<Option<T>> {
    match table.get(name) {
        None if required => Err(TrainError::config(name, "required section is missing")),
        None => Ok(None),
        Some(value) => value
            .clone()
            .try_into::<T>()
            .map(Some)
            .map_err(|e| TrainError::config(name, e.message().to_string())),
    }
}

/// Parse `value` of a `--set key=value` as TOML, or as a bare string.
fn parse_override_value(value: &str) -> toml::Value {
    let doc = format!("v = {value}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(value.to_string())),
        Err(_) => toml::Value::String(value.to_string()),
    }
}

/// Apply `section.key=value` overrides to a TOML table.
pub fn apply_overrides(table: &mut toml::Table, overrides: &[String]) -> Result<()> {
    for item in overrides {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| TrainError::config(item.as_str(), "expected `section.key=value`"))?;
        let path: Vec<&str> = key.trim().split('.').collect();
        if path.len() < 2 {
            return Err(TrainError::config(key, "expected `section.key=value`"));
        }
        let mut node = &mut *table;
        for part in &path[..path.len() - 1] {
            let entry = node
                .entry(part.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            node = entry
                .as_table_mut()
                .ok_or_else(|| TrainError::config(key, format!("`{part}` is not a table")))?;
        }
        node.insert(
            path[path.len() - 1].to_string(),
            parse_override_value(value.trim()),
        );
    }
    Ok(())
}

/// Convert a TOML value to JSON (for the HF-style `[model]` table).
pub fn toml_to_json(value: &toml::Value) -> serde_json::Value {
    match value {
        toml::Value::String(s) => serde_json::Value::String(s.clone()),
        toml::Value::Integer(i) => serde_json::json!(i),
        toml::Value::Float(f) => serde_json::json!(f),
        toml::Value::Boolean(b) => serde_json::Value::Bool(*b),
        toml::Value::Datetime(d) => serde_json::Value::String(d.to_string()),
        toml::Value::Array(a) => serde_json::Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => serde_json::Value::Object(
            t.iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
        ),
    }
}

impl RunConfig {
    /// Read a TOML run config and apply `--set` overrides.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io("read", path, e))?;
        let mut table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| TrainError::Parse {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })?;
        apply_overrides(&mut table, overrides)?;
        Self::from_table(table)
    }

    /// Build and validate from a TOML table.
    pub fn from_table(table: toml::Table) -> Result<Self> {
        if let Some(key) = table.keys().find(|k| !SECTIONS.contains(&k.as_str())) {
            return Err(TrainError::config(
                key.as_str(),
                format!("unknown section (expected one of {})", SECTIONS.join(", ")),
            ));
        }
        let model_table = match table.get("model") {
            Some(toml::Value::Table(t)) => t.clone(),
            Some(_) => return Err(TrainError::config("model", "expected a table")),
            None => return Err(TrainError::config("model", "required section is missing")),
        };
        let model = match model_table.get("from") {
            Some(toml::Value::String(dir)) => {
                if let Some(other) = model_table.keys().find(|k| k.as_str() != "from") {
                    return Err(TrainError::config(
                        format!("model.{other}"),
                        "cannot be combined with `model.from` (the architecture comes from the checkpoint)",
                    ));
                }
                ModelSource::Pretrained(PathBuf::from(dir))
            }
            Some(_) => {
                return Err(TrainError::config(
                    "model.from",
                    "expected a directory path string",
                ));
            }
            None => {
                let json = toml_to_json(&toml::Value::Table(model_table.clone()));
                let config = Qwen3Config::from_json(&json, true).map_err(|e| match e {
                    qwen_burn_model::ModelError::InvalidConfig { field, reason } => {
                        TrainError::config(format!("model.{field}"), reason)
                    }
                    other => TrainError::Model(other),
                })?;
                ModelSource::Scratch(Box::new(config))
            }
        };
        let config = Self {
            model_table,
            model,
            data: section(&table, "data", true)?.expect("required"),
            optimizer: section(&table, "optimizer", true)?.expect("required"),
            schedule: section(&table, "schedule", false)?.unwrap_or(ScheduleConfig {
                warmup_steps: 0,
                min_lr: 0.0,
                decay: default_decay(),
            }),
            training: section(&table, "training", true)?.expect("required"),
            checkpoint: section(&table, "checkpoint", false)?.unwrap_or(CheckpointConfig {
                interval: 0,
                keep_last: default_keep_last(),
                keep_best: true,
            }),
            logging: section(&table, "logging", false)?.unwrap_or(LoggingConfig {
                interval: default_log_interval(),
                peak_tflops: None,
            }),
            lora: section(&table, "lora", false)?,
            table,
            notices: Vec::new(),
        };
        config.validate()?;
        config.check_data_keys()?;
        Ok(config.with_notices())
    }

    /// Keys of `[data]` written for the other data kind would be silently ignored: refuse them.
    fn check_data_keys(&self) -> Result<()> {
        let Some(data) = self.table.get("data").and_then(|d| d.as_table()) else {
            return Ok(());
        };
        let (unused, why) = match self.data.kind.as_str() {
            "sft" => (
                TEXT_ONLY_KEYS,
                "SFT reads whole conversations from the JSONL file in seeded shuffled epochs, \
                 validates on `data.val_inputs` (or the first training rows) and keeps no shard cache",
            ),
            _ => (
                SFT_ONLY_KEYS,
                "text runs split `data.val_fraction` off the corpus and always pack windows",
            ),
        };
        if let Some(key) = unused.iter().find(|k| data.contains_key(**k)) {
            return Err(TrainError::config(
                format!("data.{key}"),
                format!(
                    "is not used by data.kind = \"{}\" ({why}); remove it",
                    self.data.kind
                ),
            ));
        }
        Ok(())
    }

    /// Record the adjustments the run will make to what was written.
    fn with_notices(mut self) -> Self {
        let (warmup, steps) = (self.schedule.warmup_steps, self.training.max_steps);
        if warmup > steps {
            self.notices.push(format!(
                "warning: schedule.warmup_steps = {warmup} exceeds training.max_steps = {steps}; \
                 the warmup is clipped to {steps} steps (the learning rate reaches its peak at the last step)"
            ));
        }
        self
    }

    fn validate(&self) -> Result<()> {
        let t = &self.training;
        let positive = [
            ("training.batch_size", t.batch_size),
            ("training.seq_len", t.seq_len),
            ("training.grad_accum", t.grad_accum),
            ("training.max_steps", t.max_steps),
            ("training.eval_batches", t.eval_batches),
            ("logging.interval", self.logging.interval),
            ("checkpoint.keep_last", self.checkpoint.keep_last),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(TrainError::config(key, "must be at least 1"));
            }
        }
        let o = &self.optimizer;
        if o.lr.is_nan() || o.lr <= 0.0 {
            return Err(TrainError::config(
                "optimizer.lr",
                format!("must be > 0, found {}", o.lr),
            ));
        }
        for (key, beta) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(TrainError::config(
                    key,
                    format!("must be in [0, 1), found {beta}"),
                ));
            }
        }
        if o.eps.is_nan() || o.eps <= 0.0 || o.weight_decay < 0.0 || o.grad_clip < 0.0 {
            return Err(TrainError::config(
                "optimizer",
                "eps must be > 0, weight_decay and grad_clip >= 0",
            ));
        }
        let s = &self.schedule;
        if !["cosine", "linear", "constant"].contains(&s.decay.as_str()) {
            return Err(TrainError::config(
                "schedule.decay",
                format!(
                    "unknown decay `{}` (expected cosine, linear or constant)",
                    s.decay
                ),
            ));
        }
        if s.min_lr < 0.0 || s.min_lr > o.lr {
            return Err(TrainError::config(
                "schedule.min_lr",
                "must be in [0, optimizer.lr]",
            ));
        }
        let d = &self.data;
        if !["text", "sft"].contains(&d.kind.as_str()) {
            return Err(TrainError::config(
                "data.kind",
                format!("unknown kind `{}` (expected text or sft)", d.kind),
            ));
        }
        if !["random", "epochs"].contains(&d.sampling.as_str()) {
            return Err(TrainError::config(
                "data.sampling",
                format!(
                    "unknown sampling `{}` (expected random or epochs)",
                    d.sampling
                ),
            ));
        }
        if d.inputs.is_empty() {
            return Err(TrainError::config(
                "data.inputs",
                "list at least one file or directory",
            ));
        }
        if !(0.0..1.0).contains(&d.val_fraction) {
            return Err(TrainError::config("data.val_fraction", "must be in [0, 1)"));
        }
        if let Some(lora) = &self.lora {
            if lora.rank == 0 || lora.alpha.is_nan() || lora.alpha <= 0.0 {
                return Err(TrainError::config(
                    "lora",
                    "rank must be >= 1 and alpha > 0",
                ));
            }
            const KNOWN: &[&str] = &[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ];
            if lora.targets.is_empty() {
                return Err(TrainError::config(
                    "lora.targets",
                    "list at least one projection",
                ));
            }
            if let Some(bad) = lora.targets.iter().find(|t| !KNOWN.contains(&t.as_str())) {
                return Err(TrainError::config(
                    "lora.targets",
                    format!(
                        "unknown projection `{bad}` (expected some of {})",
                        KNOWN.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[model]
vocab_size = 64
hidden_size = 16
intermediate_size = 32
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
head_dim = 8
[data]
inputs = ["x.txt"]
tokenizer = "t.json"
[optimizer]
lr = 1e-3
[training]
batch_size = 2
seq_len = 8
max_steps = 10
"#;

    fn load(extra: &[&str]) -> Result<RunConfig> {
        let mut table: toml::Table = MINIMAL.parse().unwrap();
        apply_overrides(
            &mut table,
            &extra.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )?;
        RunConfig::from_table(table)
    }

    #[test]
    fn minimal_config_loads_with_explicit_defaults() {
        let c = load(&[]).unwrap();
        assert_eq!(c.optimizer.eps, 1e-8);
        assert_eq!(c.optimizer.weight_decay, 0.1);
        assert!(matches!(c.model, ModelSource::Scratch(_)));
    }

    #[test]
    fn overrides_are_parsed_and_validated() {
        let c = load(&["optimizer.lr=3e-4", "training.device=ndarray"]).unwrap();
        assert_eq!(c.optimizer.lr, 3e-4);
        assert_eq!(c.training.device, "ndarray");
        let e = load(&["optimizer.lrr=1"]).unwrap_err().to_string();
        assert!(e.contains("optimizer") && e.contains("lrr"), "{e}");
        let e = load(&["training.batch_size=0"]).unwrap_err().to_string();
        assert!(e.contains("training.batch_size"), "{e}");
        let e = load(&["model.num_key_value_heads=3"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.num_key_value_heads"), "{e}");
        let e = load(&["schedule.decay=\"wobbly\""])
            .unwrap_err()
            .to_string();
        assert!(e.contains("schedule.decay") && e.contains("wobbly"), "{e}");
        let e = load(&["extras.x=1"]).unwrap_err().to_string();
        assert!(e.contains("extras") && e.contains("unknown section"), "{e}");
        let e = load(&["training.on_nonfinite=\"ignore\""])
            .unwrap_err()
            .to_string();
        assert!(e.contains("training") && e.contains("ignore"), "{e}");
        let c = load(&["training.on_nonfinite=\"skip\""]).unwrap();
        assert_eq!(c.training.on_nonfinite, OnNonFinite::Skip);
    }

    #[test]
    fn a_warmup_longer_than_the_run_is_clipped_with_a_warning() {
        let c = load(&["schedule.warmup_steps=30", "training.max_steps=16"]).unwrap();
        assert_eq!(c.notices.len(), 1);
        assert!(c.notices[0].contains("clipped to 16"), "{}", c.notices[0]);
        assert!(
            load(&["schedule.warmup_steps=10"])
                .unwrap()
                .notices
                .is_empty()
        );
    }

    #[test]
    fn data_keys_of_the_other_kind_are_refused() {
        for key in [
            "sampling=\"epochs\"",
            "val_fraction=0.1",
            "cache_dir=\"c\"",
            "text_field=\"t\"",
        ] {
            let e = load(&["data.kind=\"sft\"", &format!("data.{key}")])
                .unwrap_err()
                .to_string();
            let name = key.split('=').next().unwrap();
            assert!(
                e.contains(&format!("data.{name}")) && e.contains("sft"),
                "{e}"
            );
        }
        for key in ["val_inputs=[\"v.jsonl\"]", "pack=false"] {
            let e = load(&[&format!("data.{key}")]).unwrap_err().to_string();
            let name = key.split('=').next().unwrap();
            assert!(
                e.contains(&format!("data.{name}")) && e.contains("text"),
                "{e}"
            );
        }
        load(&["data.kind=\"sft\"", "data.pack=false"]).unwrap();
        load(&["data.sampling=\"epochs\""]).unwrap();
    }
}
