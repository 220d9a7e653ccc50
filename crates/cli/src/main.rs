//! `qwen-burn`: train, generate, score, eval, tokenizer, data, export, plot, bench.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// mimalloc instead of glibc malloc: the training step frees and re-allocates the same large
/// activation buffers every step, which glibc hands back to the kernel (munmap) and faults in
/// again; that cost ~12% of a tiny-model step on flex (see benches/README.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc v3's `mi_option_purge_delay` (index 15 in `mi_option_e`; libmimalloc-sys names no
/// constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keep freed memory mapped instead of purging it back to the OS after mimalloc's default 1 s:
/// the next step re-allocates the same buffers, and re-faulting them (kernel page zeroing) cost
/// 7-10% of a training step (benches/README.md). Costs ~15% more peak RSS. The user's
/// `MIMALLOC_PURGE_DELAY` wins.
fn keep_freed_memory_mapped() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: plain option getters/setters of the allocator, valid at any time. The index is
    // checked against the option's v3 default (1000 ms) before it is changed.
    unsafe {
        if libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == 1000 {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
}

mod bench_cmd;
mod cmd_data;
mod model_cmds;
mod reference_cmds;

/// Train and run small Qwen3-style language models (dense and MoE) on Burn.
#[derive(Parser, Debug)]
#[command(name = "qwen-burn", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train (or fine-tune) from a TOML run config.
    Train(TrainArgs),
    /// Generate text with a model (greedy, temperature, top-k, top-p; KV cache).
    Generate(model_cmds::GenerateArgs),
    /// Mean next-token loss of token rows given as JSON.
    Score(model_cmds::ScoreArgs),
    /// Perplexity of a text file.
    Eval(model_cmds::EvalArgs),
    /// Write a checkpoint (LoRA merged) as an HF model directory.
    Export(ExportArgs),
    /// Plot loss and learning-rate curves of one or more runs as PNG.
    Plot(PlotArgs),
    /// Train or load tokenizers.
    #[command(subcommand)]
    Tokenizer(cmd_data::TokenizerCmd),
    /// Prepare token shards.
    #[command(subcommand)]
    Data(cmd_data::DataCmd),
    /// Write the step-0 weights of a run config as an HF model directory.
    Init(reference_cmds::InitArgs),
    /// Dump the training batches of a run config, in the order `train` consumes them.
    Batches(reference_cmds::BatchesArgs),
    /// Benchmarks: training steps and generation speed.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCmd),
}

#[derive(clap::Args, Debug)]
struct TrainArgs {
    /// Run config (TOML).
    #[arg(long)]
    config: PathBuf,
    /// Override a config value, e.g. `--set optimizer.lr=3e-4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Device: flex, ndarray, wgpu, cuda[:N] (default: training.device of the config).
    #[arg(long)]
    device: Option<String>,
    /// Run directory (default: runs/<config file stem>).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Total optimizer steps (overrides training.max_steps, and so the schedule length).
    #[arg(long)]
    max_steps: Option<usize>,
    /// Continue from the newest good checkpoint in the run directory.
    #[arg(long)]
    resume: bool,
}

#[derive(clap::Args, Debug)]
struct ExportArgs {
    /// Checkpoint directory, run directory (newest checkpoint) or HF directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Output HF model directory.
    #[arg(long)]
    out: PathBuf,
    /// Export an MoE model trained with aux-loss-free balancing by dropping its routing biases
    /// (HF Qwen3-MoE has no such parameter, so routing in transformers will differ).
    #[arg(long)]
    drop_routing_bias: bool,
}

#[derive(clap::Args, Debug)]
struct PlotArgs {
    /// Run directories (several are overlaid).
    #[arg(required_unless_present = "table")]
    runs: Vec<PathBuf>,
    /// Output directory (default: RUN/plots for one run); with --table, the PNG file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Plot a JSONL table instead of runs: --x FIELD --y FIELD [--series FIELD].
    #[arg(long, conflicts_with = "runs")]
    table: Option<PathBuf>,
    #[arg(long, requires = "table")]
    x: Option<String>,
    #[arg(long, requires = "table")]
    y: Option<String>,
    #[arg(long, requires = "table")]
    series: Option<String>,
    /// Title of a table plot.
    #[arg(long, default_value = "")]
    title: String,
    /// Logarithmic y axis (when the values span at least a factor of 10; else linear).
    #[arg(long)]
    log_y: bool,
}

fn train(args: TrainArgs) -> Result<()> {
    let mut overrides = args.overrides.clone();
    if let Some(steps) = args.max_steps {
        overrides.push(format!("training.max_steps={steps}"));
    }
    let config = qwen_burn_train::RunConfig::load(&args.config, &overrides)
        .with_context(|| format!("loading run config {}", args.config.display()))?;
    let run_dir = args
        .run_dir
        .unwrap_or_else(|| qwen_burn_train::trainer::default_run_dir(&args.config));
    let opts = qwen_burn_train::RunOptions {
        device: args.device,
        run_dir: run_dir.clone(),
        resume: args.resume,
    };
    let summary = qwen_burn_train::train(&config, &opts)?;
    println!(
        "done: {} steps, val loss {}, {:.0} tokens/s, {:.1}s, checkpoint {}",
        summary.step,
        summary.val_loss.map_or("-".into(), |l| format!("{l:.4}")),
        summary.tokens_per_sec,
        summary.elapsed_secs,
        summary
            .checkpoint
            .map_or("-".into(), |p| p.display().to_string())
    );
    Ok(())
}

fn export(args: ExportArgs) -> Result<()> {
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
        if let Some(src) = args
            .checkpoint
            .ancestors()
            .take(3)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
        {
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

fn plot(args: PlotArgs) -> Result<()> {
    if let Some(table) = &args.table {
        let (Some(x), Some(y), Some(out)) = (&args.x, &args.y, &args.out) else {
            anyhow::bail!("--table needs --x FIELD, --y FIELD and --out FILE.png");
        };
        qwen_burn_train::plot::plot_table(
            table,
            x,
            y,
            args.series.as_deref(),
            out,
            &args.title,
            args.log_y,
        )?;
        println!("wrote {}", out.display());
        return Ok(());
    }
    let out = match (&args.out, args.runs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) => one.join("plots"),
        (None, _) => anyhow::bail!("several runs: give --out DIR"),
    };
    for path in qwen_burn_train::plot::plot_runs(&args.runs, &out)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn main() -> Result<()> {
    keep_freed_memory_mapped();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Train(a) => train(a),
        Command::Generate(a) => model_cmds::generate_cmd(a),
        Command::Score(a) => model_cmds::score(a),
        Command::Eval(a) => model_cmds::eval(a),
        Command::Export(a) => export(a),
        Command::Plot(a) => plot(a),
        Command::Tokenizer(c) => cmd_data::run_tokenizer(c),
        Command::Data(c) => cmd_data::run_data(c),
        Command::Bench(c) => bench_cmd::run(c),
        Command::Init(a) => reference_cmds::init(a),
        Command::Batches(a) => reference_cmds::batches(a),
    }
}
