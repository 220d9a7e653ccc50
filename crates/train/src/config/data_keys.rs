//! The `[data]` section, and the keys one data kind reads and another does not: naming one for
//! the wrong kind is an error, not a silently ignored setting.

use std::path::PathBuf;

use qwen_burn_data::{Packing, SampleMode};
use serde::{Deserialize, Serialize};

use super::RunConfig;
use crate::error::{Result, TrainError};

/// `data.kind`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DataKind {
    /// Packed windows of a tokenised corpus.
    #[default]
    Text,
    /// Chat JSONL with the loss on the assistant's tokens only.
    Sft,
    /// Preference pairs (JSONL: prompt, chosen, rejected), for `[preference]`'s losses.
    Preference,
    /// Prompts with reference answers (JSONL or Parquet: prompt, answer; GSM8K's question,
    /// answer), for `[rl]`.
    Prompts,
}

impl DataKind {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DataKind::Text => "text",
            DataKind::Sft => "sft",
            DataKind::Preference => "preference",
            DataKind::Prompts => "prompts",
        }
    }
}

/// `[data]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `text`, `sft`, `preference` or `prompts`.
    pub kind: DataKind,
    /// Corpus files or directories (text: .txt, .jsonl, .gz, .parquet; sft: one JSONL file).
    /// Required.
    pub inputs: Vec<PathBuf>,
    /// Validation inputs for `sft` (text splits `val_fraction` off the corpus instead).
    pub val_inputs: Vec<PathBuf>,
    /// HF tokenizer.json (or .json.gz). Required, except with `model.from`: then the model's
    /// own `tokenizer.json` (beside it, or in its run directory).
    pub tokenizer: PathBuf,
    /// Where prepared token shards go (default `.cache/shards/<hash of inputs and tokenizer>`).
    pub cache_dir: Option<PathBuf>,
    /// Fraction of documents held out for validation (text).
    pub val_fraction: f64,
    /// JSONL field, or Parquet string column, holding the text.
    pub text_field: String,
    /// `random` windows from a seeded RNG, or `epochs` over a seeded shuffle of windows.
    pub sampling: SampleMode,
    /// SFT: pack several conversations per row (true) or one per row, padded (false).
    pub pack: bool,
    /// SFT with `pack`: `"best_fit_decreasing"` places conversations longest first, each into
    /// the fullest row it fits (TRL's `"bfd"`, fewest rows); `"in_order"` appends them in file
    /// order to the last row while they fit.
    pub packing: Packing,
    /// Keep the documents of a packed row apart: attention stays within each document and RoPE
    /// positions restart at 0 at each document start. Text: documents end at the tokenizer's
    /// end-of-document separator; SFT (with `pack`): each conversation is a document.
    pub document_mask: bool,
    /// Extra variables for the model's chat template wherever a run renders one (SFT, preference
    /// and prompt data): `{ enable_thinking = false }` puts Qwen3's empty `<think>` block after
    /// each generation prompt (its non-thinking mode), as `apply_chat_template(...,
    /// enable_thinking=False)` and TRL's `chat_template_kwargs`. A variable the template never
    /// reads is an error naming the ones it does.
    pub chat_template_kwargs: Option<toml::Table>,
    /// Batches prepared ahead by the background loader.
    pub prefetch: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            kind: DataKind::Text,
            inputs: Vec::new(),
            val_inputs: Vec::new(),
            tokenizer: PathBuf::new(),
            cache_dir: None,
            val_fraction: 0.01,
            text_field: "text".into(),
            sampling: SampleMode::Random,
            pack: true,
            packing: Packing::default(),
            document_mask: true,
            chat_template_kwargs: None,
            prefetch: 4,
        }
    }
}

/// `[data]` keys that only one data kind reads; naming one for the other kind is an error.
const TEXT_ONLY_KEYS: &[&str] = &["cache_dir", "val_fraction", "text_field", "sampling"];
const SFT_ONLY_KEYS: &[&str] = &["val_inputs", "pack", "packing", "chat_template_kwargs"];
const PREFERENCE_UNUSED_KEYS: &[&str] = &[
    "cache_dir",
    "val_fraction",
    "text_field",
    "sampling",
    "pack",
    "packing",
    "document_mask",
];

impl DataConfig {
    /// `chat_template_kwargs` as the template's variables (TOML values as JSON).
    pub fn template_kwargs(&self) -> qwen_burn_data::TemplateKwargs {
        self.chat_template_kwargs
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), super::toml_to_json(v)))
            .collect()
    }
}

impl RunConfig {
    /// Refuses `[data]` keys the data kind does not read (they would be silently ignored),
    /// then writes the packing an SFT run uses into the run table when the config leaves it
    /// to the default, so that a checkpoint's `run.toml` names it (see [`saved_packing`]).
    pub(super) fn settle_data_keys(&mut self) -> Result<()> {
        self.check_data_keys()?;
        if self.data.kind == DataKind::Sft
            && self.data.pack
            && let Some(toml::Value::Table(data)) = self.table.get_mut("data")
        {
            data.entry("packing")
                .or_insert_with(|| self.data.packing.as_str().into());
        }
        Ok(())
    }

    /// Keys of `[data]` written for the other data kind would be silently ignored: refuse them.
    fn check_data_keys(&self) -> Result<()> {
        let Some(data) = self.table.get("data").and_then(|d| d.as_table()) else {
            return Ok(());
        };
        let (unused, why) = match self.data.kind {
            DataKind::Sft => (
                TEXT_ONLY_KEYS,
                "SFT reads whole conversations from the JSONL file in seeded shuffled epochs, \
                 validates on `data.val_inputs` (or the first training rows) and keeps no shard cache",
            ),
            DataKind::Text => (
                SFT_ONLY_KEYS,
                "text runs split `data.val_fraction` off the corpus, always pack windows and \
                 render no chat template",
            ),
            DataKind::Prompts => (
                PREFERENCE_UNUSED_KEYS,
                "RL runs read prompts from one JSONL or Parquet file in seeded shuffled epochs \
                 and validate on `data.val_inputs` (or the first prompts)",
            ),
            DataKind::Preference => (
                PREFERENCE_UNUSED_KEYS,
                "preference runs read pairs from one JSONL file in seeded shuffled epochs, one \
                 sequence a row, and validate on `data.val_inputs` (or the first pairs)",
            ),
        };
        if self.data.kind != DataKind::Preference && self.table.contains_key("preference") {
            return Err(TrainError::config(
                "preference",
                format!(
                    "is read only with data.kind = \"preference\", not \"{}\"; remove it",
                    self.data.kind.as_str()
                ),
            ));
        }
        if self.data.kind != DataKind::Prompts && self.table.contains_key("rl") {
            return Err(TrainError::config(
                "rl",
                format!(
                    "is read only with data.kind = \"prompts\", not \"{}\"; remove it",
                    self.data.kind.as_str()
                ),
            ));
        }
        if let Some(key) = unused.iter().find(|k| data.contains_key(**k)) {
            return Err(TrainError::config(
                format!("data.{key}"),
                format!(
                    "is not used by data.kind = \"{}\" ({why}); remove it",
                    self.data.kind.as_str()
                ),
            ));
        }
        if self.data.kind == DataKind::Sft && !self.data.pack && data.contains_key("document_mask")
        {
            return Err(TrainError::config(
                "data.document_mask",
                "is only read with data.pack = true (one conversation per row has nothing to \
                 keep apart); remove it",
            ));
        }
        if self.data.kind == DataKind::Sft && !self.data.pack && data.contains_key("packing") {
            return Err(TrainError::config(
                "data.packing",
                "is only read with data.pack = true (one conversation per row places nothing); \
                 remove it",
            ));
        }
        Ok(())
    }
}

/// The packing of the SFT run whose checkpoint stored `saved_run` (parsed as `saved`): runs
/// record it in their table since `data.packing` exists, so a packed SFT table without it is
/// older and packed in file order.
pub fn saved_packing(saved_run: &toml::Table, saved: &RunConfig) -> Packing {
    let written = saved_run
        .get("data")
        .and_then(|d| d.as_table())
        .is_some_and(|d| d.contains_key("packing"));
    match written || saved.data.kind != DataKind::Sft || !saved.data.pack {
        true => saved.data.packing,
        false => Packing::InOrder,
    }
}
