//! Prompts with reference answers, for reinforcement learning with verifiable rewards (GRPO):
//! the model completes each prompt and a reward compares its answer with the reference.
//!
//! Files are JSONL (one object per line; `.gz` read transparently) or Parquet (a name ending in
//! `.parquet`). Each row is one of:
//! - text: `{"prompt": str, "answer": str | number}`; the prompt is given to the model as it is;
//! - conversational: `{"prompt": [{"role", "content"}, ...], "answer": ...}`; the messages are
//!   rendered with the chat template, followed by the generation prompt (the opening of the
//!   assistant's turn);
//! - GSM8K: `{"question": str, "answer": str}`; the question is the prompt as it is, and the
//!   answer is kept whole (worked solution ending in `#### N`: the reward extracts `N`).
//!
//! A number answer becomes its JSON text (`42` gives `"42"`). Other fields are ignored. A row
//! without a prompt or answer, with an empty prompt or answer, or a prompt longer than
//! `max_prompt_tokens` tokens is an error naming the file, the line (1-based) or Parquet row
//! (counted from 0, as the Parquet reader counts) and the field.

use std::path::Path;

use serde_json::{Map, Value};

use crate::conversation::{Message, ROLES};
use crate::error::{DataError, Result};
use crate::ingest;
use crate::template::ChatTemplate;
use crate::tokenizer::Tok;

/// The most rows read from one Parquet file.
pub const MAX_ROWS: usize = 1_000_000;

/// One prompt of an RL run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptItem {
    /// The prompt as the model sees it: the text as given, or a message list rendered with the
    /// chat template and its generation prompt.
    pub text: String,
    /// The token ids of `text` (no special tokens added beyond those written in it).
    pub ids: Vec<u32>,
    /// The reference answer, as given (a number as its JSON text).
    pub answer: String,
}

/// The prompts of a file, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptSet {
    /// The prompts.
    pub items: Vec<PromptItem>,
}

/// Where a row sits in its file, for error messages.
#[derive(Clone, Copy)]
enum Place {
    /// 1-based line of a JSONL file.
    Line(usize),
    /// Row of a Parquet file, counted from 0.
    Row(usize),
}

impl Place {
    /// The error for a bad row at this place.
    fn error(self, path: &Path, message: String) -> DataError {
        match self {
            Place::Line(line) => DataError::Jsonl {
                path: path.to_path_buf(),
                line,
                message,
            },
            Place::Row(row) => DataError::Parquet {
                path: path.to_path_buf(),
                message: format!("row {row} (counted from 0): {message}"),
            },
        }
    }
}

/// A prompt given as a list of messages.
fn messages(items: &[Value]) -> std::result::Result<Vec<Message>, String> {
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let text = |key: &str| match m.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(format!(
                    "\"prompt\"[{i}].{key} is {}, expected a string",
                    ingest::json_type(other)
                )),
                None => Err(format!("\"prompt\"[{i}] has no string field \"{key}\"")),
            };
            let role = text("role")?;
            if !ROLES.contains(&role.as_str()) {
                return Err(format!(
                    "\"prompt\"[{i}].role is \"{role}\", an unknown role (expected system, \
                     user, assistant or tool)"
                ));
            }
            Ok(Message {
                role,
                content: text("content")?,
            })
        })
        .collect()
}

/// The prompt text and the answer of one row, or what is wrong with it.
fn row_texts(
    obj: &Map<String, Value>,
    template: &ChatTemplate,
) -> std::result::Result<(String, String), String> {
    // The row's own template variables (TRL's per-example `chat_template_kwargs`).
    let renders = matches!(obj.get("prompt"), Some(Value::Array(_)));
    let kwargs = ingest::row_template_kwargs(obj, renders, "prompt", Some(template))?;
    let (field, prompt) = match (obj.get("prompt"), obj.get("question")) {
        (Some(p), _) => ("prompt", p),
        (None, Some(q)) => ("question", q),
        (None, None) => {
            let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            keys.sort_unstable();
            return Err(format!(
                "no \"prompt\" or \"question\" field (the row has fields {keys:?}; expected \
                 {{\"prompt\", \"answer\"}} or GSM8K's {{\"question\", \"answer\"}})"
            ));
        }
    };
    let text = match prompt {
        Value::String(s) if s.trim().is_empty() => {
            return Err(format!("\"{field}\" is empty"));
        }
        Value::String(s) => s.clone(),
        Value::Array(items) if field == "prompt" => {
            if items.is_empty() {
                return Err("\"prompt\" is an empty list of messages".into());
            }
            template
                .render_with(&messages(items)?, true, &kwargs)
                .map_err(|e| format!("\"prompt\" cannot be rendered: {e}"))?
        }
        other => {
            let expected = if field == "prompt" {
                "a string or a list of {\"role\", \"content\"} messages"
            } else {
                "a string"
            };
            return Err(format!(
                "\"{field}\" is {}, expected {expected}",
                ingest::json_type(other)
            ));
        }
    };
    let answer = match obj.get("answer") {
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err("\"answer\" is empty".into());
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            return Err(format!(
                "\"answer\" is {}, expected a string or a number",
                ingest::json_type(other)
            ));
        }
        None => return Err("no \"answer\" field".into()),
    };
    Ok((text, answer))
}

/// The rows of `path` with their places: Parquet rows, or the objects of a JSONL file.
fn read_rows(path: &Path) -> Result<Vec<(Place, Map<String, Value>)>> {
    if path.extension().is_some_and(|e| e == "parquet") {
        let rows = crate::parquet_source::read_rows(path, MAX_ROWS)?;
        return Ok(rows
            .into_iter()
            .map(|(row, obj)| (Place::Row(row), obj))
            .collect());
    }
    let text = ingest::read_text_file(path)?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        rows.push((Place::Line(i + 1), ingest::jsonl_object(path, i + 1, line)?));
    }
    Ok(rows)
}

/// Read and tokenise a prompt file (see the module docs). With `max_prompt_tokens`, a prompt of
/// more tokens is an error (prompts are never cut: a cut prompt would change the question).
pub fn load_prompts(
    path: &Path,
    tok: &Tok,
    template: &ChatTemplate,
    max_prompt_tokens: Option<usize>,
) -> Result<PromptSet> {
    if max_prompt_tokens == Some(0) {
        return Err(DataError::option(
            "max_prompt_tokens",
            "must be at least 1 (or unset for no limit)",
        ));
    }
    let rows = read_rows(path)?;
    let mut items = Vec::with_capacity(rows.len());
    for (place, obj) in rows {
        let (text, answer) = row_texts(&obj, template).map_err(|m| place.error(path, m))?;
        let ids = tok.encode(&text)?;
        if let Some(max) = max_prompt_tokens
            && ids.len() > max
        {
            let field = if obj.contains_key("prompt") {
                "prompt"
            } else {
                "question"
            };
            return Err(place.error(
                path,
                format!(
                    "\"{field}\" is {} tokens, more than max_prompt_tokens = {max}",
                    ids.len()
                ),
            ));
        }
        items.push(PromptItem { text, ids, answer });
    }
    if items.is_empty() {
        return Err(DataError::EmptyCorpus {
            inputs: path.display().to_string(),
            detail: "no prompt in the file".into(),
        });
    }
    Ok(PromptSet { items })
}
