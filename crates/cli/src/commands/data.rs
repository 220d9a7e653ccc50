//! `qwen-burn data prepare|inspect`: token shards, thin wrappers over `qwen-burn-data`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use qwen_burn_data::{PrepareOptions, ShardMeta, Split, Tok, TokenStore, prepare};

/// `--split` of `data inspect`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum SplitArg {
    /// The training split.
    Train,
    /// The validation split.
    Val,
}

/// Data commands.
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
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
        /// Fraction of each source's tokens (its tail) kept for validation; the default is the
        /// run config's (`data.val_fraction`), so a run with `data.cache_dir` pointing at these
        /// shards uses them as they are.
        #[arg(long, default_value_t = qwen_burn_train::config::DataConfig::default().val_fraction)]
        val_fraction: f64,
        /// Field holding the text in JSONL inputs, or the string column of Parquet inputs.
        #[arg(long, visible_alias = "text-column", default_value = "text")]
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
        /// Split to sample from.
        #[arg(long, value_enum, default_value_t = SplitArg::Train)]
        split: SplitArg,
        /// Decode the first tokens with this tokenizer (must match the shards).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// How many tokens to decode.
        #[arg(long, default_value_t = 64)]
        tokens: usize,
    },
}

/// Runs a data command.
pub fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Prepare {
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
        Cmd::Inspect {
            dir,
            split,
            tokenizer,
            tokens,
        } => {
            let split = match split {
                SplitArg::Train => Split::Train,
                SplitArg::Val => Split::Val,
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
