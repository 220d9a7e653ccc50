//! `qwen-burn chat`: a conversation in the terminal (or over a pipe), one user message a line,
//! each reply streamed as it is generated. Every turn renders the whole conversation with the
//! model's chat template, as `generate --chat-json` would, and reuses the KV cache of the tokens
//! the previous turns already computed (`qwen_burn_model::continuation`).

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use qwen_burn_data::{Message, TemplateKwargs, Tok};
use qwen_burn_model::{PrefixCache, generate_continuing};

use super::generate::{SamplingArgs, TextStream, find_generation_config, sampling_config};
use super::{ModelArgs, find_tokenizer};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message that opens the conversation (kept by /reset).
    #[arg(long)]
    pub system: Option<String>,
    /// Extra variables for the chat template, as a JSON object: '{"enable_thinking": false}' is
    /// Qwen3's non-thinking mode. A variable the template never reads is refused.
    #[arg(long, value_parser = super::template_kwargs)]
    pub chat_template_kwargs: Option<TemplateKwargs>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// tokenizer.json (default: next to the model).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

/// What a line of input asks for.
enum Input {
    Message(String),
    Reset,
    Exit,
    Nothing,
}

fn parse_line(line: &str) -> Input {
    let line = line.trim_end_matches(['\n', '\r']);
    match line.trim() {
        "" => Input::Nothing,
        "/exit" | "/quit" => Input::Exit,
        "/reset" => Input::Reset,
        _ => Input::Message(line.to_string()),
    }
}

/// Text of the reply for the conversation's history: its tokens without the stop token.
fn reply_text(tok: &Tok, ids: &[u32], stopped: bool) -> Result<String> {
    let ids = match stopped {
        true => &ids[..ids.len() - 1],
        false => ids,
    };
    Ok(tok.decode(ids)?)
}

pub fn run(args: Args) -> Result<()> {
    let (model, device) = args.model.load()?;
    let tok = find_tokenizer(&args.model.model, args.tokenizer.as_deref())?.context(
        "chat needs a tokenizer: put tokenizer.json next to the model or pass --tokenizer",
    )?;
    let template = super::chat_template(&tok, args.chat_template_kwargs.as_ref())?;
    let gen_config = find_generation_config(&args.model.model)?;
    let mut cfg = sampling_config(
        &args.sampling,
        true,
        &model.config.eos_token_id,
        gen_config.as_ref(),
        Some(&tok),
    )?;
    let base_seed = cfg.seed;
    let limit = model.config.max_position_embeddings;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chat with {} (template: {}); /reset starts over, /exit or Ctrl-D ends",
            args.model.model.display(),
            template.source().display()
        );
    }
    let opening: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new("system", s))
        .collect();
    let mut messages = opening.clone();
    let mut prefix = PrefixCache::new(&model);
    let mut stdin = std::io::stdin().lock();
    let mut turn = 0u64;
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush().ok();
        }
        let mut line = String::new();
        if stdin.read_line(&mut line).context("reading stdin")? == 0 {
            break;
        }
        let text = match parse_line(&line) {
            Input::Exit => break,
            Input::Nothing => continue,
            Input::Reset => {
                messages = opening.clone();
                prefix.clear();
                eprintln!("[conversation cleared]");
                continue;
            }
            Input::Message(text) => text,
        };
        messages.push(Message::new("user", &text));
        let prompt = tok.encode(&template.render(&messages, true)?)?;
        let fits = model
            .config
            .generation_estimate(prompt.len(), "the conversation")
            .check(&format!("this turn's prefill ({} tokens)", prompt.len()));
        if let Err(e) = fits {
            // The conversation stays as it was: /reset, or a shorter message, goes on.
            eprintln!("error: {e}; /reset starts over");
            messages.pop();
            continue;
        }
        if prompt.len() + cfg.max_new_tokens > limit {
            eprintln!(
                "warning: the conversation ({} tokens) plus up to {} new tokens exceeds the \
                 model's max_position_embeddings ({limit}); /reset starts over",
                prompt.len(),
                cfg.max_new_tokens
            );
        }
        cfg.seed = base_seed.wrapping_add(turn);
        let stops = cfg.stop_tokens.clone();
        let mut printer = TextStream::new(&tok);
        let done = generate_continuing(&model, &mut prefix, &prompt, &cfg, &device, |id| {
            if !stops.contains(&id) {
                printer.push(id);
            }
        })?;
        println!();
        let g = &done.generation;
        messages.push(Message::new(
            "assistant",
            &reply_text(&tok, &g.new_token_ids, g.stopped)?,
        ));
        let n = g.new_token_ids.len();
        eprintln!(
            "[{n} tokens{}; prompt {} tokens, {} from the cache; prefill {:.3}s, decode {:.1} tokens/s]",
            if g.stopped {
                ""
            } else {
                ", cut at --max-new-tokens"
            },
            prompt.len(),
            done.reused,
            g.prefill_secs,
            g.decode_tokens_per_sec()
        );
        turn += 1;
    }
    Ok(())
}
