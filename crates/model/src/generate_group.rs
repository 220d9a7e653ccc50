//! Several completions of one prompt decoded as one batch: the prompt's prefill runs once, its
//! KV cache is copied to every row, then each step decodes all rows together. What RL rollouts
//! (a group of completions per prompt) and pass@k need.

use burn::tensor::{Device, Tensor};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};
use crate::generate::{SamplingConfig, ids_tensor, last_logits, sample_next};
use crate::model::Qwen3ForCausalLM;

/// One completion of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupCompletion {
    /// Its tokens (a stop token included).
    pub ids: Vec<u32>,
    /// Whether a stop token or `stop` ended it (else it reached `max_new_tokens`).
    pub stopped: bool,
}

/// `n` completions of `prompt`, decoded as one batch, each row sampling with
/// [`sample_next`] from its own `rngs[row]` (so row `i` is what [`crate::generate`] gives with
/// that RNG's seed). A row ends at a stop token of `cfg` or when `stop` says its tokens so far
/// end it; ended rows keep decoding a padding token, unread, until every row has ended or
/// `max_new_tokens` is reached.
pub fn generate_group(
    model: &Qwen3ForCausalLM,
    prompt: &[u32],
    cfg: &SamplingConfig,
    rngs: &mut [ChaCha8Rng],
    device: &Device,
    stop: &(dyn Fn(&[u32]) -> bool + Sync),
) -> Result<Vec<GroupCompletion>> {
    let mut groups = generate_groups(model, &[prompt], cfg, rngs, device, stop)?;
    Ok(groups.pop().unwrap_or_default())
}

/// [`generate_group`] of several prompts of one length at once: their prefill is one batch, and
/// every prompt's `rngs.len() / prompts.len()` rows (prompt by prompt in `rngs`) decode together,
/// so a step's matrix products have all the rows (a rollout's or pass@k's many short groups
/// would otherwise each decode a handful of rows). Each row is still what [`crate::generate`]
/// gives with its RNG's seed.
pub fn generate_groups(
    model: &Qwen3ForCausalLM,
    prompts: &[&[u32]],
    cfg: &SamplingConfig,
    rngs: &mut [ChaCha8Rng],
    device: &Device,
    stop: &(dyn Fn(&[u32]) -> bool + Sync),
) -> Result<Vec<Vec<GroupCompletion>>> {
    cfg.validate()?;
    let p = prompts.len();
    let len = prompts.first().map_or(0, |x| x.len());
    if len == 0 || rngs.is_empty() || !rngs.len().is_multiple_of(p) {
        return Err(ModelError::InvalidInput(format!(
            "a group generation needs prompts of one token or more and the same number of rows \
             for each ({} rows for {p} prompts)",
            rngs.len()
        )));
    }
    if let Some(other) = prompts.iter().find(|x| x.len() != len) {
        return Err(ModelError::InvalidInput(format!(
            "prompts decoded together need one length: {len} and {} tokens",
            other.len()
        )));
    }
    let n = rngs.len() / p;
    let vocab = model.config.vocab_size;
    if let Some(bad) = prompts
        .iter()
        .flat_map(|x| x.iter())
        .find(|&&id| id as usize >= vocab)
    {
        return Err(ModelError::InvalidInput(format!(
            "prompt token id {bad} is out of range for vocab_size {vocab}"
        )));
    }
    let rows_total = p * n;
    qwen_burn_kernels::in_pool(|| {
        let mut cache = model.new_cache();
        let flat: Vec<u32> = prompts.iter().flat_map(|x| x.iter().copied()).collect();
        let (hidden, _) =
            model.forward_hidden(ids_tensor(&flat, p, device), None, Some(&mut cache));
        // Each prompt's keys and values, once per row of its group (prompt by prompt).
        let repeat = |t: Tensor<4>| {
            let [b, h, s, d] = t.dims();
            t.unsqueeze_dim::<5>(1)
                .repeat_dim(1, n)
                .reshape([b * n, h, s, d])
        };
        for layer in &mut cache.layers {
            layer.keys = layer.keys.take().map(repeat);
            layer.values = layer.values.take().map(repeat);
        }
        // Each row's logits: row `r` reads row `r / share` of `logits` (a prompt's prefill
        // logits are its group's first ones).
        let (mut logits, mut share) = (last_logits(model, hidden, p)?, n);
        let mut rows: Vec<GroupCompletion> = (0..rows_total)
            .map(|_| GroupCompletion {
                ids: Vec::new(),
                stopped: false,
            })
            .collect();
        let pad = cfg.stop_tokens.first().copied().unwrap_or(0);
        for step in 0..cfg.max_new_tokens {
            let mut next = Vec::with_capacity(rows_total);
            for (r, row) in rows.iter_mut().enumerate() {
                if row.stopped {
                    next.push(pad);
                    continue;
                }
                let at = r / share * vocab;
                let token = sample_next(&logits[at..at + vocab], cfg, &mut rngs[r]);
                row.ids.push(token);
                row.stopped = cfg.stop_tokens.contains(&token) || stop(&row.ids);
                next.push(token);
            }
            if rows.iter().all(|r| r.stopped) || step + 1 == cfg.max_new_tokens {
                break;
            }
            let (hidden, _) = model.forward_hidden(
                ids_tensor(&next, rows_total, device),
                None,
                Some(&mut cache),
            );
            (logits, share) = (last_logits(model, hidden, rows_total)?, 1);
        }
        let mut groups = Vec::with_capacity(p);
        let mut rows = rows.into_iter();
        for _ in 0..p {
            groups.push(rows.by_ref().take(n).collect());
        }
        Ok(groups)
    })
}
