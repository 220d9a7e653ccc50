//! `eval --generate`: how often a model's completions of prompts earn a reward: greedy
//! accuracy, and pass@k from `samples` sampled completions a prompt with the unbiased
//! estimator of Chen et al. (2021), `1 - C(n - c, k) / C(n, k)` for `c` correct of `n`.

use std::sync::Arc;

use burn::tensor::Device;
use qwen_burn_data::{PromptSet, Tok};
use qwen_burn_model::Qwen3ForCausalLM;
use serde::Serialize;

use crate::config::RlConfig;
use crate::error::Result;
use crate::objective::rl::PromptSets;
use crate::objective::rl::rewards::Reward;
use crate::objective::rl::rollout::{NamedReward, complete, score};

/// What [`evaluate_generation`] measures.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationEval {
    /// Prompts scored.
    pub prompts: usize,
    /// The share of prompts whose greedy completion earns a reward of 1 or more.
    pub accuracy: f64,
    /// The mean reward of the greedy completions.
    pub mean_reward: f64,
    /// The mean length of the greedy completions, tokens.
    pub mean_length: f64,
    /// Sampled completions a prompt (0: none).
    pub samples: usize,
    /// pass@k for k = 1, 2, 4, ... up to `samples` (and `samples` itself), by the unbiased
    /// estimator; empty without samples.
    pub pass_at: Vec<(usize, f64)>,
    /// Each prompt's greedy completion and its score, in file order (`eval --records`).
    #[serde(skip)]
    pub records: Vec<GenerationRecord>,
}

/// One prompt's line of `eval --generate --records`.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationRecord {
    /// The prompt's place in its file, counted from 0.
    pub index: usize,
    /// The prompt as the model saw it (chat template applied).
    pub prompt: String,
    /// The reference answer.
    pub answer: String,
    /// The greedy completion as the reward read it (its stop token left off).
    pub completion: String,
    /// Its reward.
    pub reward: f64,
    /// Whether it earns a reward of 1 or more (what `accuracy` counts).
    pub correct: bool,
    /// With samples: how many of them earn a reward of 1 or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples_correct: Option<usize>,
}

/// The unbiased pass@k of a prompt with `c` correct of `n` samples.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n < k || n - c < k {
        return if c > 0 { 1.0 } else { 0.0 };
    }
    // 1 - prod_{i = n - c + 1}^{n} (1 - k / i)
    1.0 - ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// Greedy accuracy and pass@k of `model` on `prompts` under `reward`; sampling with
/// `sampling`'s temperature, top-k, top-p and `max_new_tokens` (its other keys unread).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_generation(
    model: &Qwen3ForCausalLM,
    prompts: Arc<PromptSet>,
    tok: &Tok,
    reward: Reward,
    sampling: &RlConfig,
    samples: usize,
    seed: u64,
    device: &Device,
) -> Result<GenerationEval> {
    let mut stop_ids = tok.stop_ids();
    stop_ids.dedup();
    let sets = PromptSets {
        train: prompts.clone(),
        val: Arc::new(PromptSet { items: Vec::new() }),
        tok: Arc::new(tok.clone()),
        stop_ids,
    };
    let rewards = [NamedReward {
        reward,
        weight: 1.0,
        name: "reward",
    }];
    let ids: Vec<u32> = (0..prompts.items.len() as u32).collect();
    let greedy = complete(model, &sets, sampling, &ids, 1, true, seed, 0, device)?;
    let (total, _) = score(&rewards, &sets, &ids, &greedy)?;
    let n = ids.len().max(1) as f64;
    let records = ids
        .iter()
        .zip(&greedy)
        .zip(&total)
        .map(|((&id, group), &reward)| {
            let item = sets.item(id)?;
            let completion = group
                .iter()
                .map(|c| sets.completion_text(&c.ids))
                .collect::<Result<Vec<_>>>()?
                .concat();
            Ok(GenerationRecord {
                index: id as usize,
                prompt: item.text.clone(),
                answer: item.answer.clone(),
                completion,
                reward,
                correct: reward >= 1.0,
                samples_correct: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = GenerationEval {
        prompts: ids.len(),
        accuracy: total.iter().filter(|&&r| r >= 1.0).count() as f64 / n,
        mean_reward: total.iter().sum::<f64>() / n,
        mean_length: greedy.iter().flatten().map(|c| c.ids.len()).sum::<usize>() as f64 / n,
        samples,
        pass_at: Vec::new(),
        records,
    };
    if samples == 0 {
        return Ok(out);
    }
    let sampled = complete(
        model, &sets, sampling, &ids, samples, false, seed, 0, device,
    )?;
    let (total, _) = score(&rewards, &sets, &ids, &sampled)?;
    let correct: Vec<usize> = total
        .chunks(samples)
        .map(|g| g.iter().filter(|&&r| r >= 1.0).count())
        .collect();
    for (r, &c) in out.records.iter_mut().zip(&correct) {
        r.samples_correct = Some(c);
    }
    let mut ks: Vec<usize> = std::iter::successors(Some(1usize), |k| Some(k * 2))
        .take_while(|&k| k <= samples)
        .collect();
    if ks.last() != Some(&samples) {
        ks.push(samples);
    }
    out.pass_at = ks
        .into_iter()
        .map(|k| {
            let mean = correct
                .iter()
                .map(|&c| pass_at_k(samples, c, k))
                .sum::<f64>()
                / n;
            (k, mean)
        })
        .collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::pass_at_k;

    #[test]
    fn pass_at_k_is_the_unbiased_estimator() {
        // c of n correct: pass@1 = c / n; pass@n = 1 if any is correct.
        assert!((pass_at_k(8, 3, 1) - 3.0 / 8.0).abs() < 1e-12);
        assert_eq!(pass_at_k(8, 1, 8), 1.0);
        assert_eq!(pass_at_k(8, 0, 4), 0.0);
        // 1 - C(5, 2) / C(8, 2) = 1 - 10 / 28.
        assert!((pass_at_k(8, 3, 2) - (1.0 - 10.0 / 28.0)).abs() < 1e-12);
    }
}
