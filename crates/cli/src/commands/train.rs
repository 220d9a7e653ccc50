//! `qwen-burn train`: train (or fine-tune, or resume) from a TOML run config.

use std::path::PathBuf;

use anyhow::{Result, bail};
use qwen_burn_model::DeviceSet;

use super::ConfigArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run config (TOML). With --resume and --run-dir it may be left out: the run directory's
    /// own run.toml (the config its last start used, `--set`s included) is read instead.
    #[arg(long, required_unless_present = "resume")]
    pub config: Option<PathBuf>,
    /// Override a config value, e.g. `--set optimizer.lr=3e-4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
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
    let (config_path, run_dir) = match (args.config, args.run_dir) {
        (Some(config), run_dir) => {
            let run_dir = run_dir.unwrap_or_else(|| qwen_burn_train::run::default_run_dir(&config));
            (config, run_dir)
        }
        (None, Some(run_dir)) => {
            let path = run_dir.join("run.toml");
            eprintln!("resume: the run's config {}", path.display());
            (path, run_dir)
        }
        (None, None) => bail!(
            "--resume without --config needs --run-dir (the run to continue, whose run.toml \
             is read); or give the --config the run was started with"
        ),
    };
    check_run_dir(&run_dir)?;
    let config_args = ConfigArgs {
        config: config_path,
        overrides: args.overrides,
    };
    let config = config_args.load(&overrides)?;
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

/// A run directory is never a model directory that is not a run: the run would write its own
/// config.json over the model's.
fn check_run_dir(run_dir: &std::path::Path) -> Result<()> {
    let run = run_dir.join("run.toml").is_file() || run_dir.join("checkpoints").is_dir();
    let weights = super::outputs::weight_files(run_dir);
    if !run && !weights.is_empty() {
        bail!(
            "--run-dir {} holds a model ({}), not a run; a run there would write its own \
             config.json over the model's. Choose another --run-dir",
            run_dir.display(),
            weights.join(", ")
        );
    }
    Ok(())
}
