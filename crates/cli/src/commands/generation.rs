//! `qwen-burn eval --generate FILE`: a model's completions of prompts, scored by a reward
//! (see `qwen_burn_train::eval::generation`).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use burn::tensor::Device;
use qwen_burn_data::{TemplateKwargs, Tok, load_prompts};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_train::config::RlConfig;
use qwen_burn_train::eval::generation::evaluate_generation;
use qwen_burn_train::objective::rl::rewards::Reward;

/// What `--generate` needs besides the model.
pub struct GenerateArgs<'a> {
    pub reward: &'a str,
    pub pattern: Option<&'a str>,
    pub limit: Option<usize>,
    pub max_new_tokens: usize,
    pub temperature: f64,
    pub samples: usize,
    pub seed: u64,
    pub json: bool,
    /// `--records`: each prompt's greedy completion and score, as JSONL.
    pub records: Option<&'a Path>,
    /// `--chat-template-kwargs`.
    pub template_kwargs: Option<&'a TemplateKwargs>,
}

pub fn run_generate(
    args: &GenerateArgs<'_>,
    path: &Path,
    model: &Qwen3ForCausalLM,
    tok: &Tok,
    device: &Device,
) -> Result<()> {
    let pattern = |default: &str| {
        let text = args.pattern.unwrap_or(default);
        regex::Regex::new(text).with_context(|| format!("--pattern {text:?} is not a regex"))
    };
    let reward = match args.reward {
        "regex" => Reward::Regex {
            pattern: pattern("").and_then(|p| {
                anyhow::ensure!(args.pattern.is_some(), "--reward regex needs --pattern");
                Ok(p)
            })?,
        },
        _ => Reward::ExactMatch {
            pattern: pattern(Reward::GSM8K_PATTERN)?,
        },
    };
    let template = super::chat_template(tok, args.template_kwargs)?;
    let mut prompts = load_prompts(path, tok, &template, None)
        .with_context(|| format!("reading {}", path.display()))?;
    if let Some(limit) = args.limit {
        prompts.items.truncate(limit);
    }
    let sampling = RlConfig {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        ..RlConfig::default()
    };
    anyhow::ensure!(
        args.temperature.is_finite() && args.temperature > 0.0,
        "--temperature is {}; sampling needs a temperature above 0",
        args.temperature
    );
    let result = evaluate_generation(
        model,
        Arc::new(prompts),
        tok,
        reward,
        &sampling,
        args.samples,
        args.seed,
        device,
    )?;
    if let Some(out) = args.records {
        super::eval::write_records(out, &result.records)?;
    }
    if args.json {
        let mut out = serde_json::json!({
            "prompts": result.prompts,
            "reward": args.reward,
            "accuracy": result.accuracy,
            "mean_reward": result.mean_reward,
            "mean_length": result.mean_length,
            "samples": result.samples,
        });
        for (k, p) in &result.pass_at {
            out[format!("pass@{k}")] = serde_json::json!(p);
        }
        println!("{out}");
    } else {
        let pass: String = result
            .pass_at
            .iter()
            .map(|(k, p)| format!(" | pass@{k} {p:.4}"))
            .collect();
        println!(
            "{} prompts | accuracy {:.4} | mean reward {:.4} | mean length {:.1}{pass}",
            result.prompts, result.accuracy, result.mean_reward, result.mean_length
        );
    }
    Ok(())
}
