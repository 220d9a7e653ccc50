//! `qwen-burn export`: a checkpoint (LoRA merged) as an HF model directory.

use std::path::PathBuf;

use anyhow::{Context, Result};
use qwen_burn_train::checkpoint::find_beside;

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

pub fn run(args: Args) -> Result<()> {
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
            std::fs::copy(&src, args.out.join(name))
                .with_context(|| format!("copying {}", src.display()))?;
        }
    }
    println!(
        "exported {} to {}",
        args.checkpoint.display(),
        args.out.display()
    );
    Ok(())
}
