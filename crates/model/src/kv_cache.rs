//! Key/value cache for incremental decoding.
//!
//! The cache lives outside the model and is passed into each forward call. Each layer keeps its
//! post-RoPE keys and values; a new token attends to the cached prefix instead of recomputing
//! it, so a decoding step costs work proportional to the context length.

use burn::tensor::Tensor;

/// Cached keys and values of one attention layer.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    /// `[b, kv_heads, past, head_dim]` post-RoPE keys.
    pub keys: Option<Tensor<4>>,
    /// `[b, kv_heads, past, head_dim]` values.
    pub values: Option<Tensor<4>>,
}

impl LayerCache {
    /// Append this step's keys and values and return the full (past + new) tensors.
    ///
    /// # Shapes
    /// - `k`, `v`: `[b, kv_heads, t, head_dim]` -> `[b, kv_heads, past + t, head_dim]`
    pub fn append(&mut self, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let keys = match self.keys.take() {
            Some(past) => Tensor::cat(vec![past, k], 2),
            None => k,
        };
        let values = match self.values.take() {
            Some(past) => Tensor::cat(vec![past, v], 2),
            None => v,
        };
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        (keys, values)
    }
}

/// Cache of every layer plus the position bookkeeping of the sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// One entry per decoder layer.
    pub layers: Vec<LayerCache>,
    /// Tokens already in the cache (the position of the next token).
    pub seq_len: usize,
    /// Largest sequence length seen, for dynamic NTK (HF only grows its frequencies within a
    /// generation, `dynamic_rope_update`).
    pub rope_seq_len: usize,
}

impl KvCache {
    /// An empty cache for a model with `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![LayerCache::default(); num_layers],
            seq_len: 0,
            rope_seq_len: 0,
        }
    }
}
