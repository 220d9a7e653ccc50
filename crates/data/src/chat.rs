//! Chat supervised fine-tuning data: conversations rendered with the Qwen chat template, a loss
//! mask on assistant tokens, and packed or padded rows.
//!
//! Input: JSONL (optionally `.gz`), one conversation per line, as OpenAI-style `messages`
//! (`role`/`content`) or ShareGPT `conversations` (`from`/`value`). Each message renders as
//! `<|im_start|>{role}\n{content}<|im_end|>\n`. Lines may also be TRL's prompt-completion or
//! text examples ([`crate::sft_example`]); everything below applies to them as to
//! conversations.
//!
//! Tokenisation is per segment (header, content, `<|im_end|>`, `"\n"`), which is what the
//! model sees at inference: the prompt ends with `<|im_start|>assistant\n` and the reply is
//! generated after it. The loss mask is 1 on the assistant's content tokens and its closing
//! `<|im_end|>` (so the model learns to stop), as HF TRL's `assistant_only_loss`; headers,
//! the `"\n"` after `<|im_end|>` and all non-assistant turns are 0.
//!
//! Rows hold at most `seq_len + 1` tokens. A longer conversation is truncated (counted in
//! [`SftStats::truncated`]); one with no assistant token left to predict is dropped. With
//! `pack = false` each row is one conversation, right-padded; with `pack = true` whole
//! conversations share rows, placed by [`ChatOptions::packing`] (best fit decreasing by
//! default, as TRL's `"bfd"`; see [`Packing`]), then padded.
//! Packed rows record where each conversation starts, and their batches carry per-document
//! positions ([`Batch::positions`]): each conversation attends only to itself and its RoPE
//! positions restart at 0, so it is trained exactly as if it were alone in its row (TRL's
//! `padding_free`, flash-attention's varlen). The trailing padding forms a document of its own.
//! [`ChatOptions::document_mask`] `= false` keeps the old behaviour (packed conversations see the
//! ones before them) for ablations.

use std::path::Path;
use std::sync::Arc;

use crate::batch::{Batch, Cursor, EpochOrder, IGNORE_INDEX, SampleMode, check_shape};
use crate::conversation::Message;
use crate::error::{DataError, Result};
use crate::ingest::{self, SourceFile};
use crate::packing::Packing;
use crate::preference::completion_eos;
use crate::sft_example::{SftExample, parse_example, tokenize_example};
use crate::template::ChatTemplate;
use crate::tokenizer::Tok;

/// Options of [`SftDataset::load`].
#[derive(Clone, Debug)]
pub struct ChatOptions {
    /// Positions per row (T); rows hold at most T + 1 tokens.
    pub seq_len: usize,
    /// `true`: pack several conversations per row; `false`: one per row, right-padded.
    pub pack: bool,
    /// With `pack`: keep packed conversations apart (see the module docs). On by default.
    pub document_mask: bool,
    /// With `pack`: how conversations are placed into rows.
    pub packing: Packing,
    /// Prepended as a `system` message to conversations that do not start with one.
    pub system_prompt: Option<String>,
    /// The model's chat template (`tokenizer_config.json`); `None` renders ChatML.
    pub template: Option<Arc<ChatTemplate>>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            seq_len: 512,
            pack: false,
            document_mask: true,
            packing: Packing::default(),
            system_prompt: None,
            template: None,
        }
    }
}

/// Concatenates one-conversation rows into rows of at most `max` tokens, placed by `packing`.
fn pack_rows(single: Vec<SftRow>, packing: Packing, max: usize) -> Vec<SftRow> {
    let lengths: Vec<usize> = single.iter().map(|r| r.ids.len()).collect();
    let mut single: Vec<Option<SftRow>> = single.into_iter().map(Some).collect();
    packing
        .rows(&lengths, max)
        .into_iter()
        .map(|members| {
            let mut row = SftRow {
                ids: Vec::new(),
                loss_mask: Vec::new(),
                starts: Vec::with_capacity(members.len()),
            };
            for i in members {
                let Some(one) = single[i].take() else {
                    continue;
                };
                row.starts.push(row.ids.len());
                row.ids.extend(one.ids);
                row.loss_mask.extend(one.loss_mask);
            }
            row
        })
        .collect()
}

/// One row: at most `seq_len + 1` token ids and their loss mask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SftRow {
    /// Token ids.
    pub ids: Vec<u32>,
    /// 1 where the token is a training target.
    pub loss_mask: Vec<u8>,
    /// Index in `ids` of each conversation's first token (`[0]` for one conversation).
    pub starts: Vec<usize>,
}

/// What loading did to the conversations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SftStats {
    /// Examples read (conversations, prompt-completion pairs or texts).
    pub conversations: usize,
    /// Conversations cut to `seq_len + 1` tokens.
    pub truncated: usize,
    /// Conversations dropped for having no assistant token to predict.
    pub dropped: usize,
    /// Tokens kept.
    pub tokens: usize,
    /// Tokens with loss mask 1.
    pub target_tokens: usize,
}

/// Tokenised, masked rows ready for batching.
#[derive(Clone, Debug)]
pub struct SftDataset {
    rows: Vec<SftRow>,
    seq_len: usize,
    pad_id: u32,
    stats: SftStats,
    /// Batches carry per-conversation positions (packed rows with the document mask).
    documents: bool,
}

impl SftDataset {
    /// Reads conversations from a JSONL file and tokenises them (see the module docs).
    pub fn load(path: &Path, tok: &Tok, opts: &ChatOptions) -> Result<Self> {
        let src = SourceFile::from_path(path);
        let raw = ingest::read_text(path, src.gz)?;
        let chatml = ChatTemplate::chatml();
        let template = opts.template.as_deref().unwrap_or(&chatml);
        let mut conversations = Vec::new();
        for (i, line) in raw.text.lines().enumerate() {
            if !line.trim().is_empty() {
                let example = parse_example(path, i + 1, line)?;
                if let Some(kwargs) = example.template_kwargs() {
                    template
                        .check_kwargs(kwargs, "chat_template_kwargs")
                        .map_err(|e| DataError::Jsonl {
                            path: path.to_path_buf(),
                            line: i + 1,
                            message: e.to_string(),
                        })?;
                }
                conversations.push(example);
            }
        }
        if conversations.is_empty() {
            return Err(DataError::EmptyCorpus {
                inputs: path.display().to_string(),
                detail: "no examples (expected one JSON object per line)".into(),
            });
        }
        let ds = Self::from_examples(&conversations, tok, opts)?;
        if ds.rows.is_empty() {
            return Err(DataError::EmptyCorpus {
                inputs: path.display().to_string(),
                detail: format!(
                    "none of {} examples has a token to train on (an assistant message, a \
                     completion or a text)",
                    conversations.len()
                ),
            });
        }
        tracing::info!(file = %path.display(), stats = ?ds.stats, rows = ds.rows.len(), "loaded SFT data");
        Ok(ds)
    }

    /// Tokenises in-memory conversations (see the module docs).
    pub fn from_conversations(
        conversations: &[Vec<Message>],
        tok: &Tok,
        opts: &ChatOptions,
    ) -> Result<Self> {
        let examples: Vec<SftExample> = conversations
            .iter()
            .map(|c| SftExample::Conversation {
                messages: c.clone(),
                template_kwargs: Default::default(),
            })
            .collect();
        Self::from_examples(&examples, tok, opts)
    }

    /// Tokenises in-memory examples of any layout ([`SftExample`]).
    pub fn from_examples(examples: &[SftExample], tok: &Tok, opts: &ChatOptions) -> Result<Self> {
        check_shape(1, opts.seq_len)?;
        let max = opts.seq_len + 1;
        let pad_id = tok.eos_id().unwrap_or(0);
        let chatml = ChatTemplate::chatml();
        let template = opts.template.as_deref().unwrap_or(&chatml);
        let eos = match examples
            .iter()
            .all(|e| matches!(e, SftExample::Conversation { .. }))
        {
            true => String::new(),
            false => completion_eos(tok, template)?,
        };
        let mut stats = SftStats {
            conversations: examples.len(),
            ..SftStats::default()
        };
        let mut rows: Vec<SftRow> = Vec::new();
        for example in examples {
            let (mut ids, mut mask) = match (example, &opts.system_prompt) {
                (
                    SftExample::Conversation {
                        messages: conv,
                        template_kwargs,
                    },
                    Some(sys),
                ) if conv.first().is_none_or(|m| m.role != "system") => {
                    let mut messages = vec![Message::new("system", sys)];
                    messages.extend_from_slice(conv);
                    let conversation = SftExample::Conversation {
                        messages,
                        template_kwargs: template_kwargs.clone(),
                    };
                    tokenize_example(&conversation, tok, template, &eos)?
                }
                _ => tokenize_example(example, tok, template, &eos)?,
            };
            if ids.len() > max {
                ids.truncate(max);
                mask.truncate(max);
                stats.truncated += 1;
            }
            // Position 0 is never a target.
            if !mask.iter().skip(1).any(|&m| m == 1) {
                stats.dropped += 1;
                continue;
            }
            stats.tokens += ids.len();
            stats.target_tokens += mask.iter().skip(1).filter(|&&m| m == 1).count();
            rows.push(SftRow {
                ids,
                loss_mask: mask,
                starts: vec![0],
            });
        }
        if opts.pack {
            rows = pack_rows(rows, opts.packing, max);
        }
        Ok(SftDataset {
            rows,
            seq_len: opts.seq_len,
            pad_id,
            stats,
            documents: opts.pack && opts.document_mask,
        })
    }

    /// Number of rows (conversations when padding, packed rows when packing).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows.
    pub fn rows(&self) -> &[SftRow] {
        &self.rows
    }

    /// Positions per row (T).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Id used for padding (`<|endoftext|>`, else 0); padded positions are masked anyway.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// What loading did.
    pub fn stats(&self) -> &SftStats {
        &self.stats
    }

    /// A `[rows.len(), T]` batch of the given rows: inputs `ids[..L-1]` then padding, targets
    /// the next id where its loss mask is 1 else [`IGNORE_INDEX`], attention mask 1 on real
    /// inputs; for packed rows with the document mask, the positions of each input inside its
    /// conversation (the padding after the last one counts as one more document).
    ///
    /// # Panics
    /// If a row index is out of range.
    pub fn batch(&self, rows: &[usize]) -> Batch {
        let t = self.seq_len;
        let n = rows.len() * t;
        let (mut inputs, mut targets, mut attn) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut positions = Vec::with_capacity(if self.documents { n } else { 0 });
        for &r in rows {
            let row = &self.rows[r];
            let real = row.ids.len().saturating_sub(1);
            if self.documents {
                let mut doc_start = 0;
                let mut next = row.starts.iter().skip(1).peekable();
                for p in 0..t {
                    if next.next_if(|&&s| s == p).is_some() || p == real {
                        doc_start = p;
                    }
                    positions.push((p - doc_start) as u32);
                }
            }
            for p in 0..t {
                if p < real {
                    inputs.push(row.ids[p]);
                    attn.push(1);
                    targets.push(if row.loss_mask[p + 1] == 1 {
                        row.ids[p + 1] as i64
                    } else {
                        IGNORE_INDEX
                    });
                } else {
                    inputs.push(self.pad_id);
                    attn.push(0);
                    targets.push(IGNORE_INDEX);
                }
            }
        }
        Batch {
            batch_size: rows.len(),
            seq_len: t,
            inputs,
            targets,
            attention_mask: Some(attn),
            positions: self.documents.then_some(positions),
            pairs: None,
        }
    }
}

/// Seeded epoch shuffle over SFT rows, resumable through a [`Cursor`] (mode `epochs`).
#[derive(Clone, Debug)]
pub struct SftSampler {
    batch_size: usize,
    global_rows: usize,
    seq_len: usize,
    step: u64,
    order: EpochOrder,
}

impl SftSampler {
    /// A sampler over `num_rows` rows of `seq_len` positions.
    pub fn new(num_rows: usize, batch_size: usize, seq_len: usize, seed: u64) -> Result<Self> {
        check_shape(batch_size, seq_len)?;
        if num_rows == 0 || num_rows > u32::MAX as usize {
            return Err(DataError::option(
                "SFT dataset",
                format!("{num_rows} rows; need between 1 and 2^32"),
            ));
        }
        Ok(SftSampler {
            batch_size,
            global_rows: batch_size,
            seq_len,
            step: 0,
            order: EpochOrder::new(num_rows, seed),
        })
    }

    /// A sampler over all rows of `dataset`.
    pub fn for_dataset(dataset: &SftDataset, batch_size: usize, seed: u64) -> Result<Self> {
        Self::new(dataset.len(), batch_size, dataset.seq_len(), seed)
    }

    /// The state after the batches produced so far.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            mode: SampleMode::Epochs,
            seed: self.order.seed,
            batch_size: self.batch_size,
            seq_len: self.seq_len,
            num_items: self.order.len(),
            epoch: self.order.epoch,
            position: self.order.position,
            step: self.step,
            global_batch: self.global_rows,
        }
    }

    /// Records the global batch (`batch_size x grad_accum`) in the cursor, so that a resume may
    /// split it differently (the epoch order is one row after another whatever the split).
    pub fn with_global_batch(mut self, global_rows: usize) -> Result<Self> {
        crate::batch::check_global_batch(global_rows, self.batch_size)?;
        self.global_rows = global_rows;
        Ok(self)
    }

    /// Continues from a saved cursor (same checks as [`crate::WindowSampler::restore`]).
    pub fn restore(&mut self, c: &Cursor) -> Result<()> {
        c.check_compatible(&self.cursor())?;
        self.step = c.steps_at(self.batch_size);
        self.order.seek(c.seed, c.epoch, c.position);
        Ok(())
    }

    /// The next batch; it continues into the next epoch when the current one runs out.
    ///
    /// # Panics
    /// If `dataset` has fewer rows or another `seq_len` than this sampler was built for.
    pub fn next_batch(&mut self, dataset: &SftDataset) -> Batch {
        assert!(
            dataset.len() as u64 == self.order.len() && dataset.seq_len() == self.seq_len,
            "SFT sampler built for {} rows of {} used with {} rows of {}",
            self.order.len(),
            self.seq_len,
            dataset.len(),
            dataset.seq_len()
        );
        dataset.batch(&self.next_rows())
    }

    /// The rows of the next batch (and the step counted), for datasets that build their own
    /// batches from row indices (preference pairs).
    pub fn next_rows(&mut self) -> Vec<usize> {
        let rows: Vec<usize> = (0..self.batch_size)
            .map(|_| self.order.next_item())
            .collect();
        self.step += 1;
        rows
    }
}
