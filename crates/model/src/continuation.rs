//! Generation that keeps its KV cache from one call to the next, for a conversation: each turn's
//! prompt is the whole conversation so far, re-rendered, and usually begins with the tokens of
//! the previous turn (its prompt and reply), whose keys and values are reused instead of being
//! computed again. Where the new prompt departs from them (a template that rewrites earlier
//! turns, as Qwen3's drops the reasoning of past replies), the cache is cut back to the common
//! head and the rest is computed.

use burn::tensor::Device;

use crate::config::RopeScaling;
use crate::error::Result;
use crate::generate::{Generation, SamplingConfig, check_prompt, run};
use crate::kv_cache::KvCache;
use crate::model::Qwen3ForCausalLM;

/// The KV cache of the tokens computed so far and those tokens.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    cache: KvCache,
    tokens: Vec<u32>,
}

/// A generation and how many of its prompt's tokens came from the cache.
#[derive(Debug, Clone)]
pub struct Continuation {
    /// The generation, as [`crate::generate`] returns it.
    pub generation: Generation,
    /// Prompt tokens whose keys and values were reused (not computed again).
    pub reused: usize,
}

impl PrefixCache {
    /// An empty cache for `model`.
    pub fn new(model: &Qwen3ForCausalLM) -> Self {
        Self {
            cache: model.new_cache(),
            tokens: Vec::new(),
        }
    }

    /// Forget every token (a new conversation).
    pub fn clear(&mut self) {
        self.cache.truncate(0);
        self.tokens.clear();
    }

    /// The tokens whose keys and values the cache holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}

/// [`crate::generate`] continuing from `prefix`: the longest common head of `prompt` and the
/// cached tokens (at most all but the prompt's last token, whose logits start the reply) is
/// reused, the rest of the prompt is computed, and afterwards `prefix` holds the prompt and the
/// reply (but its last token). With dynamic NTK RoPE, whose frequencies depend on the sequence
/// length, nothing is reused. `cfg.use_cache` must be on.
pub fn generate_continuing(
    model: &Qwen3ForCausalLM,
    prefix: &mut PrefixCache,
    prompt: &[u32],
    cfg: &SamplingConfig,
    device: &Device,
    on_token: impl FnMut(u32) + Send,
) -> Result<Continuation> {
    check_prompt(model, prompt, cfg)?;
    if !cfg.use_cache {
        return Err(crate::error::ModelError::invalid(
            "use_cache",
            "a continued generation keeps the KV cache between calls: it must be on",
        ));
    }
    let dynamic = matches!(model.config.rope_scaling, RopeScaling::Dynamic { .. });
    let common = prefix
        .tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len() - 1);
    let reused = if dynamic { 0 } else { common };
    if reused == 0 {
        prefix.cache = model.new_cache();
    } else {
        prefix.cache.truncate(reused);
    }
    prefix.tokens.truncate(reused);
    let generation =
        qwen_burn_kernels::in_pool(|| run(model, &mut prefix.cache, prompt, cfg, device, on_token));
    let generation = match generation {
        Ok(g) => g,
        Err(e) => {
            prefix.clear();
            return Err(e);
        }
    };
    prefix.tokens = prompt.to_vec();
    prefix.tokens.extend(&generation.new_token_ids);
    prefix.tokens.truncate(prefix.cache.seq_len);
    Ok(Continuation { generation, reused })
}
