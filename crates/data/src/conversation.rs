//! Conversations: chat messages, their two JSONL formats (OpenAI-style `messages` and ShareGPT
//! `conversations`), and the built-in ChatML rendering. Shared by SFT rows ([`crate::chat`])
//! and chat templates ([`crate::template`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};
use crate::ingest;
use crate::tokenizer::{IM_END, IM_START, Tok};

/// One chat message.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, or any other role string.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message from string slices.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// Renders messages with the Qwen chat template: `<|im_start|>{role}\n{content}<|im_end|>\n`
/// per message, nothing else.
pub fn render_chat(messages: &[Message]) -> String {
    let mut s = String::new();
    for m in messages {
        s.push_str(IM_START);
        s.push_str(&m.role);
        s.push('\n');
        s.push_str(&m.content);
        s.push_str(IM_END);
        s.push('\n');
    }
    s
}

/// Token ids of one conversation with a per-token loss mask, tokenised turn by turn in the
/// built-in ChatML (what [`crate::chat`] documents).
pub fn tokenize_chat(tok: &Tok, messages: &[Message]) -> Result<(Vec<u32>, Vec<u8>)> {
    let purpose = "by the Qwen chat template";
    let im_end = tok.require_token(IM_END, purpose)?;
    tok.require_token(IM_START, purpose)?;
    let newline = tok.encode("\n")?;
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for m in messages {
        let on = u8::from(m.role == "assistant");
        let header = tok.encode(&format!("{IM_START}{}\n", m.role))?;
        mask.resize(mask.len() + header.len(), 0);
        ids.extend(header);
        let content = tok.encode(&m.content)?;
        mask.resize(mask.len() + content.len() + 1, on);
        ids.extend(content);
        ids.push(im_end);
        mask.resize(mask.len() + newline.len(), 0);
        ids.extend_from_slice(&newline);
    }
    Ok((ids, mask))
}

/// Roles a conversation may use (what Qwen's chat template renders).
pub const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// The role of a ShareGPT `from` name (the usual spellings), or `None` for an unknown one.
fn sharegpt_role(from: &str) -> Option<&'static str> {
    Some(match from {
        "system" => "system",
        "human" | "user" => "user",
        "gpt" | "assistant" | "chatgpt" | "bard" | "bing" | "model" => "assistant",
        "tool" | "function" | "function_response" | "observation" | "ipython" => "tool",
        _ => return None,
    })
}

/// One conversation of a chat JSONL line, in either common format:
/// - OpenAI style: `{"messages": [{"role": "user", "content": "..."}, ...]}`;
/// - ShareGPT: `{"conversations": [{"from": "human", "value": "..."}, ...]}` (`human`/`user`,
///   `gpt`/`assistant`, `system`, and tool names `tool`/`function`/`observation`).
///
/// Roles must be one of [`ROLES`]; anything else is an error naming the line and the role.
pub fn parse_messages(path: &Path, line_no: usize, line: &str) -> Result<Vec<Message>> {
    let err = |message: String| DataError::Jsonl {
        path: path.to_path_buf(),
        line: line_no,
        message,
    };
    let obj = ingest::jsonl_object(path, line_no, line)?;
    let (list, role_key, text_key, sharegpt) = if obj.contains_key("messages") {
        ("messages", "role", "content", false)
    } else if obj.contains_key("conversations") {
        ("conversations", "from", "value", true)
    } else {
        return Err(err(
            "no \"messages\" (OpenAI style: [{\"role\", \"content\"}]) or \"conversations\" \
             (ShareGPT: [{\"from\", \"value\"}]) field"
                .into(),
        ));
    };
    let msgs = match &obj[list] {
        serde_json::Value::Array(a) => a,
        other => {
            return Err(err(format!(
                "field \"{list}\" is {}, expected an array of {{\"{role_key}\", \"{text_key}\"}} objects",
                ingest::json_type(other)
            )));
        }
    };
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let field = |name: &str| match m.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(err(format!(
                "{list}[{i}].{name} is {}, expected a string",
                ingest::json_type(other)
            ))),
            None => Err(err(format!("{list}[{i}] has no string field \"{name}\""))),
        };
        let given = field(role_key)?;
        let role = if sharegpt {
            sharegpt_role(&given)
        } else {
            ROLES.iter().copied().find(|r| *r == given)
        };
        let Some(role) = role else {
            return Err(err(format!(
                "{list}[{i}].{role_key} is \"{given}\", an unknown role (expected {})",
                if sharegpt {
                    "human/user, gpt/assistant, system, or tool/function/observation"
                } else {
                    "system, user, assistant or tool"
                }
            )));
        };
        out.push(Message {
            role: role.to_string(),
            content: field(text_key)?,
        });
    }
    Ok(out)
}
