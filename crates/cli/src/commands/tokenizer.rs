//! `qwen-burn tokenizer train|encode|decode|info`: thin wrappers over `qwen-burn-data`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use qwen_burn_data::{Tok, TrainBpeOptions, default_special_tokens, train_bpe};

/// Tokenizer commands.
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
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
pub fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Train {
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
        Cmd::Encode {
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
        Cmd::Decode { tokenizer, ids } => {
            let tok = Tok::from_file(&tokenizer)?;
            println!("{}", tok.decode(&ids)?);
        }
        Cmd::Info { tokenizer } => {
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
