//! Several completions of one prompt decoded as one batch: the prompt's prefill runs once, its
//! KV cache is copied to every row, then each step decodes all rows together. What RL rollouts
//! (a group of completions per prompt) and pass@k need.

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};
use crate::generate::{SamplingConfig, sample_next};
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
    cfg.validate()?;
    let n = rngs.len();
    if prompt.is_empty() || n == 0 {
        return Err(ModelError::InvalidInput(
            "a group generation needs a prompt token and one row or more".into(),
        ));
    }
    let vocab = model.config.vocab_size;
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(ModelError::InvalidInput(format!(
            "prompt token id {bad} is out of range for vocab_size {vocab}"
        )));
    }
    qwen_burn_kernels::in_pool(|| {
        let mut cache = model.new_cache();
        let (hidden, _) = model.forward_hidden(ids(prompt, 1, device), None, Some(&mut cache));
        // The prompt's keys and values, once per row.
        for layer in &mut cache.layers {
            layer.keys = layer.keys.take().map(|k| k.repeat_dim(0, n));
            layer.values = layer.values.take().map(|v| v.repeat_dim(0, n));
        }
        let first = last_logits(model, hidden, 1)?;
        let mut rows: Vec<GroupCompletion> = (0..n)
            .map(|_| GroupCompletion {
                ids: Vec::new(),
                stopped: false,
            })
            .collect();
        let mut logits: Vec<Vec<f32>> = vec![first.into_iter().next().unwrap_or_default(); n];
        let pad = cfg.stop_tokens.first().copied().unwrap_or(0);
        for step in 0..cfg.max_new_tokens {
            let mut next = Vec::with_capacity(n);
            for (r, row) in rows.iter_mut().enumerate() {
                if row.stopped {
                    next.push(pad);
                    continue;
                }
                let token = sample_next(&logits[r], cfg, &mut rngs[r]);
                row.ids.push(token);
                row.stopped = cfg.stop_tokens.contains(&token) || stop(&row.ids);
                next.push(token);
            }
            if rows.iter().all(|r| r.stopped) || step + 1 == cfg.max_new_tokens {
                break;
            }
            let (hidden, _) = model.forward_hidden(ids(&next, n, device), None, Some(&mut cache));
            logits = last_logits(model, hidden, n)?;
        }
        Ok(rows)
    })
}

/// `ids` as `[rows, ids.len() / rows]`.
fn ids(ids: &[u32], rows: usize, device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    Tensor::from_data(TensorData::new(data, [rows, ids.len() / rows]), device)
}

/// Each row's logits at its last position.
fn last_logits(model: &Qwen3ForCausalLM, hidden: Tensor<3>, rows: usize) -> Result<Vec<Vec<f32>>> {
    let [_, t, h] = hidden.dims();
    let last = hidden.narrow(1, t - 1, 1).reshape([rows, 1, h]);
    let flat =
        model
            .lm_head(last)
            .try_into_vec_as::<f32>()
            .map_err(|e| ModelError::TensorRead {
                key: "logits".into(),
                reason: format!("{e:?}"),
            })?;
    let vocab = flat.len() / rows;
    Ok(flat.chunks(vocab).map(<[f32]>::to_vec).collect())
}
