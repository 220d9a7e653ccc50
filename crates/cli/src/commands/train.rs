//! `qwen-burn train`: train (or fine-tune, or resume) from a TOML run config.

use std::path::PathBuf;

use anyhow::Result;
use qwen_burn_model::DeviceSet;

use super::ConfigArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Device, or a list for data-parallel replicas: flex, ndarray, wgpu, cuda[:N], `flex,flex`,
    /// `cuda:0,cuda:1` (default: training.device of the config).
    #[arg(long)]
    pub device: Option<DeviceSet>,
    /// Run directory (default: runs/<config file stem>).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Total optimizer steps (overrides training.max_steps, and so the schedule length).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Continue from the newest good checkpoint in the run directory.
    #[arg(long, conflicts_with = "from_checkpoint")]
    pub resume: bool,
    /// Start a new run directory from a checkpoint of another run (RUN/checkpoints/step-N):
    /// its weights, optimizer state and data cursor, with this config (e.g. a shorter
    /// --max-steps to cool a WSD run down from a stable-phase checkpoint). The origin is
    /// recorded in RUN_DIR/branch.json.
    #[arg(long, value_name = "DIR")]
    pub from_checkpoint: Option<PathBuf>,
    /// Show burn-train's live dashboard (sets logging.dashboard): plots, progress and ETA; `q`
    /// then `s` writes a checkpoint and stops (`--resume` continues). Needs a terminal; the
    /// run's other output goes to RUN_DIR/train.log meanwhile.
    #[arg(long)]
    pub tui: bool,
}

pub fn run(args: Args) -> Result<()> {
    let mut overrides: Vec<String> = args
        .max_steps
        .map(|steps| format!("training.max_steps={steps}"))
        .into_iter()
        .collect();
    if args.tui {
        overrides.push("logging.dashboard=true".into());
    }
    let config = args.config.load(&overrides)?;
    let run_dir = args
        .run_dir
        .unwrap_or_else(|| qwen_burn_train::run::default_run_dir(&args.config.config));
    let opts = qwen_burn_train::RunOptions {
        device: args.device,
        run_dir: run_dir.clone(),
        resume: args.resume,
        from_checkpoint: args.from_checkpoint,
    };
    let summary = qwen_burn_train::train(&config, &opts)?;
    println!(
        "{}: {} steps, val loss {}, {:.0} tokens/s, {:.1}s, checkpoint {}",
        if summary.stopped { "stopped" } else { "done" },
        summary.step,
        summary.val_loss.map_or("-".into(), |l| format!("{l:.4}")),
        summary.tokens_per_sec,
        summary.elapsed_secs,
        summary
            .checkpoint
            .map_or("-".into(), |p| p.display().to_string())
    );
    if let Some(signal) = summary.stopped_by {
        // A batch system sees that the run was stopped, not finished (README "What a run
        // promises").
        std::process::exit(128 + signal);
    }
    Ok(())
}
