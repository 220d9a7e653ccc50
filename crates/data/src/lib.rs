//! Data for qwen-burn: tokenizers, corpus ingestion into packed token shards, resumable
//! batching with background prefetch, and chat SFT data.
//!
//! Reading order:
//! - [`error`]: [`DataError`] and [`Result`].
//! - [`tokenizer`]: [`Tok`] (any HF `tokenizer.json`) and [`train_bpe`] (byte-level BPE).
//! - [`ingest`]: which files are read and how they become documents.
//! - [`shards`]: the shard format, [`ShardMeta`] and the memory-mapped [`TokenStore`].
//! - [`prepare`](mod@prepare): parallel, idempotent tokenisation into shards.
//! - [`batch`]: [`Batch`] and the serialisable [`Cursor`].
//! - [`sampler`]: [`WindowSampler`] (random or epoch windows) and [`eval_batches`].
//! - [`prefetch`]: [`Prefetcher`], batches built on a background thread.
//! - [`tasks`]: multiple-choice benchmark files ([`McTask`]) in the common layouts;
//!   [`fewshot`]: their few-shot examples.
//! - [`chat`]: Qwen chat template, assistant-only loss mask, [`SftDataset`], [`SftSampler`].
//! - [`prompts`]: RL prompts with reference answers ([`PromptSet`], [`load_prompts`]).
//!
//! This crate depends on no other workspace crate and not on burn: batches are plain
//! row-major vectors that the trainer turns into tensors.

pub mod batch;
pub mod chat;
pub mod conversation;
pub mod error;
pub mod fewshot;
pub mod ingest;
pub mod packing;
pub mod parquet_source;
pub mod preference;
pub mod prefetch;
pub mod prepare;
pub mod prompts;
pub mod sampler;
pub mod sft_example;
pub mod shards;
pub mod tasks;
pub mod template;
pub mod tokenizer;

pub use batch::{Batch, Cursor, IGNORE_INDEX, SampleMode};
pub use chat::{ChatOptions, SftDataset, SftRow, SftSampler, SftStats};
pub use conversation::{Message, render_chat, tokenize_chat};
pub use error::{DataError, Result};
pub use packing::Packing;
pub use preference::{
    PreferenceData, PreferencePair, PreferenceStats, Sequence, Truncation, completion_eos,
    load_preferences,
};
pub use prefetch::{PrefetchStats, Prefetcher};
pub use prepare::{PrepareOptions, prepare, prepare_with_shard_size};
pub use prompts::{PromptItem, PromptSet, load_prompts};
pub use sampler::{WindowSampler, eval_batches};
pub use sft_example::{SftExample, parse_example, tokenize_example};
pub use shards::{ShardFile, ShardMeta, SourceMeta, Split, SplitMeta, TokenStore};
pub use tasks::{Fewshot, FewshotSampler, Layout, McItem, McTask, read_task};
pub use template::{ChatTemplate, TemplateKwargs};
pub use tokenizer::{Tok, TrainBpeOptions, default_special_tokens, train_bpe};
