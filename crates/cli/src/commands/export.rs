//! `qwen-burn export`: a checkpoint (LoRA merged) as an HF model directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use qwen_burn_train::checkpoint::{ModelDir, find_beside, resolve_model_dir};

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
}

/// Whether two paths name the same existing file or directory.
fn same_entry(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
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
    let device = burn::tensor::Device::flex();
    let mut model = qwen_burn_train::checkpoint::load_model_any(&args.checkpoint, &device)
        .with_context(|| format!("loading {}", args.checkpoint.display()))?;
    if args.drop_routing_bias {
        model = model.without_routing_bias();
    }
    model
        .save_pretrained(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    // Ship the tokenizer and the generation defaults with the model when we can find them
    // (next to the checkpoint, or in its run directory).
    for name in ["tokenizer.json", "generation_config.json"] {
        if let Some(src) = find_beside(&args.checkpoint, name) {
            let dest = args.out.join(name);
            if same_entry(&src, &dest) {
                // --out is the run directory that holds it: it is already in place.
                continue;
            }
            std::fs::copy(&src, &dest).with_context(|| format!("copying {}", src.display()))?;
        }
    }
    println!(
        "exported {} to {}",
        args.checkpoint.display(),
        args.out.display()
    );
    Ok(())
}
