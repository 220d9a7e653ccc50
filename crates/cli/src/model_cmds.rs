//! `score`, `eval`, `generate` and `export`: commands that run a trained or imported model.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_data::tokenizer::Tok;
use qwen_burn_model::loss::{shift_targets, targets_tensor, token_nll};
use qwen_burn_model::{
    GenerationConfig, Qwen3ForCausalLM, SamplingConfig, SamplingDefaults, device_from_name,
    generate,
};
use qwen_burn_train::step::{assemble_loss, own_fractions};
use serde_json::json;

use qwen_burn_train::checkpoint::load_model_any as load_any_model;

/// Arguments shared by every command that loads a model.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// HF model directory (config.json + safetensors) or a qwen-burn checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Device: flex (default), ndarray, wgpu, cuda[:N].
    #[arg(long, default_value = "flex")]
    pub device: String,
}

impl ModelArgs {
    pub fn load(&self) -> Result<(Qwen3ForCausalLM, Device)> {
        let device = device_from_name(&self.device)?;
        let model = load_any_model(&self.model, &device)
            .with_context(|| format!("loading model from {}", self.model.display()))?;
        Ok((model, device))
    }
}

/// Find a tokenizer: the flag, else `tokenizer.json` next to the model (or in its parent).
pub fn find_tokenizer(model_dir: &Path, flag: Option<&Path>) -> Result<Option<Tok>> {
    let candidates: Vec<PathBuf> = match flag {
        Some(p) => vec![p.to_path_buf()],
        None => [
            Some(model_dir),
            model_dir.parent(),
            model_dir.parent().and_then(Path::parent),
        ]
        .into_iter()
        .flatten()
        .map(|d| d.join("tokenizer.json"))
        .collect(),
    };
    for path in candidates {
        if path.exists() {
            let tok = Tok::from_file(&path)
                .with_context(|| format!("loading tokenizer {}", path.display()))?;
            return Ok(Some(tok));
        }
    }
    match flag {
        Some(p) => bail!("tokenizer {} does not exist", p.display()),
        None => Ok(None),
    }
}

#[derive(clap::Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// JSON file `{"input_ids": [[...], ...]}` with equal-length rows.
    #[arg(long)]
    pub tokens: PathBuf,
    /// Also print the logits (flat, row-major `[b, t, vocab]`) under `logits`.
    #[arg(long)]
    pub dump_logits: bool,
}

/// Read `{"input_ids": [[...]]}` and check it against the vocabulary.
fn read_token_rows(path: &Path, vocab: usize) -> Result<(Vec<i64>, usize, usize)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    let rows = value
        .get("input_ids")
        .and_then(|v| v.as_array())
        .with_context(|| {
            format!(
                "{}: expected an object with an `input_ids` list of rows",
                path.display()
            )
        })?;
    if rows.is_empty() {
        bail!("{}: `input_ids` is empty", path.display());
    }
    let mut flat = Vec::new();
    let mut width = None;
    for (r, row) in rows.iter().enumerate() {
        let row = row
            .as_array()
            .with_context(|| format!("{}: input_ids[{r}] is not a list", path.display()))?;
        match width {
            None => width = Some(row.len()),
            Some(w) if w != row.len() => bail!(
                "{}: input_ids[{r}] has {} tokens but row 0 has {w}; rows must have equal length",
                path.display(),
                row.len()
            ),
            _ => {}
        }
        for (c, id) in row.iter().enumerate() {
            let id = id.as_u64().with_context(|| {
                format!("{}: input_ids[{r}][{c}] is not a token id", path.display())
            })?;
            if id as usize >= vocab {
                bail!(
                    "{}: input_ids[{r}][{c}] = {id} is out of range for vocab_size {vocab}",
                    path.display()
                );
            }
            flat.push(id as i64);
        }
    }
    let t = width.unwrap_or(0);
    if t < 2 {
        bail!(
            "{}: rows need at least 2 tokens to score a next-token prediction",
            path.display()
        );
    }
    Ok((flat, rows.len(), t))
}

/// Mean next-token loss of a batch of rows, with the MoE aux loss for MoE models.
pub fn score_rows(
    model: &Qwen3ForCausalLM,
    ids: Vec<i64>,
    b: usize,
    t: usize,
    device: &Device,
    dump_logits: bool,
) -> Result<serde_json::Value> {
    let targets = targets_tensor(shift_targets(&ids, b, t), b, t, device);
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, t]), device);
    let out = model.forward(input, None, None);
    let dumped = if dump_logits {
        Some(
            out.logits
                .clone()
                .try_into_vec_as::<f32>()
                .map_err(|e| anyhow::anyhow!("reading logits: {e:?}"))?,
        )
    } else {
        None
    };
    let n = b * (t - 1);
    let fractions = own_fractions(&model.config, &out, None);
    let parts = assemble_loss(
        &model.config,
        &out,
        targets,
        None,
        n as f64,
        1.0,
        fractions.as_deref(),
    );
    let lm_loss = f64::from(parts.ce_sum.into_scalar::<f32>()) / n as f64;
    let loss = f64::from(parts.loss.into_scalar::<f32>());
    let mut result =
        json!({"loss": loss, "lm_loss": lm_loss, "perplexity": lm_loss.exp(), "num_tokens": n});
    if let Some(logits) = dumped {
        result["logits"] = json!(logits);
    }
    if let Some(moe) = &model.config.moe {
        result["router_aux_loss_type"] = json!(moe.router_aux_loss_type.as_str());
        result["router_aux_loss_coef"] = json!(moe.router_aux_loss_coef);
        result["output_router_logits"] = json!(moe.output_router_logits);
    }
    if let Some(aux) = parts.aux {
        result["aux_loss"] = json!(f64::from(aux.into_scalar::<f32>()));
    }
    if let Some(z) = parts.z {
        result["z_loss"] = json!(f64::from(z.into_scalar::<f32>()));
    }
    Ok(result)
}

pub fn score(args: ScoreArgs) -> Result<()> {
    let (model, device) = args.model.load()?;
    let (ids, b, t) = read_token_rows(&args.tokens, model.config.vocab_size)?;
    let result = score_rows(&model, ids, b, t, &device, args.dump_logits)?;
    println!("{result}");
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to measure perplexity on (.gz read transparently).
    #[arg(long)]
    pub text: PathBuf,
    /// tokenizer.json (default: next to the model).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Tokens per window (default: the model's max_position_embeddings, at most 1024).
    #[arg(long)]
    pub context: Option<usize>,
    /// Windows per forward pass.
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    /// Score at most the first N tokens of the text.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Also report the loss by position inside the window, in buckets of N positions
    /// (`loss_by_position`): shows how a model does beyond the context it was trained at.
    #[arg(long)]
    pub bucket: Option<usize>,
}

pub fn eval(args: EvalArgs) -> Result<()> {
    let (model, device) = args.model.load()?;
    let tok = find_tokenizer(&args.model.model, args.tokenizer.as_deref())?
        .context("no tokenizer.json next to the model; pass --tokenizer")?;
    let text = qwen_burn_data::ingest::read_text_file(&args.text)
        .with_context(|| format!("reading {}", args.text.display()))?;
    let mut ids = tok.encode(&text)?;
    if let Some(max) = args.max_tokens {
        ids.truncate(max);
    }
    let context = args
        .context
        .unwrap_or(model.config.max_position_embeddings.min(1024));
    if context < 2 {
        bail!("--context must be at least 2 tokens (got {context})");
    }
    if ids.len() < context {
        bail!(
            "{} has {} tokens, fewer than one window of {} (lower --context)",
            args.text.display(),
            ids.len(),
            context
        );
    }
    // Non-overlapping windows of exactly `context` tokens (the model sees positions
    // 0..context-1); every window scores its context-1 next-token predictions.
    let windows: Vec<&[u32]> = ids.chunks_exact(context).collect();
    let bucket = args.bucket.unwrap_or(context).max(1);
    let num_buckets = (context - 1).div_ceil(bucket);
    // Sums and counts per bucket of predicted positions 1..context-1 (position p predicts
    // token p from tokens 0..p-1, so bucket k covers positions k*bucket+1 ..= (k+1)*bucket).
    let mut sums = vec![0.0f64; num_buckets];
    let mut counts = vec![0usize; num_buckets];
    let show = std::io::stderr().is_terminal();
    for group in windows.chunks(args.batch_size.max(1)) {
        let b = group.len();
        let flat: Vec<i64> = group
            .iter()
            .flat_map(|w| w.iter().map(|&i| i64::from(i)))
            .collect();
        let targets = targets_tensor(shift_targets(&flat, b, context), b, context, &device);
        let input = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, context]), &device);
        let logits = model.forward(input, None, None).logits;
        let nll = token_nll(logits, targets)
            .try_into_vec_as::<f32>()
            .map_err(|e| anyhow::anyhow!("reading losses: {e:?}"))?;
        for row in nll.chunks_exact(context) {
            for (p, &x) in row[..context - 1].iter().enumerate() {
                sums[p / bucket] += f64::from(x);
                counts[p / bucket] += 1;
            }
        }
        if show {
            eprint!(
                "\reval: {} predictions scored",
                counts.iter().sum::<usize>()
            );
        }
    }
    if show {
        eprintln!();
    }
    let count: usize = counts.iter().sum();
    let loss = sums.iter().sum::<f64>() / count as f64;
    let mut result = json!({"loss": loss, "perplexity": loss.exp(), "tokens": count, "windows": windows.len(), "context": context});
    if args.bucket.is_some() {
        result["loss_by_position"] = sums
            .iter()
            .zip(&counts)
            .enumerate()
            .map(|(k, (s, &n))| {
                json!({"from": k * bucket + 1, "to": ((k + 1) * bucket).min(context - 1), "loss": s / n as f64})
            })
            .collect();
    }
    println!("{result}");
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text (needs a tokenizer).
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most (default: generation_config.json's max_new_tokens, else 64).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Softmax temperature; 0 = greedy. Default: the model's generation_config.json (greedy
    /// unless it sets do_sample), else greedy.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens when sampling (default: generation_config.json).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p (default:
    /// generation_config.json).
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// tokenizer.json (default: next to the model).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Do not stop at the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Recompute the whole prefix every step instead of using the KV cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// `generation_config.json` next to the model (or in its parent or grandparent: a checkpoint's
/// run directory).
fn find_generation_config(model_dir: &Path) -> Result<Option<GenerationConfig>> {
    for dir in [
        Some(model_dir),
        model_dir.parent(),
        model_dir.parent().and_then(Path::parent),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(config) = GenerationConfig::from_dir(dir)? {
            if !config.unsupported.is_empty() {
                eprintln!(
                    "warning: {}: not supported by qwen-burn, ignored: {}",
                    dir.join("generation_config.json").display(),
                    config.unsupported.join(", ")
                );
            }
            return Ok(Some(config));
        }
    }
    Ok(None)
}

/// What to generate, as HF decides it: the flags win over `generation_config.json`, which wins
/// over greedy decoding. Generation stops on any of the eos ids of `config.json` and of
/// `generation_config.json`, and on the tokenizer's document end and chat turn end
/// (`<|endoftext|>`, `<|im_end|>`) when it has them.
pub fn sampling_config(
    args: &GenerateArgs,
    config_eos: &[u32],
    generation: Option<&GenerationConfig>,
    tok: Option<&Tok>,
) -> SamplingConfig {
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
    SamplingConfig {
        max_new_tokens: args
            .max_new_tokens
            .or(generation.and_then(|g| g.max_new_tokens))
            .unwrap_or(64),
        temperature,
        top_k: args.top_k.or(defaults.top_k).filter(|_| sampling),
        top_p: args.top_p.or(defaults.top_p).filter(|_| sampling),
        seed: args.seed,
        stop_tokens,
        use_cache: !args.no_cache,
    }
}

pub fn generate_cmd(args: GenerateArgs) -> Result<()> {
    let (model, device) = args.model.load()?;
    let tok = find_tokenizer(&args.model.model, args.tokenizer.as_deref())?;
    let prompt: Vec<u32> = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) => tok
            .as_ref()
            .context("--prompt needs a tokenizer: put tokenizer.json next to the model or pass --tokenizer")?
            .encode(text)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let gen_config = find_generation_config(&args.model.model)?;
    let cfg = sampling_config(
        &args,
        &model.config.eos_token_id,
        gen_config.as_ref(),
        tok.as_ref(),
    );
    let stream = !args.json && tok.is_some();
    if stream && let Some(text) = &args.prompt {
        print!("{text}");
    }
    let mut shown = String::new();
    let mut so_far = Vec::new();
    let out = generate(&model, &prompt, &cfg, &device, |id| {
        if stream && let Some(tok) = &tok {
            so_far.push(id);
            // Decode the whole continuation so multi-token characters print correctly.
            if let Ok(text) = tok.decode(&so_far) {
                if let Some(delta) = text.strip_prefix(shown.as_str()) {
                    print!("{delta}");
                    let _ = std::io::stdout().flush();
                }
                shown = text;
            }
        }
    })?;
    let n = out.new_token_ids.len();
    let decode_tps = if n > 1 {
        (n - 1) as f64 / out.decode_secs
    } else {
        0.0
    };
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
