//! `qwen-burn generate`: sampling with the KV cache, with HF's `generation_config.json`
//! semantics.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use qwen_burn_data::{Message, TemplateKwargs, Tok};
use qwen_burn_model::{GenerationConfig, ModelError, SamplingConfig, SamplingDefaults, generate};
use qwen_burn_train::run::checkpoint::find_beside;
use serde_json::json;

use super::{ModelArgs, find_tokenizer};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text (needs a tokenizer).
    #[arg(long, conflicts_with_all = ["prompt_ids", "chat", "chat_json"])]
    pub prompt: Option<String>,
    /// A user message, rendered with the model's chat template (its tokenizer_config.json;
    /// ChatML when it has none) and the generation prompt.
    #[arg(long, conflicts_with_all = ["prompt_ids", "chat_json"])]
    pub chat: Option<String>,
    /// A conversation so far: a JSON file holding a list of {"role", "content"} messages (the
    /// multi-turn form of --chat).
    #[arg(long, conflicts_with = "prompt_ids")]
    pub chat_json: Option<PathBuf>,
    /// A system message put before --chat / --chat-json messages.
    #[arg(long)]
    pub system: Option<String>,
    /// Extra variables for the chat template of --chat / --chat-json, as a JSON object (the
    /// keyword arguments of transformers' `apply_chat_template`): '{"enable_thinking": false}'
    /// is Qwen3's non-thinking mode. A variable the template never reads is refused.
    #[arg(long, value_parser = super::template_kwargs)]
    pub chat_template_kwargs: Option<TemplateKwargs>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// tokenizer.json (default: next to the model).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Recompute the whole prefix every step instead of using the KV cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// Prints generated tokens as text as they come.
pub struct TextStream<'a> {
    tok: &'a Tok,
    ids: Vec<u32>,
    shown: String,
}

impl<'a> TextStream<'a> {
    pub fn new(tok: &'a Tok) -> Self {
        Self {
            tok,
            ids: Vec::new(),
            shown: String::new(),
        }
    }

    /// Print what `id` adds: the whole continuation is decoded again, so a character spread
    /// over several tokens prints once it is whole.
    pub fn push(&mut self, id: u32) {
        self.ids.push(id);
        if let Ok(text) = self.tok.decode(&self.ids) {
            if let Some(delta) = text.strip_prefix(self.shown.as_str()) {
                print!("{delta}");
                let _ = std::io::stdout().flush();
            }
            self.shown = text;
        }
    }
}

/// The sampling flags of `generate` and `chat`.
#[derive(clap::Args, Debug)]
pub struct SamplingArgs {
    /// Tokens to generate at most (default: generation_config.json's max_new_tokens, else 64).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Softmax temperature; 0 = greedy. Default: the model's generation_config.json (greedy
    /// unless it sets do_sample), else greedy.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens when sampling; 0 = no top-k filter (default:
    /// generation_config.json).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p, in (0, 1]; 1 = no filter
    /// (default: generation_config.json).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Seed of the sampling (`chat`: turn N, counted from 0, samples with seed + N).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Do not stop at the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
}

/// `generation_config.json` next to the model (or in its run directory).
pub fn find_generation_config(model_dir: &Path) -> Result<Option<GenerationConfig>> {
    let Some(path) = find_beside(model_dir, "generation_config.json") else {
        return Ok(None);
    };
    let config = GenerationConfig::from_file(&path)?;
    if !config.unsupported.is_empty() {
        eprintln!(
            "warning: {}: not supported by qwen-burn, ignored: {}",
            path.display(),
            config.unsupported.join(", ")
        );
    }
    Ok(Some(config))
}

/// What to generate, as HF decides it: the flags win over `generation_config.json`, which wins
/// over greedy decoding. Generation stops on any of the eos ids of `config.json` and of
/// `generation_config.json`, and on the tokenizer's document end and chat turn end
/// (`<|endoftext|>`, `<|im_end|>`) when it has them.
pub fn sampling_config(
    args: &SamplingArgs,
    use_cache: bool,
    config_eos: &[u32],
    generation: Option<&GenerationConfig>,
    tok: Option<&Tok>,
) -> Result<SamplingConfig> {
    let defaults = generation.map_or(
        SamplingDefaults {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        },
        GenerationConfig::sampling,
    );
    let temperature = args.temperature.unwrap_or(defaults.temperature);
    let sampling = temperature > 0.0;
    let mut stop_tokens: Vec<u32> = Vec::new();
    if !args.ignore_eos {
        let from_tok = tok.map(Tok::stop_ids).unwrap_or_default();
        let from_gen = generation
            .map(|g| g.eos_token_id.as_slice())
            .unwrap_or_default();
        for &id in config_eos.iter().chain(from_gen).chain(&from_tok) {
            if !stop_tokens.contains(&id) {
                stop_tokens.push(id);
            }
        }
    }
    // The flags get the library's checks (HF's) themselves, whether or not they end up used,
    // and the error names the flag.
    SamplingConfig {
        temperature: args.temperature.unwrap_or(0.0),
        top_p: args.top_p,
        ..SamplingConfig::default()
    }
    .validate()
    .map_err(|e| match e {
        ModelError::InvalidConfig { field, reason } => {
            anyhow::anyhow!("--{}: {reason}", field.replace('_', "-"))
        }
        other => other.into(),
    })?;
    Ok(SamplingConfig {
        max_new_tokens: args
            .max_new_tokens
            .or(generation.and_then(|g| g.max_new_tokens))
            .unwrap_or(64),
        temperature,
        // `--top-k 0` is HF's "no top-k filter", and overrides the file's top_k.
        top_k: match args.top_k {
            Some(0) => None,
            Some(k) => Some(k),
            None => defaults.top_k,
        }
        .filter(|_| sampling),
        top_p: args.top_p.or(defaults.top_p).filter(|_| sampling),
        seed: args.seed,
        stop_tokens,
        use_cache,
    })
}

/// The rendered chat prompt of `--chat` / `--chat-json` (with `--system`), or `None`.
fn chat_prompt(args: &Args, tok: Option<&Tok>) -> Result<Option<String>> {
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::new("system", system));
    }
    match (&args.chat, &args.chat_json) {
        (Some(text), _) => messages.push(Message::new("user", text)),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let turns: Vec<Message> = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{}: expected a JSON list of {{\"role\", \"content\"}} messages",
                    path.display()
                )
            })?;
            messages.extend(turns);
        }
        (None, None) => {
            if args.chat_template_kwargs.is_some() {
                bail!("--chat-template-kwargs is read with --chat or --chat-json only");
            }
            return Ok(None);
        }
    }
    let tok = tok.context("--chat needs a tokenizer: put tokenizer.json next to the model")?;
    let template = super::chat_template(tok, args.chat_template_kwargs.as_ref())?;
    Ok(Some(template.render(&messages, true)?))
}

pub fn run(args: Args) -> Result<()> {
    let (model, device) = args.model.load()?;
    let tok = find_tokenizer(&args.model.model, args.tokenizer.as_deref())?;
    let need_tok = || {
        tok.as_ref().context(
            "a text prompt needs a tokenizer: put tokenizer.json next to the model or pass --tokenizer",
        )
    };
    let chat_text = chat_prompt(&args, tok.as_ref())?;
    let prompt: Vec<u32> = match (&chat_text, &args.prompt, &args.prompt_ids) {
        (Some(text), _, _) | (None, Some(text), _) => need_tok()?.encode(text)?,
        (None, None, Some(ids)) => ids.clone(),
        (None, None, None) => {
            bail!("give --prompt TEXT, --chat TEXT, --chat-json FILE or --prompt-ids 1,2,3")
        }
    };
    let gen_config = find_generation_config(&args.model.model)?;
    let cfg = sampling_config(
        &args.sampling,
        !args.no_cache,
        &model.config.eos_token_id,
        gen_config.as_ref(),
        tok.as_ref(),
    )?;
    // The prefill's KV cache and activations grow with the prompt: refuse what it cannot hold
    // before allocating.
    model
        .config
        .generation_estimate(prompt.len(), "the prompt")
        .check(&format!(
            "generate's prefill ({} prompt tokens)",
            prompt.len()
        ))?;
    let total = prompt.len().saturating_add(cfg.max_new_tokens);
    let limit = model.config.max_position_embeddings;
    if total > limit {
        eprintln!(
            "warning: the prompt ({} tokens) plus up to {} new tokens exceeds the model's \
             max_position_embeddings ({limit}); positions past {limit} are beyond what the model \
             was trained for",
            prompt.len(),
            cfg.max_new_tokens
        );
    }
    let stream = !args.json && tok.is_some();
    if stream && let Some(text) = chat_text.as_ref().or(args.prompt.as_ref()) {
        print!("{text}");
    }
    let mut printer = tok.as_ref().filter(|_| stream).map(TextStream::new);
    let out = generate(&model, &prompt, &cfg, &device, |id| {
        if let Some(p) = printer.as_mut() {
            p.push(id);
        }
    })?;
    let n = out.new_token_ids.len();
    let decode_tps = out.decode_tokens_per_sec();
    if args.json {
        let mut v = json!({
            "prompt_ids": prompt,
            "new_token_ids": out.new_token_ids,
            "stopped_on_eos": out.stopped,
            "prefill_secs": out.prefill_secs,
            "decode_tokens_per_sec": decode_tps,
            "sampling": {
                "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
                "seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens,
                "stop_tokens": cfg.stop_tokens,
            },
        });
        if let Some(tok) = &tok {
            v["text"] = json!(tok.decode(&out.new_token_ids)?);
        }
        println!("{v}");
    } else {
        if !stream {
            println!("{:?}", out.new_token_ids);
        } else {
            println!();
        }
        eprintln!(
            "[{n} tokens, prefill {:.3}s, decode {:.1} tokens/s]",
            out.prefill_secs, decode_tps
        );
    }
    Ok(())
}
