//! Grouped-query attention with per-head QK-norm (Qwen3Attention).

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Tensor};

use crate::config::Qwen3Config;
use crate::documents::DocumentMask;
use crate::kv_cache::LayerCache;
use crate::mlp::linear;
use crate::projection::{products_precision, project};
use crate::rms_norm::RmsNorm;
use crate::rope::RopeTables;
use qwen_burn_kernels::{causal_attention, decode_attention};

/// Self-attention of one decoder layer; parameter names are the HF keys.
#[derive(Module, Debug)]
pub struct Attention {
    /// `[hidden, heads * head_dim]`.
    pub q_proj: Linear,
    /// `[hidden, kv_heads * head_dim]`.
    pub k_proj: Linear,
    /// `[hidden, kv_heads * head_dim]`.
    pub v_proj: Linear,
    /// `[heads * head_dim, hidden]`.
    pub o_proj: Linear,
    /// RMSNorm over `head_dim`, shared by all query heads, applied before RoPE.
    pub q_norm: RmsNorm,
    /// RMSNorm over `head_dim`, shared by all key heads, applied before RoPE.
    pub k_norm: RmsNorm,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
}

impl Attention {
    /// Build with HF's normal(0, initializer_range) init.
    pub fn new(c: &Qwen3Config, device: &Device) -> Self {
        let (h, hd, std) = (c.hidden_size, c.head_dim, c.initializer_range);
        let (hq, hkv) = (c.num_attention_heads, c.num_key_value_heads);
        Self {
            q_proj: linear(h, hq * hd, c.attention_bias, std, device),
            k_proj: linear(h, hkv * hd, c.attention_bias, std, device),
            v_proj: linear(h, hkv * hd, c.attention_bias, std, device),
            o_proj: linear(hq * hd, h, c.attention_bias, std, device),
            q_norm: RmsNorm::new(hd, c.rms_norm_eps, device),
            k_norm: RmsNorm::new(hd, c.rms_norm_eps, device),
            num_heads: hq,
            num_kv_heads: hkv,
            head_dim: hd,
        }
    }

    /// Attend over the cached prefix (if any) and the new tokens.
    ///
    /// `mask` is `None` for plain causal attention, or `[b, 1, t, past + t]` with `true` where a
    /// query may NOT look (causal and padding combined by the caller). `docs` (packed rows, no
    /// cache) keeps each document to itself and replaces `mask`.
    ///
    /// # Shapes
    /// - `x`: `[b, t, hidden]` -> `[b, t, hidden]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        rope: &RopeTables,
        mask: Option<&Tensor<4, Bool>>,
        docs: Option<&DocumentMask>,
        cache: Option<&mut LayerCache>,
    ) -> Tensor<3> {
        let [b, t, _] = x.dims();
        let (hq, hkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);

        // 1. Project and split heads: [b, t, heads * hd] -> [b, heads, t, hd].
        let q = project(&self.q_proj, x.clone()).reshape([b, t, hq, hd]);
        let k = project(&self.k_proj, x.clone()).reshape([b, t, hkv, hd]);
        let v = project(&self.v_proj, x)
            .reshape([b, t, hkv, hd])
            .swap_dims(1, 2);

        // 2. QK-norm over head_dim BEFORE RoPE (Qwen3), then rotate.
        let q = rope.apply(self.q_norm.forward(q).swap_dims(1, 2));
        let k = rope.apply(self.k_norm.forward(k).swap_dims(1, 2));

        // 3. Append to the cache: keys/values become [b, hkv, past + t, hd]. Decoding one token
        //    without padding on Flex attends over the cache buffers in place (no repeat_kv).
        let scale = (hd as f64).powf(-0.5);
        let (k, v) = match cache {
            Some(cache) => {
                cache.append(k, v);
                if t == 1 && mask.is_none() {
                    let fused = match (&cache.keys, &cache.values) {
                        (Some(kb), Some(vb)) => {
                            let precision = products_precision(&self.q_proj);
                            decode_attention(&q, kb, vb, cache.len, scale as f32, precision)
                        }
                        _ => None,
                    };
                    if let Some(out) = fused {
                        return project(&self.o_proj, out.swap_dims(1, 2).reshape([b, t, hq * hd]));
                    }
                }
                cache
                    .views()
                    .expect("the cache holds the keys just appended")
            }
            None => (k, v),
        };

        // Causal attention without padding, or within packed documents, on Flex: the fused
        // kernel (GQA by index, no scores tensor; qwen_burn_kernels::causal_attention).
        if (mask.is_none() || docs.is_some())
            && let Some(out) = causal_attention(
                &q,
                &k,
                &v,
                scale as f32,
                docs.map(|d| d.starts()),
                products_precision(&self.q_proj),
            )
        {
            return project(&self.o_proj, out.swap_dims(1, 2).reshape([b, t, hq * hd]));
        }
        // Elsewhere packed documents take the equivalent block-diagonal causal mask.
        let mask = match docs {
            Some(d) => Some(d.dense(&q.device())),
            None => mask,
        };

        // 4. GQA: query head h reads kv head h / (hq / hkv) (HF repeat_kv = repeat_interleave).
        let (k, v) = (repeat_kv(k, hq / hkv), repeat_kv(v, hq / hkv));

        // 5. softmax(q k^T / sqrt(hd) + mask) v, causal aligned bottom-right for the cache.
        let options = AttentionModuleOptions {
            scale: Some(scale),
            softcap: None,
            is_causal: mask.is_none(),
        };
        let mask = mask.map(|m| {
            let [mb, _, mq, mk] = m.dims();
            m.clone().expand([mb, hq, mq, mk])
        });
        let out = attention(q, k, v, mask, None, options); // [b, hq, t, hd]

        // 6. Merge heads and project back: [b, t, hq * hd] -> [b, t, hidden].
        project(&self.o_proj, out.swap_dims(1, 2).reshape([b, t, hq * hd]))
    }
}

/// Repeat each kv head `n_rep` times along the head axis (block order, like HF `repeat_kv`).
///
/// # Shapes
/// - `x`: `[b, hkv, s, hd]` -> `[b, hkv * n_rep, s, hd]`
fn repeat_kv(x: Tensor<4>, n_rep: usize) -> Tensor<4> {
    if n_rep == 1 {
        return x;
    }
    let [b, hkv, s, hd] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .expand([b, hkv, n_rep, s, hd])
        .reshape([b, hkv * n_rep, s, hd])
}
