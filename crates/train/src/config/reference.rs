//! The config reference (`qwen-burn config --defaults`): every key of every section with its
//! default and its doc comment, read from the section types at build time (`build.rs`), so it
//! cannot drift from them. `configs/REFERENCE.toml` holds its output; a test keeps it current.

use serde::Serialize;

use super::{
    CheckpointConfig, DataConfig, EvalConfig, LoggingConfig, LoraConfig, MuonSettings,
    OptimizerConfig, PeakTflops, ScheduleConfig, TrainingConfig,
};

/// `(section, key, Rust type, doc comment)` of every section field, in source order.
const KEYS: &[(&str, &str, &str, &str)] = include!(concat!(env!("OUT_DIR"), "/config_keys.rs"));

fn table(value: impl Serialize) -> toml::Table {
    toml::Table::try_from(value).unwrap_or_default()
}

/// The defaults of a section, as TOML.
fn defaults(section: &str) -> toml::Table {
    match section {
        "data" => table(DataConfig::default()),
        "optimizer" => table(OptimizerConfig::default()),
        "optimizer.muon" => table(MuonSettings::default()),
        "schedule" => table(ScheduleConfig::default()),
        "training" => table(TrainingConfig::default()),
        "checkpoint" => table(CheckpointConfig::default()),
        "eval" => table(EvalConfig::default()),
        "logging" => table(LoggingConfig::default()),
        "logging.peak_tflops" => table(PeakTflops::default()),
        "lora" => table(LoraConfig::default()),
        "preference" => table(super::PreferenceConfig::default()),
        "rl" => table(super::RlConfig::default()),
        "rl.rewards" => table(super::RewardSpec::default()),
        _ => toml::Table::new(),
    }
}

/// `text` as `# ` comment lines of at most 96 columns.
fn comment(text: &str, out: &mut String) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 96 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    if line.len() > 1 {
        out.push_str(&line);
        out.push('\n');
    }
}

/// The reference, as a TOML file every line of which is a default or a comment.
pub fn reference() -> String {
    let mut out = String::from(
        "# Every run-config key, its default and what it does (`qwen-burn config --defaults`,\n\
         # generated from the config types). Keys marked (required) have no default; (unset) ones\n\
         # are off until given.\n\
         #\n\
         # [model] holds either `from = \"PATH or ORG/NAME[@REV]\"` (an HF directory, a hub id in\n\
         # the Hugging Face cache, or a qwen-burn run or checkpoint) or the keys of an HF Qwen3 /\n\
         # Qwen3-MoE config.json (model_type, vocab_size, hidden_size, ...; see\n\
         # crates/model/src/config), plus qwen-burn's router settings (router_z_loss_coef,\n\
         # router_bias_update_rate, router_capacity_factor, router_centering,\n\
         # router_assignment_loss_coef, router_aux_loss_type).\n",
    );
    let mut current = "";
    let mut values = toml::Table::new();
    for &(section, key, ty, doc) in KEYS {
        // A nested table is its own section below.
        if KEYS.iter().any(|&(s, ..)| s == format!("{section}.{key}")) {
            continue;
        }
        if section != current {
            current = section;
            values = defaults(section);
            // A list of tables (`rl.rewards`) is written `[[...]]`, one table per entry.
            let list = KEYS
                .iter()
                .any(|&(s, k, ty, _)| format!("{s}.{k}") == section && ty.starts_with("Vec<"));
            if list {
                out.push_str(&format!("\n[[{section}]]\n"));
            } else {
                out.push_str(&format!("\n[{section}]\n"));
            }
        }
        comment(&format!("{doc} ({ty})"), &mut out);
        match values.get(key) {
            _ if doc.contains("Required") => out.push_str(&format!("# {key} = (required)\n")),
            Some(v) => out.push_str(&format!("{key} = {v}\n")),
            None => out.push_str(&format!("# {key} = (unset)\n")),
        }
    }
    out
}
