//! `qwen-burn tokenizer ...` and `qwen-burn data ...`: thin wrappers over `qwen-burn-data`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use qwen_burn_data::{
    PrepareOptions, ShardMeta, Split, Tok, TokenStore, TrainBpeOptions, default_special_tokens,
    prepare, train_bpe,
};

/// Tokenizer commands.
#[derive(clap::Subcommand, Debug)]
pub enum TokenizerCmd {
    /// Train a byte-level BPE (Qwen-style pre-tokenizer) on text/JSONL files or directories.
    Train {
        /// Files or directories (`*.txt`, `*.jsonl`, optionally `.gz`; directories recursively).
        #[arg(long, required = true, num_args = 1..)]
        input: Vec<PathBuf>,
        /// Vocabulary size, special tokens and the 256 byte symbols included.
        #[arg(long)]
        vocab_size: usize,
        /// Where to write `tokenizer.json`.
        #[arg(long)]
        out: PathBuf,
        /// Special tokens, ids 0.. in order [default: <|endoftext|> <|im_start|> <|im_end|>].
        #[arg(long, num_args = 1..)]
        special_tokens: Option<Vec<String>>,
        /// Minimum pair frequency for a merge.
        #[arg(long, default_value_t = 2)]
        min_frequency: u64,
        /// Field holding the text in JSONL inputs.
        #[arg(long, default_value = "text")]
        text_field: String,
    },
    /// Print the token ids of a text as a JSON array.
    Encode {
        /// The `tokenizer.json` to use.
        #[arg(long)]
        tokenizer: PathBuf,
        /// Text to encode.
        #[arg(long, conflicts_with = "file")]
        text: Option<String>,
        /// File whose contents to encode (`.gz` is decompressed).
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Print the text of token ids (special tokens kept).
    Decode {
        /// The `tokenizer.json` to use.
        #[arg(long)]
        tokenizer: PathBuf,
        /// Token ids, space- or comma-separated.
        #[arg(long, required = true, num_args = 1.., value_delimiter = ',')]
        ids: Vec<u32>,
    },
    /// Print a tokenizer's vocabulary size, special ids and hash.
    Info {
        /// The `tokenizer.json` to describe.
        #[arg(long)]
        tokenizer: PathBuf,
    },
}

/// Runs a tokenizer command.
pub fn run_tokenizer(cmd: TokenizerCmd) -> Result<()> {
    match cmd {
        TokenizerCmd::Train {
            input,
            vocab_size,
            out,
            special_tokens,
            min_frequency,
            text_field,
        } => {
            let opts = TrainBpeOptions {
                inputs: input,
                vocab_size,
                special_tokens: special_tokens.unwrap_or_else(default_special_tokens),
                min_frequency,
                text_field,
            };
            let tok = train_bpe(&opts, &out).context("training the BPE tokenizer")?;
            println!(
                "wrote {} ({} ids, sha256 {})",
                out.display(),
                tok.vocab_size(),
                tok.hash()
            );
        }
        TokenizerCmd::Encode {
            tokenizer,
            text,
            file,
        } => {
            let tok = Tok::from_file(&tokenizer)?;
            let text = match (text, file) {
                (Some(t), _) => t,
                (None, Some(f)) => qwen_burn_data::ingest::read_text_file(&f)?,
                (None, None) => bail!("give --text or --file"),
            };
            let ids = tok.encode(&text)?;
            println!("{}", serde_json::to_string(&ids)?);
        }
        TokenizerCmd::Decode { tokenizer, ids } => {
            let tok = Tok::from_file(&tokenizer)?;
            println!("{}", tok.decode(&ids)?);
        }
        TokenizerCmd::Info { tokenizer } => {
            let tok = Tok::from_file(&tokenizer)?;
            let info = serde_json::json!({
                "path": tokenizer.display().to_string(),
                "vocab_size": tok.vocab_size(),
                "eos_id": tok.eos_id(),
                "im_start_id": tok.token_id("<|im_start|>"),
                "im_end_id": tok.token_id("<|im_end|>"),
                "sha256": tok.hash(),
            });
            println!("{}", serde_json::to_string_pretty(&info)?);
        }
    }
    Ok(())
}

/// Data commands.
#[derive(clap::Subcommand, Debug)]
pub enum DataCmd {
    /// Tokenise a corpus into packed token shards (does nothing if they are up to date).
    Prepare {
        /// Files or directories (`*.txt`, `*.jsonl`, optionally `.gz`; directories recursively).
        #[arg(long, required = true, num_args = 1..)]
        input: Vec<PathBuf>,
        /// The `tokenizer.json` to encode with.
        #[arg(long)]
        tokenizer: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Fraction of each source's tokens (its tail) kept for validation.
        #[arg(long, default_value_t = 0.05)]
        val_fraction: f64,
        /// Field holding the text in JSONL inputs.
        #[arg(long, default_value = "text")]
        text_field: String,
        /// Tokenisation threads [default: all cores].
        #[arg(long)]
        threads: Option<usize>,
        /// Hide the progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Print a shard directory's metadata summary and, with --tokenizer, decode its first tokens.
    Inspect {
        /// Shard directory (holding `meta.json`).
        #[arg(long)]
        dir: PathBuf,
        /// Split to sample from: `train` or `val`.
        #[arg(long, default_value = "train")]
        split: String,
        /// Decode the first tokens with this tokenizer (must match the shards).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// How many tokens to decode.
        #[arg(long, default_value_t = 64)]
        tokens: usize,
    },
}

/// Runs a data command.
pub fn run_data(cmd: DataCmd) -> Result<()> {
    match cmd {
        DataCmd::Prepare {
            input,
            tokenizer,
            out,
            val_fraction,
            text_field,
            threads,
            quiet,
        } => {
            let opts = PrepareOptions {
                inputs: input,
                tokenizer,
                out: out.clone(),
                val_fraction,
                text_field,
                threads,
                progress: !quiet,
            };
            let meta = prepare(&opts)
                .with_context(|| format!("preparing token shards in {}", out.display()))?;
            let what = if meta.reused {
                "up to date, nothing to do"
            } else {
                "written"
            };
            println!("{}: {what}", out.display());
            print_summary(&meta);
        }
        DataCmd::Inspect {
            dir,
            split,
            tokenizer,
            tokens,
        } => {
            let split = match split.as_str() {
                "train" => Split::Train,
                "val" => Split::Val,
                other => bail!("--split is {other:?}, expected \"train\" or \"val\""),
            };
            let tok = tokenizer.as_deref().map(Tok::from_file).transpose()?;
            let hash = tok.as_ref().map(Tok::hash);
            let store = TokenStore::open(&dir, split, hash.as_deref())?;
            print_summary(store.meta());
            if let Some(tok) = tok {
                let ids = store.read_vec(0, tokens.min(store.len()));
                println!(
                    "first {} tokens of {}: {ids:?}",
                    ids.len(),
                    store.describe()
                );
                println!("{:?}", tok.decode(&ids)?);
            }
        }
    }
    Ok(())
}

fn print_summary(meta: &ShardMeta) {
    println!(
        "tokenizer sha256 {} ({}), vocab {}, dtype {}, eos {}",
        meta.tokenizer_hash, meta.tokenizer_path, meta.vocab_size, meta.dtype, meta.eos_id
    );
    for (name, s) in [("train", &meta.train), ("val", &meta.val)] {
        println!(
            "{name}: {} tokens, {} documents, {} shard file(s)",
            s.tokens,
            s.documents,
            s.shards.len()
        );
    }
    println!("{} source files:", meta.sources.len());
    for s in &meta.sources {
        println!(
            "  {} ({} bytes, {} documents, {} tokens, sha256 {})",
            s.path,
            s.bytes,
            s.documents,
            s.tokens,
            &s.sha256[..12.min(s.sha256.len())]
        );
    }
}
