//! `qwen-burn init`: the step-0 weights of a run config as an HF model directory, for another
//! framework to start from (the cross-framework check in `experiments/002-*`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::init::init_weights;
use qwen_burn_train::config::ModelSource;

use super::ConfigArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArgs,
    /// Output HF model directory.
    #[arg(long)]
    out: PathBuf,
    /// Replace the model already in --out (its index and shards included). A checkpoint or a
    /// run directory is never replaced.
    #[arg(long)]
    overwrite: bool,
}

/// Write the initial weights `train` would start from, as an HF model directory.
pub fn run(args: Args) -> Result<()> {
    super::outputs::check_model_out(&args.out, args.overwrite)?;
    let config = args.config.load(&[])?;
    let ModelSource::Scratch(model_config) = &config.model else {
        bail!("init needs an inline [model] architecture");
    };
    model_config
        .check_fits_in_memory(&format!("the model of {}", args.config.config.display()))
        .map_err(|e| anyhow::anyhow!("{e}").context("the [model] table"))?;
    let device = burn::tensor::Device::flex();
    let model = init_weights(
        Qwen3ForCausalLM::new(model_config, &device),
        config.training.seed,
    );
    let before = super::outputs::weight_files(&args.out);
    let written = model.save_pretrained(&args.out)?;
    super::outputs::remove_stale_weights(&args.out, &before, &written)?;
    println!(
        "wrote the step-0 weights of {} to {}",
        args.config.config.display(),
        args.out.display()
    );
    Ok(())
}
