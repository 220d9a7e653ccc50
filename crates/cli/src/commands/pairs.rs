//! `qwen-burn eval --pairs FILE`: how a model ranks the completions of preference pairs
//! (TRL's layouts, tokenised as TRL does): `preference_accuracy`, the share of pairs whose
//! chosen completion has the higher summed log-probability, needs no reference; with
//! `--loss` (and `--reference` for the losses that compare with one), also the preference
//! loss and TRL's reward figures, over all pairs as one batch.

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use qwen_burn_data::{
    PreferenceData, TemplateKwargs, Tok, Truncation, completion_eos, load_preferences,
};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_train::config::{PreferenceConfig, PreferenceLoss};
use qwen_burn_train::objective::preference::{PairNumbers, Wholes, mean_loss, pair_logps_whole};
use serde_json::json;

/// What `--pairs` needs besides the model.
pub struct PairsArgs<'a> {
    pub pairs: &'a Path,
    pub reference: Option<&'a Path>,
    /// None: `sigmoid` with a reference, else no loss.
    pub loss: Option<PreferenceLoss>,
    pub beta: f64,
    pub gamma: Option<f64>,
    pub sft_weight: f64,
    pub batch_pairs: usize,
    /// `--chat-template-kwargs`.
    pub template_kwargs: Option<&'a TemplateKwargs>,
}

/// `[chosen, rejected]` summed completion log-probabilities of every pair, each row as long as
/// the longest sequence; with `whole`, also each chosen sequence's `[logp, tokens]` over all
/// its next tokens (ORPO's NLL).
fn logps(
    model: &Qwen3ForCausalLM,
    data: &PreferenceData,
    pad: u32,
    batch: usize,
    device: &Device,
    whole: bool,
) -> Result<(Vec<[f64; 2]>, Option<Wholes>)> {
    let seq_len = data
        .pairs
        .iter()
        .flat_map(|p| [p.chosen.ids.len(), p.rejected.ids.len()])
        .max()
        .unwrap_or(1)
        .max(1);
    Ok(pair_logps_whole(
        model, data, seq_len, pad, batch, device, whole,
    )?)
}

pub fn run_pairs(
    args: &PairsArgs<'_>,
    model: &Qwen3ForCausalLM,
    tok: &Tok,
    device: &Device,
    load_reference: impl Fn(&Path) -> Result<Qwen3ForCausalLM>,
) -> Result<()> {
    let loss = match (args.loss, args.reference) {
        (Some(loss), None) if loss.needs_reference() => bail!(
            "--loss {} compares with a reference model: pass --reference (simpo and orpo need none)",
            loss.as_str()
        ),
        (Some(loss), _) => Some(loss),
        (None, Some(_)) => Some(PreferenceLoss::Sigmoid),
        (None, None) => None,
    };
    let template = super::chat_template(tok, args.template_kwargs)?;
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
    let orpo = loss == Some(PreferenceLoss::Orpo);
    let (policy, whole) = logps(model, &data, pad, args.batch_pairs, device, orpo)?;
    let n = policy.len() as f64;
    let mean = |f: &dyn Fn(usize) -> f64| (0..policy.len()).map(f).sum::<f64>() / n;
    let mut out = json!({
        "pairs": policy.len(),
        "preference_accuracy": mean(&|i| f64::from(u8::from(policy[i][0] > policy[i][1]))),
        "logps_chosen": mean(&|i| policy[i][0]),
        "logps_rejected": mean(&|i| policy[i][1]),
    });
    if let Some(loss) = loss {
        let config = PreferenceConfig {
            loss,
            beta: args.beta,
            gamma: args.gamma,
            sft_weight: args.sft_weight,
            ..PreferenceConfig::default()
        };
        config.check()?;
        let reference = match args.reference {
            Some(path) if loss.needs_reference() => {
                let reference_model = load_reference(path)?;
                Some(
                    logps(
                        &reference_model,
                        &data,
                        pad,
                        args.batch_pairs,
                        device,
                        false,
                    )?
                    .0,
                )
            }
            _ => None,
        };
        let numbers: Vec<PairNumbers> = data
            .pairs
            .iter()
            .enumerate()
            .map(|(i, p)| PairNumbers {
                policy: policy[i],
                reference: reference.as_ref().map(|r| r[i]),
                tokens: [
                    p.chosen.completion().len() as f64,
                    p.rejected.completion().len() as f64,
                ],
                chosen_whole: whole.as_ref().map(|w| w[i]),
            })
            .collect();
        let rewards: Vec<[f64; 2]> = numbers.iter().filter_map(|n| n.rewards(&config)).collect();
        out["loss_type"] = json!(loss.as_str());
        out["beta"] = json!(args.beta);
        if loss == PreferenceLoss::Simpo {
            out["gamma"] = json!(config.simpo_gamma());
        }
        if config.sft_weight > 0.0 {
            out["sft_weight"] = json!(config.sft_weight);
        }
        out["loss"] = json!(mean_loss(&config, &numbers));
        out["reward_accuracy"] = json!(mean(&|i| f64::from(u8::from(
            rewards[i][0] > rewards[i][1]
        ))));
        out["reward_margin"] = json!(mean(&|i| rewards[i][0] - rewards[i][1]));
    }
    println!("{out}");
    Ok(())
}
