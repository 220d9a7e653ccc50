//! Glue between the run config and the data crate: prepared shards (tokenised once, cached),
//! the resumable sampler behind a background prefetcher, fixed validation batches.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qwen_burn_data::{
    Batch, ChatOptions, ChatTemplate, Cursor, Prefetcher, PrepareOptions, SftDataset, SftSampler,
    Split, Tok, TokenStore, WindowSampler, eval_batches, prepare,
};
use sha2::{Digest, Sha256};

use super::checkpoint::{ModelDir, find_beside, resolve_model_dir};
use super::preference_data::PreferenceSets;
use crate::config::{DataKind, ModelSource, RunConfig};
use crate::error::{Result, TrainError};

/// The config key of the template's variables, as errors name it.
const KWARGS: &str = "data.chat_template_kwargs";

/// Training batches (prefetched) and validation batches of a run.
pub struct DataPipeline {
    prefetcher: Prefetcher,
    val: Vec<Batch>,
    tok: Tok,
    tok_path: PathBuf,
    /// Text runs with `data.document_mask`: the end-of-document id that splits rows into
    /// documents.
    separator: Option<u32>,
    /// Preference runs: the training and validation pairs.
    preference: Option<PreferenceSets>,
    /// RL runs: the prompts.
    prompts: Option<crate::objective::rl::PromptSets>,
    /// SFT runs: how the conversations fill the training rows, for the header.
    summary: Option<String>,
}

/// `data: 600 examples in 193 rows of at most 129 tokens (data.packing =
/// "best_fit_decreasing"): the rows are 90.6% full`: what a packing (or one conversation a
/// row) leaves as padding.
fn sft_summary(d: &RunConfig, train: &SftDataset) -> String {
    let rows = train.len();
    let tokens: usize = train.rows().iter().map(|r| r.ids.len()).sum();
    let capacity = rows * (train.seq_len() + 1);
    let how = match d.data.pack {
        true => format!("data.packing = \"{}\"", d.data.packing),
        false => "one a row, data.pack = false".into(),
    };
    format!(
        "data: {} examples in {rows} row{} of at most {} tokens ({how}): the rows are {:.1}% full",
        train.rows().iter().map(|r| r.starts.len()).sum::<usize>(),
        if rows == 1 { "" } else { "s" },
        train.seq_len() + 1,
        100.0 * tokens as f64 / capacity.max(1) as f64
    )
}

/// `tokenizer.json` of `model.from` (the default of `data.tokenizer` there).
fn model_tokenizer(config: &RunConfig) -> Result<PathBuf> {
    let ModelSource::Pretrained(from) = &config.model else {
        return Err(TrainError::config(
            "data.tokenizer",
            "required key is missing",
        ));
    };
    let dir = match resolve_model_dir(from)? {
        ModelDir::Hf(dir) | ModelDir::Checkpoint(dir) => dir,
    };
    find_beside(&dir, "tokenizer.json").ok_or_else(|| {
        TrainError::config(
            "data.tokenizer",
            format!(
                "not given, and the model of model.from ({}) has no tokenizer.json beside it; \
                 give data.tokenizer",
                from.display()
            ),
        )
    })
}

/// Default shard cache of a config: `.cache/shards/<hash>`, keyed by everything that changes
/// the shards, so different corpora never overwrite each other and unchanged ones are reused.
fn default_cache_dir(config: &RunConfig, tok: &Tok) -> PathBuf {
    let d = &config.data;
    let mut h = Sha256::new();
    for input in &d.inputs {
        h.update(input.to_string_lossy().as_bytes());
        h.update([0]);
    }
    h.update(tok.hash().as_bytes());
    h.update(d.val_fraction.to_le_bytes());
    h.update(d.text_field.as_bytes());
    let digest = hex::encode(h.finalize());
    PathBuf::from(".cache/shards").join(&digest[..16])
}

impl DataPipeline {
    /// Open the data of `config`, positioned at `cursor` (the checkpoint's) if given.
    pub fn new(config: &RunConfig, cursor: Option<&Cursor>, vocab_size: usize) -> Result<Self> {
        let mut d = config.data.clone();
        if d.tokenizer.as_os_str().is_empty() {
            d.tokenizer = model_tokenizer(config)?;
        }
        let d = &d;
        let t = &config.training;
        let tok = Tok::from_file(&d.tokenizer)?;
        if tok.vocab_size() > vocab_size {
            return Err(TrainError::config(
                "data.tokenizer",
                format!(
                    "{} has {} tokens but the model's vocab_size is {vocab_size}",
                    d.tokenizer.display(),
                    tok.vocab_size()
                ),
            ));
        }
        let seed = t.seed;
        let mut separator = None;
        let mut preference = None;
        let mut prompts = None;
        let mut summary = None;
        let (prefetcher, val) = match d.kind {
            DataKind::Sft => {
                if d.inputs.len() != 1 {
                    return Err(TrainError::config(
                        "data.inputs",
                        "sft takes exactly one JSONL file",
                    ));
                }
                // The model's own template when its tokenizer ships one, else ChatML.
                let kwargs = d.template_kwargs();
                let template = match ChatTemplate::beside(&d.tokenizer)? {
                    Some(t) => Some(Arc::new(t.with_kwargs(kwargs, KWARGS)?)),
                    None => {
                        ChatTemplate::chatml().with_kwargs(kwargs, KWARGS)?;
                        None
                    }
                };
                if let Some(t) = &template {
                    tracing::info!(
                        "rendering chat data with the template of {}",
                        t.source().display()
                    );
                }
                let opts = ChatOptions {
                    seq_len: t.seq_len,
                    pack: d.pack,
                    packing: d.packing,
                    document_mask: d.document_mask,
                    system_prompt: None,
                    template,
                };
                let train = Arc::new(SftDataset::load(&d.inputs[0], &tok, &opts)?);
                summary = Some(sft_summary(config, &train));
                let mut sampler = SftSampler::for_dataset(&train, t.batch_size, seed)?
                    .with_global_batch(t.batch_size * t.grad_accum)?;
                if let Some(c) = cursor {
                    sampler.restore(c)?;
                }
                // Validation: `val_inputs` if given, else the first rows of the training set.
                let val_set = match d.val_inputs.first() {
                    Some(path) => Arc::new(SftDataset::load(path, &tok, &opts)?),
                    None => train.clone(),
                };
                let rows: Vec<usize> =
                    (0..val_set.len().min(t.eval_batches * t.batch_size)).collect();
                let val = rows
                    .chunks(t.batch_size)
                    .map(|r| val_set.batch(r))
                    .collect();
                (Prefetcher::sft(train, sampler, d.prefetch), val)
            }
            DataKind::Text => {
                let out = d
                    .cache_dir
                    .clone()
                    .unwrap_or_else(|| default_cache_dir(config, &tok));
                let meta = prepare(&PrepareOptions {
                    inputs: d.inputs.clone(),
                    tokenizer: d.tokenizer.clone(),
                    out: out.clone(),
                    val_fraction: d.val_fraction,
                    text_field: d.text_field.clone(),
                    threads: None,
                    progress: std::io::stderr().is_terminal(),
                })?;
                if !meta.reused {
                    tracing::info!("prepared token shards in {}", out.display());
                }
                let hash = tok.hash();
                let train = Arc::new(TokenStore::open(&out, Split::Train, Some(&hash))?);
                let mut sampler =
                    WindowSampler::for_store(&train, t.batch_size, t.seq_len, d.sampling, seed)?
                        .with_global_batch(t.batch_size * t.grad_accum)?;
                if let Some(c) = cursor {
                    sampler.restore(c)?;
                }
                let val_store = TokenStore::open(&out, Split::Val, Some(&hash))?;
                if d.document_mask {
                    separator = Some(train.meta().eos_id);
                }
                let val = eval_batches(&val_store, t.batch_size, t.seq_len, t.eval_batches)
                    .into_iter()
                    .map(|b| match separator {
                        Some(sep) => b.with_separator_documents(sep),
                        None => b,
                    })
                    .collect::<Vec<_>>();
                if val.is_empty() {
                    return Err(TrainError::config(
                        "data.val_fraction",
                        format!(
                            "the validation split ({} tokens) is shorter than one window of {} tokens; raise it",
                            val_store.len(),
                            t.seq_len + 1
                        ),
                    ));
                }
                (Prefetcher::windows(train, sampler, d.prefetch), val)
            }
            DataKind::Preference => {
                let template = ChatTemplate::beside(&d.tokenizer)?
                    .unwrap_or_else(ChatTemplate::chatml)
                    .with_kwargs(d.template_kwargs(), KWARGS)?;
                let (prefetcher, val, sets) =
                    super::preference_data::open(config, &tok, &template, cursor)?;
                preference = Some(sets);
                (prefetcher, val)
            }
            DataKind::Prompts => {
                let template = ChatTemplate::beside(&d.tokenizer)?
                    .unwrap_or_else(ChatTemplate::chatml)
                    .with_kwargs(d.template_kwargs(), KWARGS)?;
                let (prefetcher, val, sets) =
                    super::prompt_data::open(config, &tok, &template, cursor)?;
                prompts = Some(sets);
                (prefetcher, val)
            }
        };
        Ok(Self {
            prefetcher,
            val,
            tok,
            tok_path: d.tokenizer.clone(),
            separator,
            preference,
            prompts,
            summary,
        })
    }

    /// The prompts of an RL run.
    pub fn prompts(&self) -> Option<&crate::objective::rl::PromptSets> {
        self.prompts.as_ref()
    }

    /// How an SFT run's conversations fill its rows (a line for the header).
    pub fn summary(&self) -> Option<&str> {
        self.summary.as_deref()
    }

    /// The pairs of a preference run.
    pub fn preference(&self) -> Option<&PreferenceSets> {
        self.preference.as_ref()
    }

    /// The next training batch and the sampler cursor after it (for checkpoints).
    pub fn next_batch(&mut self) -> Result<(Batch, Cursor)> {
        let (batch, cursor) = self.prefetcher.next()?;
        let batch = match self.separator {
            Some(sep) => batch.with_separator_documents(sep),
            None => batch,
        };
        Ok((batch, cursor))
    }

    /// Fixed validation batches.
    pub fn val_batches(&self) -> &[Batch] {
        &self.val
    }

    /// The run's tokenizer.
    pub fn tokenizer(&self) -> Option<&Tok> {
        Some(&self.tok)
    }

    /// Where the tokenizer came from.
    pub fn tokenizer_path(&self) -> Option<&Path> {
        Some(&self.tok_path)
    }

    /// Seconds the training loop has waited on data so far.
    pub fn wait_secs(&self) -> f64 {
        self.prefetcher.stats().total_wait.as_secs_f64()
    }
}
