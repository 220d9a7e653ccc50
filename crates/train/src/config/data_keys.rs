//! The `[data]` keys one data kind reads and another does not: naming one for the wrong kind
//! is an error, not a silently ignored setting.

use qwen_burn_data::Packing;

use super::{DataKind, RunConfig};
use crate::error::{Result, TrainError};

/// `[data]` keys that only one data kind reads; naming one for the other kind is an error.
const TEXT_ONLY_KEYS: &[&str] = &["cache_dir", "val_fraction", "text_field", "sampling"];
const SFT_ONLY_KEYS: &[&str] = &["val_inputs", "pack", "packing"];
const PREFERENCE_UNUSED_KEYS: &[&str] = &[
    "cache_dir",
    "val_fraction",
    "text_field",
    "sampling",
    "pack",
    "packing",
    "document_mask",
];

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
                "text runs split `data.val_fraction` off the corpus and always pack windows",
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
