//! Autoregressive generation with the KV cache: greedy, temperature, top-k, top-p.

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};
use crate::model::Qwen3ForCausalLM;

/// How to pick each next token and when to stop.
#[derive(Debug, Clone)]
pub struct SamplingConfig {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// 0 = greedy (argmax); otherwise logits are divided by it before sampling.
    pub temperature: f32,
    /// Keep only the k most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p.
    pub top_p: Option<f32>,
    /// RNG seed for sampling.
    pub seed: u64,
    /// Stop after producing any of these tokens (it is included in the output).
    pub stop_tokens: Vec<u32>,
    /// Use the KV cache (false recomputes the whole prefix every step; for benchmarks).
    pub use_cache: bool,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 32,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
            stop_tokens: Vec::new(),
            use_cache: true,
        }
    }
}

impl SamplingConfig {
    /// Check the values as HF's `GenerationConfig` and logits warpers do: the temperature is a
    /// finite number >= 0 (0 = greedy), top-p lies in (0, 1]. `top_k = Some(0)` is allowed and
    /// means no top-k filter, as in HF. The error names the field.
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(ModelError::invalid(
                "temperature",
                format!("must be a finite number >= 0 (0 = greedy), found {t}"),
            ));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(ModelError::invalid(
                "top_p",
                format!("must be in (0, 1] (1 = no nucleus filter), found {p}"),
            ));
        }
        Ok(())
    }
}

/// Result of a generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The generated tokens (prompt excluded).
    pub new_token_ids: Vec<u32>,
    /// Wall time of the prompt forward (prefill), seconds.
    pub prefill_secs: f64,
    /// Wall time of the remaining decoding steps, seconds.
    pub decode_secs: f64,
    /// Whether a stop token ended the generation.
    pub stopped: bool,
}

/// Pick the next token from one row of logits.
pub fn sample_next(logits: &[f32], cfg: &SamplingConfig, rng: &mut ChaCha8Rng) -> u32 {
    if cfg.temperature <= 0.0 {
        // First maximum, like torch.argmax.
        let mut best = 0;
        for (i, &v) in logits.iter().enumerate() {
            if v > logits[best] {
                best = i;
            }
        }
        return best as u32;
    }
    // HF warper order: temperature, top-k, top-p, then sample.
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let mut keep = order.len();
    // top_k = 0 is HF's "no top-k filter".
    if let Some(k) = cfg.top_k.filter(|&k| k > 0) {
        keep = keep.min(k);
    }
    let max = logits[order[0]] / cfg.temperature;
    let mut probs: Vec<f64> = order[..keep]
        .iter()
        .map(|&i| f64::from(logits[i] / cfg.temperature - max).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = cfg.top_p {
        let mut cumulative = 0.0;
        let mut cut = probs.len();
        for (i, q) in probs.iter().enumerate() {
            cumulative += q;
            if cumulative >= f64::from(p) {
                cut = i + 1;
                break;
            }
        }
        probs.truncate(cut.max(1));
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
    }
    let draw: f64 = rng.random();
    let mut cumulative = 0.0;
    for (i, p) in probs.iter().enumerate() {
        cumulative += p;
        if draw < cumulative {
            return order[i] as u32;
        }
    }
    order[probs.len() - 1] as u32
}

fn ids_tensor(ids: &[u32], device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    Tensor::from_data(TensorData::new(data, [1, ids.len()]), device)
}

/// Logits of the last position only: `[1, t, hidden]` -> `vocab` floats on the host.
fn last_logits(model: &Qwen3ForCausalLM, hidden: Tensor<3>) -> Result<Vec<f32>> {
    let [_, t, h] = hidden.dims();
    let last = hidden.narrow(1, t - 1, 1).reshape([1, 1, h]);
    model
        .lm_head(last)
        .try_into_vec_as::<f32>()
        .map_err(|e| ModelError::TensorRead {
            key: "logits".into(),
            reason: format!("{e:?}"),
        })
}

/// Generate up to `cfg.max_new_tokens` tokens after `prompt`, calling `on_token` for each.
///
/// The loop runs on a thread of rayon's pool ([`qwen_burn_kernels::in_pool`]).
pub fn generate(
    model: &Qwen3ForCausalLM,
    prompt: &[u32],
    cfg: &SamplingConfig,
    device: &Device,
    on_token: impl FnMut(u32) + Send,
) -> Result<Generation> {
    qwen_burn_kernels::in_pool(|| generate_here(model, prompt, cfg, device, on_token))
}

fn generate_here(
    model: &Qwen3ForCausalLM,
    prompt: &[u32],
    cfg: &SamplingConfig,
    device: &Device,
    mut on_token: impl FnMut(u32),
) -> Result<Generation> {
    cfg.validate()?;
    if prompt.is_empty() {
        return Err(ModelError::InvalidInput(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    let vocab = model.config.vocab_size;
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(ModelError::InvalidInput(format!(
            "prompt token id {bad} is out of range for vocab_size {vocab}"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut cache = model.new_cache();
    let mut sequence = prompt.to_vec();
    // Grown as tokens come: `max_new_tokens` is a user bound, not a size to reserve.
    let mut new_tokens = Vec::new();
    let mut stopped = false;

    let start = Instant::now();
    let mut prefill_secs = 0.0;
    for step in 0..cfg.max_new_tokens {
        let hidden = if !cfg.use_cache {
            model
                .forward_hidden(ids_tensor(&sequence, device), None, None)
                .0
        } else if step == 0 {
            model
                .forward_hidden(ids_tensor(prompt, device), None, Some(&mut cache))
                .0
        } else {
            let last = &sequence[sequence.len() - 1..];
            model
                .forward_hidden(ids_tensor(last, device), None, Some(&mut cache))
                .0
        };
        let logits = last_logits(model, hidden)?;
        if step == 0 {
            prefill_secs = start.elapsed().as_secs_f64();
        }
        let next = sample_next(&logits, cfg, &mut rng);
        sequence.push(next);
        new_tokens.push(next);
        on_token(next);
        if cfg.stop_tokens.contains(&next) {
            stopped = true;
            break;
        }
    }
    Ok(Generation {
        new_token_ids: new_tokens,
        prefill_secs,
        decode_secs: start.elapsed().as_secs_f64() - prefill_secs,
        stopped,
    })
}
