//! The run configuration: one TOML file with `[model] [data] [optimizer] [schedule] [training]
//! [checkpoint] [logging]` (and `[lora]` for LoRA fine-tuning, `[eval]` for multiple-choice
//! tasks scored during training).
//!
//! Every section is strict: an unknown key or a bad value is an error naming `section.key`.
//! `--set section.key=value` overrides go through the same parse-and-validate path. Relative
//! paths are relative to the working directory (run commands from the repository root).

use std::path::{Path, PathBuf};

use qwen_burn_model::Qwen3Config;
use serde::de::DeserializeOwned;

use crate::error::{Result, TrainError};
use choices::{allowed_values, lookup, toml_type};

mod lora;
mod preference;
mod rl;
mod sections;
pub use lora::*;
pub use preference::{PreferenceConfig, PreferenceLoss, TruncationMode};
pub use rl::{RewardKind, RewardSpec, RlAlgorithm, RlConfig, RlLossType, ScaleRewards};
pub use sections::*;
pub use training_choices::{ActivationCheckpointing, Precision, Reproducible};

mod choices;
pub(crate) mod data_keys;
mod reference;
mod training_choices;
pub use reference::reference;
mod toml_table;
use toml_table::first_non_finite;
pub use toml_table::{apply_overrides, toml_to_json};

/// Where the model comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// A new model with this architecture, initialised from `training.seed`.
    Scratch(Box<Qwen3Config>),
    /// An HF model directory or a qwen-burn checkpoint (fine-tuning).
    Pretrained(PathBuf),
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
    /// `[eval]`.
    pub eval: EvalConfig,
    /// `[preference]` (preference data only).
    pub preference: PreferenceConfig,
    /// `[rl]` (prompt data only).
    pub rl: RlConfig,
    /// The full TOML after overrides (what checkpoints store as `run.toml`).
    pub table: toml::Table,
    /// Settings that were adjusted, for the trainer to print (e.g. a warmup clipped to a
    /// shorter run).
    pub notices: Vec<String>,
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
    "eval",
    "preference",
    "rl",
];

/// Deserialise one section (absent: its defaults), naming `section.key` in every error.
/// `required` keys must be written.
fn section<T: DeserializeOwned + Default>(
    table: &toml::Table,
    name: &str,
    required: &[&str],
) -> Result<T> {
    let Some(value) = table.get(name) else {
        return match required.first() {
            Some(_) => Err(TrainError::config(name, "required section is missing")),
            None => Ok(T::default()),
        };
    };
    let Some(fields) = value.as_table() else {
        return Err(TrainError::config(name, "expected a table"));
    };
    if let Some(key) = required.iter().find(|k| !fields.contains_key(**k)) {
        return Err(TrainError::config(
            format!("{name}.{key}"),
            "required key is missing",
        ));
    }
    serde_path_to_error::deserialize::<_, T>(value.clone()).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." {
            name.to_string()
        } else {
            format!("{name}.{path}")
        };
        let message = e.into_inner().message().to_string();
        // serde names an unknown field in its message; the path may or may not already end
        // with it, depending on how deep the field is.
        let key = match message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
        {
            Some(field) if !key.ends_with(&format!(".{field}")) => format!("{key}.{field}"),
            _ => key,
        };
        // A bool or number where a named choice belongs: serde says "unit variant". Name what
        // was given and the choices (found by asking serde about a value no choice has).
        if message.contains("unit variant") {
            let given = lookup(table, &key).map_or("a non-string value", toml_type);
            let inner = key.strip_prefix(&format!("{name}.")).unwrap_or_default();
            let choices = allowed_values::<T>(value, inner);
            return TrainError::config(
                key,
                format!("expected one of {choices} (a quoted string), got {given}"),
            );
        }
        TrainError::config(key, message)
    })
}

impl RunConfig {
    /// Whether the run uses the fused kernels: `training.fused_kernels` when the config sets
    /// it, else the environment's default (`QWEN_BURN_FUSED_KERNELS=0` turns them off).
    pub fn fused_kernels(&self) -> bool {
        let set = self
            .table
            .get("training")
            .and_then(|t| t.get("fused_kernels"))
            .is_some();
        match set {
            true => self.training.fused_kernels,
            false => qwen_burn_kernels::fused_kernels_by_environment(),
        }
    }

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
        if let Some((key, value)) = first_non_finite(&table) {
            return Err(TrainError::config(
                key,
                format!("{value} is not allowed (expected a finite number)"),
            ));
        }
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
        // With `model.from`, the tokenizer defaults to the model's own.
        let data = match model {
            ModelSource::Pretrained(_) => section(&table, "data", &["inputs"])?,
            ModelSource::Scratch(_) => section(&table, "data", &["inputs", "tokenizer"])?,
        };
        let mut config = Self {
            model_table,
            model,
            data,
            optimizer: section(&table, "optimizer", &["lr"])?,
            schedule: section(&table, "schedule", &[])?,
            training: section(&table, "training", &["batch_size", "seq_len", "max_steps"])?,
            checkpoint: section(&table, "checkpoint", &[])?,
            logging: section(&table, "logging", &[])?,
            eval: section(&table, "eval", &[])?,
            preference: section(&table, "preference", &[])?,
            rl: section(&table, "rl", &[])?,
            lora: match table.get("lora") {
                None => None,
                Some(_) => Some(section(&table, "lora", &["rank", "alpha", "targets"])?),
            },
            table,
            notices: Vec::new(),
        };
        config.validate()?;
        config.settle_data_keys()?;
        config.preference.check()?;
        config.rl.check()?;
        Ok(config.with_notices())
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
        let path = qwen_burn_kernels::bf16_path();
        if self.training.precision == Precision::Bf16 && !path.has_kernel() {
            self.notices.push(format!(
                "note: training.precision = \"bf16\" without a bf16 kernel (bf16 path `{}`: \
                 this CPU has neither AMX-BF16 nor AVX512-BF16, or QWEN_BURN_BF16_KERNEL caps \
                 it): the products are f32 products of bf16-rounded operands, the numbers of a \
                 bf16 machine at less than f32's speed",
                path.name()
            ));
        }
        self
    }

    fn validate(&self) -> Result<()> {
        // Tasks are logged and plotted by name (the file name without its extensions): two
        // files of one name would merge into one curve.
        let mut names = std::collections::BTreeMap::new();
        for path in &self.eval.tasks {
            let name = crate::eval::tasks::task_name(path);
            if let Some(first) = names.insert(name.clone(), path) {
                return Err(TrainError::config(
                    "eval.tasks",
                    format!(
                        "{} and {} are both named `{name}` (the file name without its \
                         extensions, which names a task in metrics.jsonl and its plot); rename \
                         or copy one",
                        first.display(),
                        path.display()
                    ),
                ));
            }
        }
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
        if !(o.lr.is_finite() && o.lr > 0.0) {
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
        // Written so that NaN fails every check (`!(x >= 0)`), not passes it.
        let at_least_zero = [
            ("optimizer.weight_decay", o.weight_decay),
            ("optimizer.grad_clip", o.grad_clip),
            ("schedule.min_lr", self.schedule.min_lr),
            (
                "training.sample_temperature",
                f64::from(self.training.sample_temperature),
            ),
        ];
        for (key, value) in at_least_zero {
            if !(value.is_finite() && value >= 0.0) {
                return Err(TrainError::config(
                    key,
                    format!("must be a finite number >= 0, found {value}"),
                ));
            }
        }
        if !(o.eps.is_finite() && o.eps > 0.0) {
            return Err(TrainError::config(
                "optimizer.eps",
                format!("must be a finite number > 0, found {}", o.eps),
            ));
        }
        let m = &o.muon;
        if o.kind == OptimizerKind::Muon {
            if !(m.lr.is_finite() && m.lr > 0.0) {
                return Err(TrainError::config(
                    "optimizer.muon.lr",
                    format!("must be > 0, found {}", m.lr),
                ));
            }
            if !(m.weight_decay.is_finite() && m.weight_decay >= 0.0) {
                return Err(TrainError::config(
                    "optimizer.muon.weight_decay",
                    format!("must be a finite number >= 0, found {}", m.weight_decay),
                ));
            }
            if !(0.0..1.0).contains(&m.momentum) {
                return Err(TrainError::config(
                    "optimizer.muon.momentum",
                    format!("must be in [0, 1), found {}", m.momentum),
                ));
            }
            if !(1..100).contains(&m.ns_steps) {
                return Err(TrainError::config(
                    "optimizer.muon.ns_steps",
                    format!("must be in 1..=99, found {}", m.ns_steps),
                ));
            }
        } else if self
            .table
            .get("optimizer")
            .and_then(|t| t.as_table())
            .is_some_and(|t| t.contains_key("muon"))
        {
            return Err(TrainError::config(
                "optimizer.muon",
                "is only read with optimizer.kind = \"muon\"; remove it",
            ));
        }
        let s = &self.schedule;
        if !(s.decay_fraction > 0.0 && s.decay_fraction <= 1.0) {
            return Err(TrainError::config(
                "schedule.decay_fraction",
                format!("must be in (0, 1], found {}", s.decay_fraction),
            ));
        }
        if s.decay != Decay::Wsd
            && let Some(key) = ["decay_fraction", "decay_shape"].into_iter().find(|k| {
                self.table
                    .get("schedule")
                    .and_then(|t| t.as_table())
                    .is_some_and(|t| t.contains_key(*k))
            })
        {
            return Err(TrainError::config(
                format!("schedule.{key}"),
                "is only read with schedule.decay = \"wsd\"; remove it",
            ));
        }
        if s.min_lr > o.lr {
            return Err(TrainError::config(
                "schedule.min_lr",
                format!(
                    "must be in [0, optimizer.lr = {}], found {}",
                    o.lr, s.min_lr
                ),
            ));
        }
        let peaks = &self.logging.peak_tflops;
        for (kind, peak) in [
            ("flex", peaks.flex),
            ("ndarray", peaks.ndarray),
            ("wgpu", peaks.wgpu),
            ("cuda", peaks.cuda),
        ] {
            if let Some(p) = peak
                && !(p.is_finite() && p > 0.0)
            {
                return Err(TrainError::config(
                    format!("logging.peak_tflops.{kind}"),
                    format!("must be a finite number > 0, found {p}"),
                ));
            }
        }
        let d = &self.data;
        if d.inputs.is_empty() {
            return Err(TrainError::config(
                "data.inputs",
                "list at least one file or directory",
            ));
        }
        if !(0.0..1.0).contains(&d.val_fraction) {
            return Err(TrainError::config("data.val_fraction", "must be in [0, 1)"));
        }
        if t.precision == Precision::Bf16 && !self.fused_kernels() {
            return Err(TrainError::config(
                "training.precision",
                "\"bf16\" products are computed by the fused kernels, which this run turns off \
                 (training.fused_kernels = false or QWEN_BURN_FUSED_KERNELS=0)",
            ));
        }
        if t.reproducible == Reproducible::Bitwise
            && matches!(d.kind, DataKind::Preference | DataKind::Prompts)
        {
            return Err(TrainError::config(
                "training.reproducible",
                format!(
                    "\"bitwise\" splits each step into single sequences, which covers the \
                     next-token objectives (data.kind \"text\" and \"sft\"); data.kind = \"{}\" \
                     needs its rows together (pairs, groups): use \"rerun\"",
                    d.kind.as_str()
                ),
            ));
        }
        if let Some(lora) = &self.lora {
            if lora.rank == 0 || !(lora.alpha.is_finite() && lora.alpha > 0.0) {
                return Err(TrainError::config(
                    "lora",
                    "rank must be >= 1 and alpha > 0",
                ));
            }
            if lora.targets.is_empty() {
                return Err(TrainError::config(
                    "lora.targets",
                    "list at least one projection",
                ));
            }
        }
        Ok(())
    }
}

/// The smallest valid run config, for the crate's unit tests.
#[cfg(test)]
pub(crate) const MINIMAL: &str = r#"
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

#[cfg(test)]
mod tests;
