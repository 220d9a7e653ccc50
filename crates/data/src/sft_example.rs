//! The layouts of an SFT JSONL line, as TRL 1.16.0's `SFTTrainer` reads them, and what each
//! trains on:
//! - conversational: `{"messages": [...]}` or ShareGPT `{"conversations": [...]}`, the
//!   assistant's replies (see [`crate::chat`]);
//! - prompt-completion, text: `{"prompt": str, "completion": str}`. The completion gets the EOS
//!   token appended as text unless it ends with it; the prompt is tokenised alone and with the
//!   completion, and the completion (the trained part, TRL's `completion_only_loss`) starts
//!   where the two first differ (TRL's `common_prefix_length`);
//! - prompt-completion, conversational: `prompt` and `completion` lists of messages, the prompt
//!   rendered with the chat template's generation prompt and the whole without, split the same
//!   way: everything the template renders after the prompt is trained;
//! - language modelling: `{"text": str}`, EOS appended as text unless it ends with it, every
//!   token trained.
//!
//! A conversational line may carry its own template variables, `"chat_template_kwargs": {...}`
//! (as TRL reads them per example), over the run's `data.chat_template_kwargs`; a text line with
//! them is an error (nothing of it is rendered). Other fields of a line are ignored, as TRL drops
//! columns it does not use.

use std::path::Path;

use serde_json::Value;

use crate::conversation::{Message, parse_messages};
use crate::error::{DataError, Result};
use crate::ingest;
use crate::template::{ChatTemplate, TemplateKwargs};
use crate::tokenizer::Tok;

/// One SFT example.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SftExample {
    /// A conversation; its assistant turns are trained.
    Conversation {
        /// The messages.
        messages: Vec<Message>,
        /// The line's own template variables (`chat_template_kwargs`).
        template_kwargs: TemplateKwargs,
    },
    /// A text prompt and its completion; the completion (and EOS) is trained.
    TextCompletion {
        /// The prompt.
        prompt: String,
        /// The completion.
        completion: String,
    },
    /// Prompt and completion messages; what the template renders after the prompt is trained.
    ChatCompletion {
        /// The prompt's messages.
        prompt: Vec<Message>,
        /// The completion's messages.
        completion: Vec<Message>,
        /// The line's own template variables (`chat_template_kwargs`).
        template_kwargs: TemplateKwargs,
    },
    /// A text; every token (and EOS) is trained.
    Text(String),
}

impl SftExample {
    /// The line's own template variables, where the layout renders a template.
    pub fn template_kwargs(&self) -> Option<&TemplateKwargs> {
        match self {
            SftExample::Conversation {
                template_kwargs, ..
            }
            | SftExample::ChatCompletion {
                template_kwargs, ..
            } => Some(template_kwargs),
            _ => None,
        }
    }
}

/// A field as a list of `{"role", "content"}` messages, naming the line and field on error.
pub(crate) fn messages(
    value: &Value,
    field: &str,
    err: &dyn Fn(String) -> DataError,
) -> Result<Vec<Message>> {
    let Value::Array(items) = value else {
        return Err(err(format!(
            "\"{field}\" is {}, expected a list of messages",
            ingest::json_type(value)
        )));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let text = |key: &str| match m.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(err(format!("{field}[{i}] has no string field \"{key}\""))),
            };
            Ok(Message {
                role: text("role")?,
                content: text("content")?,
            })
        })
        .collect()
}

/// Line `line_no` of `path` as an example (see the module docs for the layouts).
pub fn parse_example(path: &Path, line_no: usize, line: &str) -> Result<SftExample> {
    let err = |message: String| DataError::Jsonl {
        path: path.to_path_buf(),
        line: line_no,
        message,
    };
    let obj = ingest::jsonl_object(path, line_no, line)?;
    let has = |k: &str| obj.contains_key(k);
    let layouts = [
        has("messages") || has("conversations"),
        has("prompt") || has("completion"),
        has("text"),
    ];
    if layouts.iter().filter(|&&l| l).count() > 1 {
        return Err(err(
            "holds fields of more than one layout (\"messages\"/\"conversations\", \
             \"prompt\"/\"completion\", \"text\"): keep one"
                .into(),
        ));
    }
    // Only message lists are rendered with the template; the loader checks the variables
    // against it.
    let text_line = layouts[2] || matches!(obj.get("prompt"), Some(Value::String(_)));
    let template_kwargs =
        ingest::row_template_kwargs(&obj, !text_line, "line", None).map_err(err)?;
    if layouts[0] {
        return Ok(SftExample::Conversation {
            messages: parse_messages(path, line_no, line)?,
            template_kwargs,
        });
    }
    if layouts[2] {
        return match &obj["text"] {
            Value::String(s) if !s.is_empty() => Ok(SftExample::Text(s.clone())),
            Value::String(_) => Err(err("\"text\" is empty".into())),
            other => Err(err(format!(
                "\"text\" is {}, expected a string",
                ingest::json_type(other)
            ))),
        };
    }
    let field = |name: &str| {
        obj.get(name).ok_or_else(|| {
            err(format!(
                "has \"{}\" but no \"{name}\": a prompt-completion line needs both",
                if name == "prompt" {
                    "completion"
                } else {
                    "prompt"
                }
            ))
        })
    };
    if !layouts[1] {
        return Err(err(
            "no \"messages\" or \"conversations\" (a conversation), \"prompt\" and \
             \"completion\", or \"text\" field"
                .into(),
        ));
    }
    match (field("prompt")?, field("completion")?) {
        (Value::String(p), Value::String(c)) => Ok(SftExample::TextCompletion {
            prompt: p.clone(),
            completion: c.clone(),
        }),
        (p @ Value::Array(_), c @ Value::Array(_)) => {
            let completion = messages(c, "completion", &err)?;
            if completion.is_empty() {
                return Err(err("\"completion\" has no message".into()));
            }
            Ok(SftExample::ChatCompletion {
                prompt: messages(p, "prompt", &err)?,
                completion,
                template_kwargs,
            })
        }
        (p, c) => Err(err(format!(
            "\"prompt\" is {} and \"completion\" {}: both strings (text) or both lists of \
             messages",
            ingest::json_type(p),
            ingest::json_type(c)
        ))),
    }
}

/// `text` with `eos` appended unless it ends with it (TRL's `add_eos`).
fn with_eos(text: &str, eos: &str) -> String {
    match text.ends_with(eos) {
        true => text.to_string(),
        false => format!("{text}{eos}"),
    }
}

/// Token ids and loss mask of an example (see the module docs). `eos` is the text appended to
/// text completions and texts; a conversation trains on its assistant turns
/// ([`ChatTemplate::tokenize`]). A line's template variables are checked against `template`.
pub fn tokenize_example(
    example: &SftExample,
    tok: &Tok,
    template: &ChatTemplate,
    eos: &str,
) -> Result<(Vec<u32>, Vec<u8>)> {
    let (prompt, whole) = match example {
        SftExample::Conversation {
            messages,
            template_kwargs,
        } => {
            template.check_kwargs(template_kwargs, "chat_template_kwargs")?;
            return template.tokenize_with(tok, messages, template_kwargs);
        }
        SftExample::Text(text) => {
            let ids = tok.encode(&with_eos(text, eos))?;
            let mask = vec![1; ids.len()];
            return Ok((ids, mask));
        }
        SftExample::TextCompletion { prompt, completion } => (
            prompt.clone(),
            format!("{prompt}{}", with_eos(completion, eos)),
        ),
        SftExample::ChatCompletion {
            prompt,
            completion,
            template_kwargs: kw,
        } => {
            template.check_kwargs(kw, "chat_template_kwargs")?;
            (
                template.render_with(prompt, true, kw)?,
                template.render_with(&[prompt.as_slice(), completion].concat(), false, kw)?,
            )
        }
    };
    let (prompt, ids) = (tok.encode(&prompt)?, tok.encode(&whole)?);
    let n = prompt.iter().zip(&ids).take_while(|(a, b)| a == b).count();
    let mut mask = vec![0; n];
    mask.resize(ids.len(), 1);
    Ok((ids, mask))
}
