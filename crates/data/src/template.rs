//! Chat templates: the Jinja `chat_template` of an HF `tokenizer_config.json`, rendered the way
//! transformers' `apply_chat_template` renders it (minijinja with `trim_blocks` and
//! `lstrip_blocks`, Python string methods, `raise_exception`), and the built-in ChatML used when
//! a tokenizer has no template.
//!
//! For SFT the loss mask must cover only what the assistant says. A template may add text
//! around a reply (Qwen3 wraps the last one in an empty `<think>\n\n</think>\n\n`), so the mask
//! is found on the rendered text: each assistant reply's content is located after its
//! `<|im_start|>assistant` header (the first occurrence after the previous reply), its span and
//! the turn's end token are marked, and tokens overlapping a marked span train.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};

use crate::conversation::{Message, render_chat, tokenize_chat};
use crate::error::{DataError, Result};
use crate::tokenizer::{IM_END, IM_START, Tok};

/// Extra variables of a template (`apply_chat_template(..., **kwargs)` in transformers, TRL's
/// `chat_template_kwargs`): Qwen3's `enable_thinking = false`, for one.
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// The variables qwen-burn itself gives every rendering.
const RESERVED: &[&str] = &[
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// A chat template: HF's Jinja one, or the built-in ChatML.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Option<Environment<'static>>,
    source: PathBuf,
    bos_token: Option<String>,
    eos_token: Option<String>,
    kwargs: TemplateKwargs,
    /// The variables the template reads (minijinja's undeclared variables), found once at load.
    reads: HashSet<String>,
}

fn raise_exception(message: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// A special-token field of `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_field(config: &serde_json::Value, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// The built-in ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message.
    pub fn chatml() -> Self {
        Self {
            env: None,
            source: PathBuf::from("(built-in ChatML)"),
            bos_token: None,
            eos_token: None,
            kwargs: TemplateKwargs::new(),
            reads: HashSet::new(),
        }
    }

    /// The `chat_template` of `tokenizer_config.json` beside `tokenizer` (same directory), or
    /// `None` when there is no such file or it has no template.
    pub fn beside(tokenizer: &Path) -> Result<Option<Self>> {
        let path = tokenizer
            .parent()
            .unwrap_or(Path::new("."))
            .join("tokenizer_config.json");
        if !path.is_file() {
            return Ok(None);
        }
        Self::from_tokenizer_config(&path)
    }

    /// Read the template of an HF `tokenizer_config.json` (`chat_template` as a string, or a
    /// list of named templates, of which `default` is used), or of the `chat_template.jinja`
    /// beside it when the config has none.
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<Self>> {
        let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, e))?;
        let bad = |message: String| DataError::ChatTemplate {
            path: path.to_path_buf(),
            message,
        };
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let source = match config.get("chat_template") {
            // transformers 4.43 and later save the template beside, in `chat_template.jinja`.
            None | Some(serde_json::Value::Null) => {
                let jinja = path.with_file_name("chat_template.jinja");
                if !jinja.is_file() {
                    return Ok(None);
                }
                std::fs::read_to_string(&jinja).map_err(|e| DataError::io(&jinja, e))?
            }
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string))
                .ok_or_else(|| bad("chat_template list has no `default` template".into()))?,
            Some(other) => {
                return Err(bad(format!(
                    "chat_template is {other}, expected a string or a list of named templates"
                )));
            }
        };
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("default delimiters"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source)
            .map_err(|e| bad(format!("chat_template does not compile: {e:#}")))?;
        let reads = env
            .get_template("chat")
            .expect("added above")
            .undeclared_variables(false);
        Ok(Some(Self {
            env: Some(env),
            source: path.to_path_buf(),
            bos_token: token_field(&config, "bos_token"),
            eos_token: token_field(&config, "eos_token"),
            kwargs: TemplateKwargs::new(),
            reads,
        }))
    }

    /// The template with extra variables for every rendering (`what` names them in errors, as
    /// `data.chat_template_kwargs` or `--chat-template-kwargs`), checked by
    /// [`Self::check_kwargs`].
    pub fn with_kwargs(mut self, kwargs: TemplateKwargs, what: &str) -> Result<Self> {
        self.check_kwargs(&kwargs, what)?;
        self.kwargs = kwargs;
        Ok(self)
    }

    /// Each variable must be one the template reads and not one qwen-burn sets: a variable the
    /// template never reads would be silently ignored (transformers ignores it), so it is
    /// refused, naming those it reads. The built-in ChatML reads none.
    pub fn check_kwargs(&self, kwargs: &TemplateKwargs, what: &str) -> Result<()> {
        let bad = |message: String| DataError::ChatTemplate {
            path: self.source.clone(),
            message,
        };
        let Some(env) = &self.env else {
            if let Some(key) = kwargs.keys().next() {
                return Err(bad(format!(
                    "{what}.{key}: the built-in ChatML template reads no variables (the \
                     tokenizer has no tokenizer_config.json with a chat_template beside it)"
                )));
            }
            return Ok(());
        };
        let read = &self.reads;
        for key in kwargs.keys() {
            if RESERVED.contains(&key.as_str()) {
                return Err(bad(format!(
                    "{what}.{key}: qwen-burn sets `{key}` itself; remove it"
                )));
            }
            if !read.contains(key) {
                let mut names: Vec<&str> = read
                    .iter()
                    .map(String::as_str)
                    .filter(|v| !RESERVED.contains(v) && !env.globals().any(|(g, _)| g == *v))
                    .collect();
                names.sort_unstable();
                return Err(bad(format!(
                    "{what}.{key}: the chat template never reads `{key}`, so it would be ignored; \
                     the variables it reads: {}",
                    if names.is_empty() {
                        "none besides messages and add_generation_prompt".to_string()
                    } else {
                        names.join(", ")
                    }
                )));
            }
        }
        Ok(())
    }

    /// The `eos_token` of its `tokenizer_config.json`, if it names one.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Where the template came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The conversation as text; with `add_generation_prompt`, followed by the opening of an
    /// assistant turn (what generation continues from).
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &TemplateKwargs::new())
    }

    /// [`Self::render`] with `extra` variables (a line's own `chat_template_kwargs`, checked by
    /// [`Self::check_kwargs`]) over the template's own.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &TemplateKwargs,
    ) -> Result<String> {
        let Some(env) = &self.env else {
            let mut s = render_chat(messages);
            if add_generation_prompt {
                s.push_str(IM_START);
                s.push_str("assistant\n");
            }
            return Ok(s);
        };
        let template = env.get_template("chat").expect("added at load");
        let variables = if extra.is_empty() {
            Cow::Borrowed(&self.kwargs)
        } else {
            let mut all = self.kwargs.clone();
            all.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
            Cow::Owned(all)
        };
        let ctx = minijinja::context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            ..Value::from(minijinja::value::Serde(&*variables))
        };
        template.render(ctx).map_err(|e| DataError::ChatTemplate {
            path: self.source.clone(),
            message: format!("rendering failed: {e:#}"),
        })
    }

    /// Token ids of a conversation and their loss mask (1 on each assistant reply's content
    /// and the end token of its turn), from the rendered text (see the module docs).
    /// The built-in ChatML tokenises turn by turn ([`tokenize_chat`]).
    pub fn tokenize(&self, tok: &Tok, messages: &[Message]) -> Result<(Vec<u32>, Vec<u8>)> {
        self.tokenize_with(tok, messages, &TemplateKwargs::new())
    }

    /// [`Self::tokenize`] with `extra` variables, as [`Self::render_with`].
    pub fn tokenize_with(
        &self,
        tok: &Tok,
        messages: &[Message],
        extra: &TemplateKwargs,
    ) -> Result<(Vec<u32>, Vec<u8>)> {
        if self.env.is_none() {
            return tokenize_chat(tok, messages);
        }
        let text = self.render_with(messages, false, extra)?;
        let spans = assistant_spans(&text, messages).ok_or_else(|| DataError::ChatTemplate {
            path: self.source.clone(),
            message: "an assistant reply is not found verbatim in the rendered conversation, so \
                      its loss mask cannot be placed"
                .into(),
        })?;
        let (ids, offsets) = tok.encode_with_offsets(&text)?;
        let mask = offsets
            .iter()
            .map(|&(a, b)| u8::from(spans.iter().any(|&(s, e)| a < e && s < b)))
            .collect();
        Ok((ids, mask))
    }
}

/// Byte spans of every assistant reply's content plus its turn's `<|im_end|>`, in order.
fn assistant_spans(text: &str, messages: &[Message]) -> Option<Vec<(usize, usize)>> {
    let header = format!("{IM_START}assistant");
    let mut spans = Vec::new();
    let mut cursor = 0;
    for m in messages.iter().filter(|m| m.role == "assistant") {
        let start = cursor + text[cursor..].find(&header)? + header.len();
        // The template may trim a reply's leading newlines or drop a reasoning block.
        let content = m
            .content
            .rsplit("</think>")
            .next()?
            .trim_start_matches('\n');
        let at = start + text[start..].find(content)?;
        let end_tok = at + content.len() + text[at + content.len()..].find(IM_END)?;
        spans.push((at, end_tok + IM_END.len()));
        cursor = end_tok + IM_END.len();
    }
    Some(spans)
}
