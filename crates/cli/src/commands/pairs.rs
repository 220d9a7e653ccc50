//! `qwen-burn eval --pairs FILE`: how a model ranks the completions of preference pairs
//! (TRL's layouts, tokenised as TRL does): `preference_accuracy`, the share of pairs whose
//! chosen completion has the higher summed log-probability, needs no reference; with
//! `--reference`, also the preference loss and TRL's reward figures.

use std::path::Path;

use anyhow::{Context, Result};
use burn::tensor::Device;
use qwen_burn_data::{
    ChatTemplate, PreferenceData, Tok, Truncation, completion_eos, load_preferences,
};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_train::config::{PreferenceConfig, PreferenceLoss};
use qwen_burn_train::objective::preference::{pair_logps, pair_loss};
use serde_json::json;

/// What `--pairs` needs besides the model.
pub struct PairsArgs<'a> {
    pub pairs: &'a Path,
    pub reference: Option<&'a Path>,
    pub loss: PreferenceLoss,
    pub beta: f64,
    pub batch_pairs: usize,
}

/// `[chosen, rejected]` summed completion log-probabilities of every pair, each row as long as
/// the longest sequence.
fn logps(
    model: &Qwen3ForCausalLM,
    data: &PreferenceData,
    pad: u32,
    batch: usize,
    device: &Device,
) -> Result<Vec<[f64; 2]>> {
    let seq_len = data
        .pairs
        .iter()
        .flat_map(|p| [p.chosen.ids.len(), p.rejected.ids.len()])
        .max()
        .unwrap_or(1)
        .max(1);
    Ok(pair_logps(model, data, seq_len, pad, batch, device)?)
}

pub fn run_pairs(
    args: &PairsArgs<'_>,
    model: &Qwen3ForCausalLM,
    tok: &Tok,
    device: &Device,
    load_reference: impl Fn(&Path) -> Result<Qwen3ForCausalLM>,
) -> Result<()> {
    let template = ChatTemplate::beside(tok.path())?.unwrap_or_else(ChatTemplate::chatml);
    let eos = completion_eos(tok, &template)?;
    let data = load_preferences(
        args.pairs,
        tok,
        &template,
        &eos,
        None,
        Truncation::KeepStart,
    )
    .with_context(|| format!("reading {}", args.pairs.display()))?;
    let pad = tok.require_eos()?;
    let policy = logps(model, &data, pad, args.batch_pairs, device)?;
    let n = policy.len() as f64;
    let mean = |f: &dyn Fn(usize) -> f64| (0..policy.len()).map(f).sum::<f64>() / n;
    let mut out = json!({
        "pairs": policy.len(),
        "preference_accuracy": mean(&|i| f64::from(u8::from(policy[i][0] > policy[i][1]))),
        "logps_chosen": mean(&|i| policy[i][0]),
        "logps_rejected": mean(&|i| policy[i][1]),
    });
    if let Some(path) = args.reference {
        let reference_model = load_reference(path)?;
        let reference = logps(&reference_model, &data, pad, args.batch_pairs, device)?;
        let config = PreferenceConfig {
            loss: args.loss,
            beta: args.beta,
            ..PreferenceConfig::default()
        };
        let tokens: Vec<[f64; 2]> = data
            .pairs
            .iter()
            .map(|p| {
                [
                    p.chosen.completion().len() as f64,
                    p.rejected.completion().len() as f64,
                ]
            })
            .collect();
        let reward = |i: usize, k: usize| args.beta * (policy[i][k] - reference[i][k]);
        out["loss_type"] = json!(args.loss.as_str());
        out["beta"] = json!(args.beta);
        out["loss"] = json!(mean(&|i| pair_loss(
            &config,
            policy[i][0],
            policy[i][1],
            reference[i][0],
            reference[i][1],
            tokens[i][0],
            tokens[i][1]
        )));
        out["reward_accuracy"] = json!(mean(&|i| f64::from(u8::from(reward(i, 0) > reward(i, 1)))));
        out["reward_margin"] = json!(mean(&|i| reward(i, 0) - reward(i, 1)));
    }
    println!("{out}");
    Ok(())
}
