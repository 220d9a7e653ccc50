//! `qwen-burn score`: the loss of token rows given as JSON, as the training step assembles it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::loss::{cross_entropy_sum, shift_targets, targets_tensor};
use qwen_burn_train::step::{add_router_losses, own_fractions};
use serde_json::json;

use super::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// JSON file `{"input_ids": [[...], ...]}` with equal-length rows; every next-token
    /// prediction is scored (any other key, such as `attention_mask` or `labels`, is refused).
    #[arg(long)]
    pub tokens: PathBuf,
    /// Also print the logits (flat, row-major `[b, t, vocab]`) under `logits`.
    #[arg(long)]
    pub dump_logits: bool,
    /// tokenizer.json (default: next to the model, if there is one): with a tokenizer the
    /// output has `bpb`, the bits per byte of the target tokens' text.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
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
    // Every position of every row is scored: a padding mask or labels would be ignored, so
    // padding would be scored as text. Refused instead.
    if let Some(other) = value
        .as_object()
        .and_then(|o| o.keys().find(|k| k.as_str() != "input_ids"))
    {
        bail!(
            "{}: `{other}` is not read by score, which scores every next-token prediction of \
             every row (no padding mask, no labels); give only `input_ids`, with rows of real \
             tokens of equal length",
            path.display()
        );
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
    let fractions = own_fractions(&model.config, &out.routers, None);
    let ce_sum = cross_entropy_sum(out.logits.clone(), targets);
    let parts = add_router_losses(
        &model.config,
        ce_sum.clone() / n as f64,
        &out.routers,
        b,
        None,
        1.0,
        fractions.as_deref(),
    );
    let lm_loss = f64::from(ce_sum.into_scalar::<f32>()) / n as f64;
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

pub fn run(args: Args) -> Result<()> {
    let (model, device) = args.model.load()?;
    let (ids, b, t) = read_token_rows(&args.tokens, model.config.vocab_size)?;
    // One forward over every row: refuse what it cannot hold before allocating.
    model
        .config
        .forward_estimate(b, t, "rows x tokens of --tokens")
        .check(&format!("score of {}", args.tokens.display()))?;
    let tok = super::find_tokenizer(&args.model.model, args.tokenizer.as_deref())?;
    // The targets are every row's tokens after its first.
    let target_bytes = tok.as_ref().map(|tok| {
        let targets: Vec<i64> = ids
            .chunks_exact(t)
            .flat_map(|row| row[1..].iter().copied())
            .collect();
        qwen_burn_train::eval::validation::target_bytes(&targets, &tok.token_bytes())
    });
    let mut result = score_rows(&model, ids, b, t, &device, args.dump_logits)?;
    if let (Some(bytes), Some(lm_loss)) = (target_bytes, result["lm_loss"].as_f64()) {
        let sum = lm_loss * (b * (t - 1)) as f64;
        if let Some(bpb) = qwen_burn_train::eval::validation::bits_per_byte(sum, bytes) {
            result["bpb"] = json!(bpb);
        }
    }
    super::require_finite(&model, result["loss"].as_f64().unwrap_or(f64::NAN), "loss")?;
    println!("{result}");
    Ok(())
}
