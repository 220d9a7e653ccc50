//! Preference pairs (`data.kind = "preference"`) for DPO and its cousins, in TRL's dataset
//! layouts, tokenised as TRL 1.16.0's `DPOTrainer` tokenises them.
//!
//! Layouts (JSONL, one pair per line):
//! - explicit prompt, text: `{"prompt": str, "chosen": str, "rejected": str}`;
//! - explicit prompt, conversational: `prompt` a list of messages, `chosen` and `rejected` lists
//!   of (assistant) messages, rendered with the model's chat template;
//! - implicit prompt: `{"chosen", "rejected"}` only, text or conversational; the prompt is their
//!   shared prefix (TRL's `extract_prompt`: of characters, less a space just before the first
//!   difference; or of whole messages).
//!
//! Tokenisation (TRL's `tokenize_fn`): text completions get the EOS token appended as text
//! unless they end with it; the prompt is tokenised alone and again with each completion, and
//! the completion starts where the prompt's tokens and the joint tokens first differ (TRL's
//! `common_prefix_length`), so a token merging across the boundary belongs to the completion.
//! Conversational rows are rendered first: the prompt with the generation prompt, prompt plus
//! completion without. Truncation (TRL's collator, `max_length`): `keep_start` cuts each
//! sequence's end and drops a pair whose prompt alone fills `max_length`; `keep_end` cuts
//! sequences' starts.

use std::path::Path;

use serde_json::Value;

use crate::batch::{Batch, IGNORE_INDEX};
use crate::conversation::Message;
use crate::error::{DataError, Result};
use crate::ingest;
use crate::sft_example::messages;
use crate::template::{ChatTemplate, TemplateKwargs};
use crate::tokenizer::Tok;

/// One sequence of a pair: prompt then completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// Token ids, prompt first.
    pub ids: Vec<u32>,
    /// How many of them are the prompt's (the rest is the completion, which the loss scores).
    pub prompt_len: usize,
}

impl Sequence {
    /// The completion's tokens.
    pub fn completion(&self) -> &[u32] {
        &self.ids[self.prompt_len..]
    }
}

/// One pair's two sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferencePair {
    /// Prompt and chosen completion.
    pub chosen: Sequence,
    /// Prompt and rejected completion.
    pub rejected: Sequence,
}

/// How sequences longer than `max_length` are cut (TRL's `truncation_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Truncation {
    /// Keep the start: the completion's end is cut; a pair whose prompt fills `max_length` is
    /// dropped (TRL's default).
    #[default]
    KeepStart,
    /// Keep the end: the prompt's start is cut.
    KeepEnd,
}

/// What loading a preference file found besides its pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreferenceStats {
    /// Pairs kept.
    pub pairs: usize,
    /// Pairs whose chosen and rejected completions are the same tokens (kept; they teach
    /// nothing).
    pub identical: usize,
    /// Pairs dropped because the prompt alone fills `max_length` (`keep_start`).
    pub dropped: usize,
    /// Sequences cut to `max_length`.
    pub truncated: usize,
}

/// A preference file, tokenised.
#[derive(Debug, Clone)]
pub struct PreferenceData {
    /// The pairs, in file order.
    pub pairs: Vec<PreferencePair>,
    /// What loading found.
    pub stats: PreferenceStats,
}

/// The common prefix length of two token lists (TRL's `common_prefix_length`).
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// TRL's `extract_prompt` on text: the shared prefix, less a space just before the difference.
fn split_text(chosen: &str, rejected: &str) -> (String, String, String) {
    let c: Vec<char> = chosen.chars().collect();
    let r: Vec<char> = rejected.chars().collect();
    let n = c.len().min(r.len());
    // Python's loop leaves `idx` at its last value when no character differs.
    let mut idx = n.saturating_sub(1);
    for i in 0..n {
        if c[i] != r[i] {
            idx = if i > 0 && c[i - 1] == ' ' { i - 1 } else { i };
            // Python's `example["chosen"][idx - 1]` at idx 0 reads the last character.
            if i == 0 && c.last() == Some(&' ') {
                idx = 0;
            }
            break;
        }
    }
    let s = |v: &[char]| v.iter().collect::<String>();
    (s(&c[..idx]), s(&c[idx..]), s(&r[idx..]))
}

/// The texts of one row to tokenise: `(prompt, prompt + chosen, prompt + rejected)`.
fn row_texts(
    obj: &serde_json::Map<String, Value>,
    template: &ChatTemplate,
    kwargs: &TemplateKwargs,
    eos: &str,
    err: &dyn Fn(String) -> DataError,
) -> Result<(String, String, String)> {
    let field = |name: &str| {
        obj.get(name).ok_or_else(|| {
            err(format!(
                "no \"{name}\" field (TRL's layouts: prompt/chosen/rejected, or chosen/rejected)"
            ))
        })
    };
    let (chosen, rejected) = (field("chosen")?, field("rejected")?);
    if let Some(other) = obj.keys().find(|k| {
        !matches!(
            k.as_str(),
            "prompt" | "chosen" | "rejected" | "chat_template_kwargs"
        )
    }) {
        return Err(err(format!(
            "unknown field \"{other}\" (expected prompt, chosen, rejected, chat_template_kwargs)"
        )));
    }
    match (chosen, rejected) {
        (Value::String(c), Value::String(r)) => {
            let (prompt, c, r) = match obj.get("prompt") {
                Some(Value::String(p)) => (p.clone(), c.clone(), r.clone()),
                Some(other) => {
                    return Err(err(format!(
                        "\"prompt\" is {}, expected a string like \"chosen\"",
                        ingest::json_type(other)
                    )));
                }
                None => split_text(c, r),
            };
            for (name, text) in [("chosen", &c), ("rejected", &r)] {
                if text.is_empty() {
                    return Err(err(format!(
                        "\"{name}\" is empty after the prompt: a completion needs text"
                    )));
                }
            }
            let with_eos = |t: &str| {
                if t.ends_with(eos) {
                    t.to_string()
                } else {
                    format!("{t}{eos}")
                }
            };
            Ok((
                prompt.clone(),
                prompt.clone() + &with_eos(&c),
                prompt + &with_eos(&r),
            ))
        }
        (Value::Array(_), Value::Array(_)) => {
            let mut c = messages(chosen, "chosen", err)?;
            let mut r = messages(rejected, "rejected", err)?;
            let prompt = match obj.get("prompt") {
                Some(p) => messages(p, "prompt", err)?,
                None => {
                    let n = c.iter().zip(&r).take_while(|(a, b)| a == b).count();
                    let prompt = c[..n].to_vec();
                    c.drain(..n);
                    r.drain(..n);
                    prompt
                }
            };
            for (name, list) in [("chosen", &c), ("rejected", &r)] {
                if list.is_empty() {
                    return Err(err(format!("\"{name}\" has no message after the prompt")));
                }
            }
            let render =
                |m: &[Message], generation: bool| template.render_with(m, generation, kwargs);
            let joined = |tail: &[Message]| [prompt.as_slice(), tail].concat();
            Ok((
                render(&prompt, true)?,
                render(&joined(&c), false)?,
                render(&joined(&r), false)?,
            ))
        }
        (c, r) => Err(err(format!(
            "\"chosen\" is {} and \"rejected\" {}: both strings (text) or both lists of messages",
            ingest::json_type(c),
            ingest::json_type(r)
        ))),
    }
}

/// The EOS text TRL appends to text completions: the `eos_token` of the tokenizer's config,
/// else the tokenizer's document separator.
pub fn completion_eos(tok: &Tok, template: &ChatTemplate) -> Result<String> {
    match template.eos_token() {
        Some(e) => Ok(e.to_string()),
        None => tok.decode(&[tok.require_eos()?]),
    }
}

/// Read and tokenise a preference JSONL file (see the module docs). `eos` is the text appended
/// to text completions (the tokenizer's EOS token); `max_length` bounds each sequence (prompt
/// plus completion), cut as `truncation` says.
pub fn load_preferences(
    path: &Path,
    tok: &Tok,
    template: &ChatTemplate,
    eos: &str,
    max_length: Option<usize>,
    truncation: Truncation,
) -> Result<PreferenceData> {
    let text = ingest::read_text_file(path)?;
    let mut stats = PreferenceStats::default();
    let mut pairs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_no = i + 1;
        let err = |message: String| DataError::Jsonl {
            path: path.to_path_buf(),
            line: line_no,
            message,
        };
        let obj = ingest::jsonl_object(path, line_no, line)?;
        let renders = matches!(obj.get("chosen"), Some(Value::Array(_)));
        let kwargs =
            ingest::row_template_kwargs(&obj, renders, "line", Some(template)).map_err(err)?;
        let (p, pc, pr) = row_texts(&obj, template, &kwargs, eos, &err)?;
        let (p, pc, pr) = (tok.encode(&p)?, tok.encode(&pc)?, tok.encode(&pr)?);
        let n = common_prefix(&p, &pc).min(common_prefix(&p, &pr));
        if pc.len() == n || pr.len() == n {
            let which = if pc.len() == n { "chosen" } else { "rejected" };
            return Err(err(format!("\"{which}\" has no token after the prompt's")));
        }
        if max_length.is_some_and(|max| n >= max) && truncation == Truncation::KeepStart {
            stats.dropped += 1;
            continue;
        }
        let mut pair = PreferencePair {
            chosen: Sequence {
                ids: pc,
                prompt_len: n,
            },
            rejected: Sequence {
                ids: pr,
                prompt_len: n,
            },
        };
        if let Some(max) = max_length {
            for seq in [&mut pair.chosen, &mut pair.rejected] {
                if seq.ids.len() <= max {
                    continue;
                }
                stats.truncated += 1;
                match truncation {
                    Truncation::KeepStart => seq.ids.truncate(max),
                    Truncation::KeepEnd => {
                        let cut = seq.ids.len() - max;
                        seq.ids.drain(..cut);
                        seq.prompt_len = seq.prompt_len.saturating_sub(cut);
                    }
                }
            }
        }
        if pair.chosen.completion() == pair.rejected.completion() {
            stats.identical += 1;
        }
        pairs.push(pair);
    }
    stats.pairs = pairs.len();
    if pairs.is_empty() {
        return Err(DataError::EmptyCorpus {
            inputs: path.display().to_string(),
            detail: "no preference pair in the file".into(),
        });
    }
    Ok(PreferenceData { pairs, stats })
}

impl PreferenceData {
    /// The batch of `pairs` (indices into [`Self::pairs`]; `Batch::pairs` holds them plus
    /// `first_id`): their chosen sequences, then their rejected ones, each a row of `seq_len`
    /// inputs padded with `pad_id`, whose targets are the next tokens of the completion only
    /// (-1 on the prompt, the last token and the padding). Every token is an input, the last
    /// one too, as TRL feeds them (an MoE router sees it). Longer sequences are cut to
    /// `seq_len`.
    pub fn batch(&self, pairs: &[usize], seq_len: usize, pad_id: u32, first_id: u32) -> Batch {
        self.rows_of(pairs, seq_len, pad_id, first_id)
    }

    /// [`Self::batch`] with rows as long as the batch's longest sequence (at most `seq_len`),
    /// as TRL's `DataCollatorForPreference` pads: the padding after it would cost a forward and
    /// a backward and change no real token's figures (the rows are causal).
    pub fn batch_to_longest(
        &self,
        pairs: &[usize],
        seq_len: usize,
        pad_id: u32,
        first_id: u32,
    ) -> Batch {
        let longest = pairs
            .iter()
            .flat_map(|&i| [&self.pairs[i].chosen, &self.pairs[i].rejected])
            .map(|seq| seq.ids.len())
            .max()
            .unwrap_or(1);
        self.rows_of(pairs, longest.clamp(1, seq_len.max(1)), pad_id, first_id)
    }

    fn rows_of(&self, pairs: &[usize], t: usize, pad_id: u32, first_id: u32) -> Batch {
        let rows = 2 * pairs.len();
        let (mut inputs, mut targets, mut mask) = (
            Vec::with_capacity(rows * t),
            Vec::with_capacity(rows * t),
            Vec::with_capacity(rows * t),
        );
        let sequences = pairs
            .iter()
            .map(|&i| &self.pairs[i].chosen)
            .chain(pairs.iter().map(|&i| &self.pairs[i].rejected));
        for seq in sequences {
            let real = seq.ids.len().min(t);
            for p in 0..t {
                if p < real {
                    inputs.push(seq.ids[p]);
                    mask.push(1);
                    targets.push(if p + 1 >= seq.prompt_len && p + 1 < real {
                        i64::from(seq.ids[p + 1])
                    } else {
                        IGNORE_INDEX
                    });
                } else {
                    inputs.push(pad_id);
                    mask.push(0);
                    targets.push(IGNORE_INDEX);
                }
            }
        }
        Batch {
            batch_size: rows,
            seq_len: t,
            inputs,
            targets,
            attention_mask: Some(mask),
            positions: None,
            pairs: Some(pairs.iter().map(|&i| first_id + i as u32).collect()),
        }
    }
}
