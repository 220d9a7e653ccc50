//! Key/value cache for incremental decoding.
//!
//! The cache lives outside the model and is passed into each forward call. Each layer keeps its
//! post-RoPE keys and values; a new token attends to the cached prefix instead of recomputing
//! it, so a decoding step costs work proportional to the context length.

use burn::tensor::Tensor;

/// Cached keys and values of one attention layer.
///
/// The keys and values live in buffers with room to grow along the position axis; a step writes
/// its new positions in place (`slice_assign` on a buffer nobody else holds does not copy) instead
/// of concatenating onto the whole prefix. The buffers grow by doubling.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    /// `[b, kv_heads, capacity, head_dim]` post-RoPE keys; positions `len..` are unused.
    pub keys: Option<Tensor<4>>,
    /// `[b, kv_heads, capacity, head_dim]` values.
    pub values: Option<Tensor<4>>,
    /// Positions filled.
    pub len: usize,
}

/// Positions a new cache buffer holds at least.
const MIN_CAPACITY: usize = 256;

impl LayerCache {
    /// Write this step's keys and values after the cached ones.
    ///
    /// # Shapes
    /// - `k`, `v`: `[b, kv_heads, t, head_dim]`
    pub fn append(&mut self, k: Tensor<4>, v: Tensor<4>) {
        let [b, h, t, d] = k.dims();
        let (start, end) = (self.len, self.len + t);
        self.keys = Some(write_at(self.keys.take(), k, start, [b, h, end, d]));
        self.values = Some(write_at(self.values.take(), v, start, [b, h, end, d]));
        self.len = end;
    }

    /// The filled part: keys and values `[b, kv_heads, len, head_dim]` (views of the buffers).
    pub fn views(&self) -> Option<(Tensor<4>, Tensor<4>)> {
        let (k, v) = (self.keys.as_ref()?, self.values.as_ref()?);
        Some((
            k.clone().narrow(2, 0, self.len),
            v.clone().narrow(2, 0, self.len),
        ))
    }
}

/// `new` written at positions `start..` of `buffer`, which is first grown (doubling, copying the
/// `start` filled positions once) if it cannot hold `needed[2]` positions.
fn write_at(
    buffer: Option<Tensor<4>>,
    new: Tensor<4>,
    start: usize,
    needed: [usize; 4],
) -> Tensor<4> {
    let [b, h, end, d] = needed;
    let buffer = match buffer {
        Some(buf) if buf.dims()[2] >= end => buf,
        old => {
            let capacity = end.next_power_of_two().max(MIN_CAPACITY);
            let grown = Tensor::<4>::zeros([b, h, capacity, d], &new.device());
            match old {
                Some(old) if start > 0 => {
                    grown.slice_assign([0..b, 0..h, 0..start, 0..d], old.narrow(2, 0, start))
                }
                _ => grown,
            }
        }
    };
    buffer.slice_assign([0..b, 0..h, start..end, 0..d], new)
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

    /// Keep the first `len` positions (no-op past the filled length): later appends overwrite
    /// the rest of the buffers.
    pub fn truncate(&mut self, len: usize) {
        for layer in &mut self.layers {
            layer.len = layer.len.min(len);
        }
        self.seq_len = self.seq_len.min(len);
    }
}
