//! `qwen-burn eval`: perplexity of a text in windows of exactly `--context` tokens.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use qwen_burn_train::eval::windowed_loss;

use super::{ModelArgs, find_tokenizer};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to measure perplexity on (.gz read transparently).
    #[arg(long)]
    pub text: PathBuf,
    /// tokenizer.json (default: next to the model).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Tokens per window (default: the model's max_position_embeddings, at most 1024).
    #[arg(long)]
    pub context: Option<usize>,
    /// Windows per forward pass.
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    /// Score at most the first N tokens of the text.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Also report the loss by position inside the window, in buckets of N positions
    /// (`loss_by_position`): shows how a model does beyond the context it was trained at.
    #[arg(long)]
    pub bucket: Option<usize>,
}

pub fn run(args: Args) -> Result<()> {
    let (model, device) = args.model.load()?;
    let tok = find_tokenizer(&args.model.model, args.tokenizer.as_deref())?
        .context("no tokenizer.json next to the model; pass --tokenizer")?;
    let text = qwen_burn_data::ingest::read_text_file(&args.text)
        .with_context(|| format!("reading {}", args.text.display()))?;
    // A tokenizer with more tokens than the model has embeddings would index past them.
    let (tok_vocab, model_vocab) = (tok.vocab_size(), model.config.vocab_size);
    if tok_vocab > model_vocab {
        bail!(
            "tokenizer {} has {tok_vocab} tokens but the model's vocab_size is {model_vocab}: it \
             is not this model's tokenizer",
            tok.path().display()
        );
    }
    let mut ids = tok.encode(&text)?;
    if let Some(max) = args.max_tokens {
        ids.truncate(max);
    }
    let context = args
        .context
        .unwrap_or(model.config.max_position_embeddings.min(1024));
    let show = std::io::stderr().is_terminal();
    let result = windowed_loss(
        &model,
        &ids,
        context,
        args.batch_size,
        args.bucket,
        &device,
        |scored| {
            if show {
                eprint!("\reval: {scored} predictions scored");
            }
        },
    )
    .with_context(|| format!("evaluating {}", args.text.display()))?;
    if show {
        eprintln!();
    }
    super::require_finite(&model, result.loss, "loss")?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}
