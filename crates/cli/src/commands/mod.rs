//! One file per command, each with its arguments (`Args`, or `Cmd` for a command group) and
//! `run`; the logic they call lives in the library crates.

pub mod batches;
pub mod bench;
pub mod chat;
pub mod config;
pub mod data;
pub mod eval;
pub mod export;
pub mod generate;
pub mod generation;
pub mod init;
pub mod outputs;
pub mod pairs;
pub mod plot;
pub mod score;
pub mod tokenizer;
pub mod train;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use qwen_burn_data::{ChatTemplate, TemplateKwargs, Tok};
use qwen_burn_model::{DeviceSet, Qwen3ForCausalLM};
use qwen_burn_train::RunConfig;
use qwen_burn_train::run::checkpoint::{find_beside, load_model_any};

/// A run config and its overrides, as every command that reads one takes them.
#[derive(clap::Args, Debug)]
pub struct ConfigArgs {
    /// Run config (TOML).
    #[arg(long)]
    pub config: PathBuf,
    /// Override a config value, e.g. `--set optimizer.lr=3e-4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

impl ConfigArgs {
    /// Load the config with its overrides and `extra` ones after them.
    pub fn load(&self, extra: &[String]) -> Result<RunConfig> {
        let overrides: Vec<String> = self.overrides.iter().chain(extra).cloned().collect();
        RunConfig::load(&self.config, &overrides)
            .with_context(|| format!("loading run config {}", self.config.display()))
    }
}

/// Arguments shared by every command that loads a model.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// HF model directory (config.json + safetensors), a hub id found in the Hugging Face cache
    /// (`Qwen/Qwen3-0.6B`, `Qwen/Qwen3-0.6B@REV`), or a qwen-burn checkpoint or run directory.
    #[arg(long, value_parser = model_path)]
    pub model: PathBuf,
    /// Device: flex (default), ndarray, wgpu, cuda[:N].
    #[arg(long, default_value = "flex")]
    pub device: DeviceSet,
    /// Weight storage: f32 (default), or bf16 (matrices rounded to bf16: half the bytes to read
    /// per decoded token; products in bf16 with f32 accumulation).
    #[arg(long, value_enum, default_value_t = WeightDtype::F32)]
    pub dtype: WeightDtype,
}

/// How inference stores the model's matrices (`--dtype`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightDtype {
    /// As trained.
    #[default]
    F32,
    /// Projections, experts, routers, embedding and LM head in bf16, their products in bf16
    /// with f32 accumulation (README, bf16 arithmetic); norms and everything else in f32.
    Bf16,
}

impl WeightDtype {
    /// `model` with its weights stored in this dtype.
    pub fn apply(self, model: Qwen3ForCausalLM) -> Qwen3ForCausalLM {
        match self {
            WeightDtype::F32 => model,
            WeightDtype::Bf16 => model.with_bf16_weights(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
        }
    }
}

impl ModelArgs {
    pub fn load(&self) -> Result<(Qwen3ForCausalLM, Device)> {
        if self.device.len() != 1 {
            bail!(
                "--device names one device here, not the list `{}`",
                self.device.name()
            );
        }
        let device = self.device.main().clone();
        let model = load_model_any(&self.model, &device)
            .with_context(|| format!("loading model from {}", self.model.display()))?;
        Ok((self.dtype.apply(model), device))
    }
}

/// `--model`: a path, or a hub id resolved to its snapshot in the Hugging Face cache.
fn model_path(s: &str) -> std::result::Result<PathBuf, String> {
    qwen_burn_model::hub::resolve(Path::new(s)).map_err(|e| e.to_string())
}

/// Find a tokenizer: the flag, else `tokenizer.json` next to the model (or in its run
/// directory).
pub fn find_tokenizer(model_dir: &Path, flag: Option<&Path>) -> Result<Option<Tok>> {
    let path = match flag {
        Some(p) if !p.exists() => bail!("tokenizer {} does not exist", p.display()),
        Some(p) => p.to_path_buf(),
        None => match find_beside(model_dir, "tokenizer.json") {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let tok =
        Tok::from_file(&path).with_context(|| format!("loading tokenizer {}", path.display()))?;
    Ok(Some(tok))
}

/// Refuse a non-finite result (a loss that would print as `null`), naming the first parameter
/// of the model that holds NaN or Inf when that is the cause.
pub fn require_finite(model: &Qwen3ForCausalLM, value: f64, what: &str) -> Result<()> {
    if value.is_finite() {
        return Ok(());
    }
    match qwen_burn_train::run::guard::first_non_finite_weight(model)? {
        Some(param) => bail!(
            "the {what} is {value}: the model's weights are not finite (first in parameter \
             {param})"
        ),
        None => bail!("the {what} is {value} although every weight is finite"),
    }
}

/// A count that must be at least 1 (`--limit`, `--batch-size`, `bench peak --n`, ...): zero is
/// refused with the flag's name by clap instead of meaning nothing or silently becoming 1.
pub fn positive(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1 (0 would do nothing)".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("expected a whole number of at least 1: {e}")),
    }
}

/// `--chat-template-kwargs`: a JSON object of the chat template's extra variables.
pub fn template_kwargs(s: &str) -> std::result::Result<TemplateKwargs, String> {
    serde_json::from_str(s).map_err(|e| {
        format!("expected a JSON object of template variables, such as '{{\"enable_thinking\": false}}': {e}")
    })
}

/// The chat template beside `tok` (its `tokenizer_config.json`; ChatML when it has none), with
/// `--chat-template-kwargs` when given.
pub fn chat_template(tok: &Tok, kwargs: Option<&TemplateKwargs>) -> Result<ChatTemplate> {
    let template = ChatTemplate::beside(tok.path())?.unwrap_or_else(ChatTemplate::chatml);
    Ok(template.with_kwargs(
        kwargs.cloned().unwrap_or_default(),
        "--chat-template-kwargs",
    )?)
}
