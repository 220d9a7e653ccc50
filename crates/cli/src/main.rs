//! `qwen-burn`: train, generate, chat, score, eval, tokenizer, data, export, plot, bench.

use anyhow::Result;
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

/// Errors print their message and causes only: a refused writer or a config typo is not a bug,
/// and a 40-line stack trace under it (what anyhow adds whenever `RUST_BACKTRACE` is set) hides
/// the message. `QWEN_BURN_BACKTRACE=1` asks for error backtraces; panics keep Rust's own
/// `RUST_BACKTRACE` behaviour.
fn error_backtraces_only_on_request() {
    let wanted = std::env::var_os("QWEN_BURN_BACKTRACE").is_some_and(|v| v != "0");
    // SAFETY: called first thing in `main`, before any other thread exists, so nothing reads
    // the environment concurrently.
    unsafe {
        std::env::set_var("RUST_LIB_BACKTRACE", if wanted { "1" } else { "0" });
    }
}

mod commands;

use commands::*;

/// Train, fine-tune, evaluate and run small Qwen3-style language models (dense and MoE) on
/// Burn, on CPU or GPU. `qwen-burn config --defaults` lists every run-config key.
#[derive(Parser, Debug)]
#[command(name = "qwen-burn", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train (or fine-tune) from a TOML run config.
    Train(train::Args),
    /// Generate text with a model (greedy, temperature, top-k, top-p; KV cache).
    Generate(generate::Args),
    /// Chat with a model: one message a line on stdin, each reply streamed (the model's chat
    /// template; the KV cache kept between turns; /reset, /exit).
    Chat(chat::Args),
    /// Mean next-token loss of token rows given as JSON.
    Score(score::Args),
    /// Perplexity and bits per byte of a text, a multiple-choice task's acc and acc_norm,
    /// preference pairs' accuracy, or the rewards of generated completions.
    Eval(Box<eval::Args>),
    /// Write a checkpoint (LoRA merged) as an HF model directory.
    Export(export::Args),
    /// Plot loss and learning-rate curves of one or more runs as PNG.
    Plot(plot::Args),
    /// Train or load tokenizers.
    #[command(subcommand)]
    Tokenizer(tokenizer::Cmd),
    /// Prepare token shards.
    #[command(subcommand)]
    Data(data::Cmd),
    /// Write the step-0 weights of a run config as an HF model directory.
    Init(init::Args),
    /// Dump the training batches of a run config, in the order `train` consumes them.
    Batches(batches::Args),
    /// The run-config reference: every key with its default and doc comment.
    Config(config::Args),
    /// Benchmarks: training steps and generation speed.
    #[command(subcommand)]
    Bench(bench::Cmd),
}

fn main() -> Result<()> {
    error_backtraces_only_on_request();
    keep_freed_memory_mapped();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let command = Cli::parse().command;
    // A kernel choice that names no path this CPU has is refused before any work.
    qwen_burn_model::chosen_bf16_path()?;
    // Inference packs each frozen bf16 weight for the bf16 kernel once and keeps it (a second
    // copy of those weights) instead of packing it again in every product; training does not.
    // (`bench generate` holds its own.)
    let _packed = matches!(
        command,
        Command::Generate(_) | Command::Chat(_) | Command::Score(_) | Command::Eval(_)
    )
    .then(qwen_burn_model::keep_packed_weights);
    match command {
        Command::Train(a) => train::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Score(a) => score::run(a),
        Command::Eval(a) => eval::run(*a),
        Command::Export(a) => export::run(a),
        Command::Plot(a) => plot::run(a),
        Command::Tokenizer(c) => tokenizer::run(c),
        Command::Data(c) => data::run(c),
        Command::Bench(c) => bench::run(c),
        Command::Init(a) => init::run(a),
        Command::Batches(a) => batches::run(a),
        Command::Config(a) => config::run(a),
    }
}
