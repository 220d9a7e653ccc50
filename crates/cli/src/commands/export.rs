//! `qwen-burn export`: a checkpoint (LoRA merged) as an HF model directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use qwen_burn_train::run::checkpoint::{ModelDir, find_beside, resolve_model_dir};

use super::outputs::{
    check_model_out, copy_atomic, remove_stale_weights, same_entry, weight_files,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint directory, run directory (newest checkpoint) or HF directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Output HF model directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Export an MoE model trained with aux-loss-free balancing by dropping its routing biases
    /// (HF Qwen3-MoE has no such parameter, so routing in transformers will differ).
    #[arg(long)]
    pub drop_routing_bias: bool,
    /// Replace the model already in --out (its index and shards included). A checkpoint or a
    /// run directory is never replaced.
    #[arg(long)]
    pub overwrite: bool,
    /// Largest safetensors shard, as transformers' `max_shard_size` (`5GB`, `500MB`, `100KB` or
    /// bytes; decimal units): a larger model is written in shards with an index.
    #[arg(long, default_value = "5GB", value_parser = shard_size)]
    pub max_shard_size: u64,
}

/// `--max-shard-size`: bytes, or a number with KB, MB or GB (powers of 1000, as transformers).
fn shard_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let scale = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(format!("unknown unit `{unit}`: expected B, KB, MB or GB")),
    };
    match digits.trim().parse::<u64>() {
        Ok(0) => Err("must be above 0".into()),
        Ok(n) => n.checked_mul(scale).ok_or_else(|| "too large".into()),
        Err(e) => Err(format!("`{digits}`: {e}")),
    }
}

/// What dropping the routing bias changes, as the run measured it on its validation tokens
/// (`moe_bias_changed_choices` of `metrics.jsonl`, at the checkpoint's step or the newest before
/// it).
fn bias_report(checkpoint: &Path, source_dir: &Path) -> String {
    let step = std::fs::read_to_string(source_dir.join("state.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["step"].as_u64());
    let measured = find_beside(checkpoint, "metrics.jsonl")
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| {
            text.lines()
                .rev()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|r| r["split"] == "val")
                .filter_map(|r| {
                    Some((r["step"].as_u64()?, r["moe_bias_changed_choices"].as_f64()?))
                })
                .find(|&(s, _)| step.is_none_or(|step| s <= step))
        });
    match measured {
        Some((s, f)) => format!(
            "dropping the routing bias: on the run's validation tokens at step {s}, {:.1}% of the \
             token-expert choices change without it, so transformers routes those tokens to other \
             experts than qwen-burn did",
            f * 100.0
        ),
        None => "dropping the routing bias: no validation measurement of its effect was found \
                 beside the checkpoint (metrics.jsonl's moe_bias_changed_choices); routing in \
                 transformers will differ from qwen-burn's by an unmeasured amount"
            .to_string(),
    }
}

pub fn run(args: Args) -> Result<()> {
    // Writing into the directory the model is read from would replace its files while they are
    // its only copy (and copying a file onto itself truncates it to 0 bytes).
    let source = resolve_model_dir(&args.checkpoint)
        .with_context(|| format!("loading {}", args.checkpoint.display()))?;
    let source_dir = match &source {
        ModelDir::Checkpoint(dir) | ModelDir::Hf(dir) => dir,
    };
    for dir in [source_dir.as_path(), args.checkpoint.as_path()] {
        if same_entry(dir, &args.out) {
            bail!(
                "--out {} is the directory being exported ({}); choose a new directory",
                args.out.display(),
                dir.display()
            );
        }
    }
    check_model_out(&args.out, args.overwrite)?;
    let device = burn::tensor::Device::flex();
    let mut model = qwen_burn_train::run::checkpoint::load_model_any(&args.checkpoint, &device)
        .with_context(|| format!("loading {}", args.checkpoint.display()))?;
    if args.drop_routing_bias {
        model = model.without_routing_bias();
        println!("{}", bias_report(&args.checkpoint, source_dir));
    }
    let before = weight_files(&args.out);
    let written = qwen_burn_model::export::save_pretrained(&model, &args.out, args.max_shard_size)
        .with_context(|| format!("writing {}", args.out.display()))?;
    remove_stale_weights(&args.out, &before, &written)?;
    // Ship the tokenizer, its configuration (the chat template) and special-token files, and
    // the generation defaults with the model when we can find them (next to the checkpoint, or
    // in its run directory).
    let side = qwen_burn_train::run::start::MODEL_SIDE_FILES;
    for name in std::iter::once(&"tokenizer.json").chain(side) {
        if let Some(src) = find_beside(&args.checkpoint, name) {
            let dest = args.out.join(name);
            if same_entry(&src, &dest) {
                // --out is the run directory that holds it: it is already in place.
                continue;
            }
            copy_atomic(&src, &dest)?;
        }
    }
    println!(
        "exported {} to {}",
        args.checkpoint.display(),
        args.out.display()
    );
    Ok(())
}
