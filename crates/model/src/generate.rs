//! Autoregressive generation with the KV cache: greedy, temperature, top-k, top-p.

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
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

impl Generation {
    /// Tokens a second after the first (which the prefill produced); 0 with fewer than two.
    pub fn decode_tokens_per_sec(&self) -> f64 {
        match self.new_token_ids.len() {
            n if n > 1 => (n - 1) as f64 / self.decode_secs,
            _ => 0.0,
        }
    }
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
    // HF warper order: temperature, top-k, top-p, then sample, walking the tokens from the most
    // likely down (ties by id). Only the head of that order is usually read (the draw and top-p
    // stop within a few tokens), so it is sorted on demand: a head first, more only when a walk
    // reaches past it, instead of sorting the whole vocabulary for every token.
    let n = logits.len();
    let mut order = Order::new(logits);
    let keep = cfg.top_k.filter(|&k| k > 0).map_or(n, |k| k.min(n));
    let t = cfg.temperature;
    let max = logits[order.at(0)] / t;
    let weight = |i: usize| f64::from(logits[i] / t - max).exp();
    let total: f64 = if keep == n {
        logits.iter().enumerate().map(|(i, _)| weight(i)).sum()
    } else {
        (0..keep).map(|r| weight(order.at(r))).sum()
    };
    let prob = |i: usize| weight(i) / total;
    let mut cut = keep;
    let mut renorm = 1.0;
    if let Some(p) = cfg.top_p {
        let mut cumulative = 0.0;
        for r in 0..keep {
            cumulative += prob(order.at(r));
            if cumulative >= f64::from(p) {
                cut = r + 1;
                break;
            }
        }
        renorm = (0..cut).map(|r| prob(order.at(r))).sum();
    }
    let draw: f64 = rng.random();
    let mut cumulative = 0.0;
    for r in 0..cut {
        let i = order.at(r);
        cumulative += prob(i) / renorm;
        if draw < cumulative {
            return i as u32;
        }
    }
    order.at(cut - 1) as u32
}

/// Token ids from the largest logit down (ties by id), sorted as far as read.
struct Order<'a> {
    logits: &'a [f32],
    ids: Vec<usize>,
    sorted: usize,
}

/// Ids sorted at first; each further read past the sorted head doubles it.
const HEAD: usize = 64;

impl<'a> Order<'a> {
    fn new(logits: &'a [f32]) -> Self {
        let mut order = Self {
            logits,
            ids: (0..logits.len()).collect(),
            sorted: 0,
        };
        order.sort_to(HEAD);
        order
    }

    /// The id of rank `r`.
    fn at(&mut self, r: usize) -> usize {
        if r >= self.sorted {
            self.sort_to((2 * self.sorted).max(r + 1));
        }
        self.ids[r]
    }

    /// Sort ranks `sorted..upto`: select them from the unsorted rest, then sort them.
    fn sort_to(&mut self, upto: usize) {
        let upto = upto.min(self.ids.len());
        if upto <= self.sorted {
            return;
        }
        let logits = self.logits;
        let before = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        let rest = &mut self.ids[self.sorted..];
        let count = upto - self.sorted;
        if count < rest.len() {
            rest.select_nth_unstable_by(count, before);
        }
        rest[..count].sort_unstable_by(before);
        self.sorted = upto;
    }
}

/// `ids` as `[rows, ids.len() / rows]`.
pub(crate) fn ids_tensor(ids: &[u32], rows: usize, device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    Tensor::from_data(TensorData::new(data, [rows, ids.len() / rows]), device)
}

/// Each row's logits at its last position only: `[rows, t, hidden]` -> `[rows, vocab]` floats
/// on the host, row-major.
pub(crate) fn last_logits(
    model: &Qwen3ForCausalLM,
    hidden: Tensor<3>,
    rows: usize,
) -> Result<Vec<f32>> {
    let [_, t, h] = hidden.dims();
    let last = hidden.narrow(1, t - 1, 1).reshape([rows, 1, h]);
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
    on_token: impl FnMut(u32),
) -> Result<Generation> {
    check_prompt(model, prompt, cfg)?;
    run(model, &mut model.new_cache(), prompt, cfg, device, on_token)
}

/// Checks the sampling and the prompt (not empty, every id below `vocab_size`).
pub(crate) fn check_prompt(
    model: &Qwen3ForCausalLM,
    prompt: &[u32],
    cfg: &SamplingConfig,
) -> Result<()> {
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
    Ok(())
}

/// The generation loop on `cache`, which may already hold the keys and values of a head of
/// `prompt` (`cache.seq_len` tokens, fewer than the prompt's): the prefill computes the rest.
/// On return the cache holds the prompt and every new token but the last. The callers check
/// the prompt first ([`check_prompt`]).
pub(crate) fn run(
    model: &Qwen3ForCausalLM,
    cache: &mut KvCache,
    prompt: &[u32],
    cfg: &SamplingConfig,
    device: &Device,
    mut on_token: impl FnMut(u32),
) -> Result<Generation> {
    let cached = cache.seq_len;
    debug_assert!(cached < prompt.len() && cfg.use_cache || cached == 0);
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut sequence = prompt.to_vec();
    // Grown as tokens come: `max_new_tokens` is a user bound, not a size to reserve.
    let mut new_tokens = Vec::new();
    let mut stopped = false;

    let start = Instant::now();
    let mut prefill_secs = 0.0;
    for step in 0..cfg.max_new_tokens {
        let hidden = if !cfg.use_cache {
            model
                .forward_hidden(ids_tensor(&sequence, 1, device), None, None)
                .0
        } else if step == 0 {
            let rest = &prompt[cached..];
            model
                .forward_hidden(ids_tensor(rest, 1, device), None, Some(&mut *cache))
                .0
        } else {
            let last = &sequence[sequence.len() - 1..];
            model
                .forward_hidden(ids_tensor(last, 1, device), None, Some(&mut *cache))
                .0
        };
        let logits = last_logits(model, hidden, 1)?;
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
