//! Pre-norm decoder layer.

use burn::module::Module;
use burn::tensor::{Bool, Device, Tensor};

use crate::attention::Attention;
use crate::config::Qwen3Config;
use crate::documents::DocumentMask;
use crate::kv_cache::LayerCache;
use crate::mlp::Mlp;
use crate::moe::{RouterOutput, Routing, SparseMoe};
use crate::rms_norm::RmsNorm;
use crate::rope::RopeTables;

/// The feed-forward part of a layer: dense SwiGLU or sparse experts. Both sit at HF's `mlp.*`
/// keys (the enum variant is not part of the key).
#[derive(Module, Debug)]
pub enum FeedForward {
    /// `mlp.{gate,up,down}_proj`.
    Dense(Mlp),
    /// `mlp.gate` + `mlp.experts.{e}.{gate,up,down}_proj`.
    Sparse(SparseMoe),
}

/// `h = x + attn(norm(x)); y = h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Grouped-query self-attention.
    pub self_attn: Attention,
    /// Norm before the feed-forward.
    pub post_attention_layernorm: RmsNorm,
    /// Dense or sparse feed-forward.
    pub mlp: FeedForward,
}

impl DecoderLayer {
    /// Layer `index` of a model with config `c` (MoE or dense by HF's layer rule).
    pub fn new(c: &Qwen3Config, index: usize, device: &Device) -> Self {
        let mlp = match &c.moe {
            Some(moe) if c.is_moe_layer(index) => {
                FeedForward::Sparse(SparseMoe::new(c, moe, device))
            }
            _ => FeedForward::Dense(Mlp::new(
                c.hidden_size,
                c.intermediate_size,
                c.initializer_range,
                device,
            )),
        };
        Self {
            input_layernorm: RmsNorm::new(c.hidden_size, c.rms_norm_eps, device),
            self_attn: Attention::new(c, device),
            post_attention_layernorm: RmsNorm::new(c.hidden_size, c.rms_norm_eps, device),
            mlp,
        }
    }

    /// `training`: route as a training forward (see [`Routing`]).
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
        training: bool,
    ) -> (Tensor<3>, Option<RouterOutput>) {
        let routing = Routing {
            training,
            positions: docs.map(|d| d.documents().positions()),
        };
        let h = x.clone()
            + self
                .self_attn
                .forward(self.input_layernorm.forward(x), rope, mask, docs, cache);
        let normed = self.post_attention_layernorm.forward(h.clone());
        match &self.mlp {
            FeedForward::Dense(mlp) => (h + mlp.forward(normed), None),
            FeedForward::Sparse(moe) => {
                let (y, router) = moe.forward(normed, routing);
                (h + y, Some(router))
            }
        }
    }
}
