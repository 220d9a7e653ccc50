//! The full causal LM: embeddings, decoder stack, final norm, LM head.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Initializer, Linear};
use burn::tensor::{Bool, DType, Device, Int, Tensor};

use crate::block::{DecoderLayer, FeedForward};
use crate::config::Qwen3Config;
use crate::documents::{DocumentMask, Documents};
use crate::kv_cache::KvCache;
use crate::loss::cross_entropy_sum;
use crate::mlp::linear;
use crate::moe::{RouterOutput, Routing, SparseMoe};
use crate::projection::{project, widened};
use crate::rms_norm::RmsNorm;
use crate::rope::{RopeTables, rope_frequencies};
use qwen_burn_kernels::{linear_cross_entropy, linear_rows_transposed, row_matmul};

/// `Qwen3Model`: everything below the LM head. Paths match the HF `model.*` keys.
#[derive(Module, Debug)]
pub struct Qwen3Model {
    /// `[vocab, hidden]`.
    pub embed_tokens: Embedding,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer>,
    /// Final RMSNorm.
    pub norm: RmsNorm,
}

/// `Qwen3ForCausalLM` / `Qwen3MoeForCausalLM`.
#[derive(Module, Debug)]
pub struct Qwen3ForCausalLM {
    /// The decoder.
    pub model: Qwen3Model,
    /// `[hidden, vocab]`; `None` when the embeddings are tied.
    pub lm_head: Option<Linear>,
    /// The architecture this module was built from.
    #[module(skip)]
    pub config: Qwen3Config,
}

/// Output of a forward pass.
#[derive(Debug, Clone)]
pub struct ModelOutput {
    /// `[b, t, vocab]` next-token logits.
    pub logits: Tensor<3>,
    /// One entry per MoE layer, in layer order (empty for dense models).
    pub routers: Vec<RouterOutput>,
}

/// What the decoder layers of one forward share: RoPE tables and the attention masks
/// ([`Qwen3ForCausalLM::embed_for_layers`]).
#[derive(Debug)]
pub struct LayerInputs<'a> {
    rope: RopeTables,
    mask: Option<Tensor<4, Bool>>,
    doc_mask: Option<DocumentMask<'a>>,
    /// Route as a training forward (MoE capacity, router-input sums): by default, whether the
    /// device records gradients.
    training: bool,
}

impl LayerInputs<'_> {
    /// Route the MoE layers as a training forward (or not) whatever the device: activation
    /// checkpointing runs the training forward without autodiff and must route as its
    /// recomputation with autodiff does.
    pub fn with_training_routing(mut self, training: bool) -> Self {
        self.training = training;
        self
    }
}

impl Qwen3ForCausalLM {
    /// A freshly initialised model (HF init: normal(0, initializer_range), norms at one).
    /// Initial values come from the device's RNG; use [`crate::init::init_weights`] for values
    /// that are identical on every device.
    pub fn new(config: &Qwen3Config, device: &Device) -> Self {
        let c = config;
        let embed_tokens = EmbeddingConfig::new(c.vocab_size, c.hidden_size)
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: c.initializer_range,
            })
            .init(device);
        Self {
            model: Qwen3Model {
                embed_tokens,
                layers: (0..c.num_hidden_layers)
                    .map(|i| DecoderLayer::new(c, i, device))
                    .collect(),
                norm: RmsNorm::new(c.hidden_size, c.rms_norm_eps, device),
            },
            lm_head: (!c.tie_word_embeddings).then(|| {
                linear(
                    c.hidden_size,
                    c.vocab_size,
                    false,
                    c.initializer_range,
                    device,
                )
            }),
            config: c.clone(),
        }
    }

    /// The architecture.
    pub fn config(&self) -> &Qwen3Config {
        &self.config
    }

    /// Full forward: logits for every position.
    ///
    /// `attention_mask` is `[b, s]` over the cached prefix plus the new tokens, `true` for real
    /// tokens and `false` for padding (HF's 1/0 mask); `None` means no padding.
    ///
    /// # Shapes
    /// - `input_ids`: `[b, t]` -> logits `[b, t, vocab]`
    pub fn forward(
        &self,
        input_ids: Tensor<2, Int>,
        attention_mask: Option<Tensor<2, Bool>>,
        cache: Option<&mut KvCache>,
    ) -> ModelOutput {
        let (hidden, routers) = self.forward_hidden(input_ids, attention_mask, cache);
        ModelOutput {
            logits: self.lm_head(hidden),
            routers,
        }
    }

    /// Forward up to the final norm (the LM head is applied separately so generation can
    /// project only the last position).
    ///
    /// # Shapes
    /// - `input_ids`: `[b, t]` -> hidden `[b, t, hidden]`
    pub fn forward_hidden(
        &self,
        input_ids: Tensor<2, Int>,
        attention_mask: Option<Tensor<2, Bool>>,
        cache: Option<&mut KvCache>,
    ) -> (Tensor<3>, Vec<RouterOutput>) {
        self.forward_hidden_inner(input_ids, attention_mask, None, cache)
    }

    /// [`Self::forward_hidden`] of packed rows: with `docs` (several documents in a row), each
    /// document attends only to itself and its RoPE positions restart at 0, so every document
    /// gets exactly the hidden states it gets alone in a row. Then `docs` alone decides what a
    /// token sees: padding must form documents of its own (the SFT rows' trailing padding does),
    /// and `attention_mask` is ignored by the attention. A layout of one document per row
    /// changes nothing.
    ///
    /// # Shapes
    /// - `input_ids`: `[b, t]`, `docs`: `[b, t]` -> hidden `[b, t, hidden]`
    pub fn forward_hidden_packed(
        &self,
        input_ids: Tensor<2, Int>,
        attention_mask: Option<Tensor<2, Bool>>,
        docs: Option<&Documents>,
    ) -> (Tensor<3>, Vec<RouterOutput>) {
        if let Some(d) = docs {
            assert_eq!(
                [d.batch_size(), d.seq_len()],
                input_ids.dims(),
                "document layout and input ids differ in shape"
            );
        }
        let docs = docs.filter(|d| !d.is_single());
        self.forward_hidden_inner(input_ids, attention_mask, docs, None)
    }

    fn forward_hidden_inner(
        &self,
        input_ids: Tensor<2, Int>,
        attention_mask: Option<Tensor<2, Bool>>,
        docs: Option<&Documents>,
        mut cache: Option<&mut KvCache>,
    ) -> (Tensor<3>, Vec<RouterOutput>) {
        let t = input_ids.dims()[1];
        let past = cache.as_ref().map_or(0, |c| c.seq_len);
        let LayerInputs {
            rope,
            mask,
            doc_mask,
            training,
        } = self.layer_inputs(&input_ids, attention_mask, docs, cache.as_deref_mut());

        // 3. Embed and run the stack.
        // Activations are f32 even when the table is stored in bf16.
        let mut x = self.embed(input_ids);
        let mut routers = Vec::new();
        for (i, layer) in self.model.layers.iter().enumerate() {
            let layer_cache = cache.as_mut().map(|c| &mut c.layers[i]);
            let (y, router) = layer.forward(
                x,
                &rope,
                mask.as_ref(),
                doc_mask.as_ref(),
                layer_cache,
                training,
            );
            x = y;
            routers.extend(router);
        }
        if let Some(c) = cache {
            c.seq_len = past + t;
        }
        (self.model.norm.forward(x), routers)
    }

    /// What every decoder layer of one forward shares: steps 1 and 2 of
    /// [`Self::forward_hidden`].
    fn layer_inputs<'a>(
        &self,
        input_ids: &Tensor<2, Int>,
        attention_mask: Option<Tensor<2, Bool>>,
        docs: Option<&'a Documents>,
        mut cache: Option<&mut KvCache>,
    ) -> LayerInputs<'a> {
        let [b, t] = input_ids.dims();
        let device = input_ids.device();
        let past = cache.as_ref().map_or(0, |c| c.seq_len);
        // 1. RoPE tables for positions past..past+t, shared by all layers; packed rows: per-row
        //    tables of the positions inside each document.
        let rope = match docs {
            Some(d) => RopeTables::for_positions(
                &rope_frequencies(&self.config, d.span()),
                d.positions(),
                b,
                t,
                &device,
            ),
            None => {
                let rope_len = match cache.as_mut() {
                    Some(c) => {
                        c.rope_seq_len = c.rope_seq_len.max(past + t);
                        c.rope_seq_len
                    }
                    None => past + t,
                };
                RopeTables::new(&rope_frequencies(&self.config, rope_len), past, t, &device)
            }
        };

        // 2. Causal + padding mask, only needed when some keys are padding; packed rows: the
        //    document layout instead.
        let doc_mask = docs.map(DocumentMask::new);
        let mask = match docs {
            Some(_) => None,
            None => attention_mask.map(|m| causal_padding_mask(m, t)),
        };

        LayerInputs {
            rope,
            mask,
            doc_mask,
            training: Routing::for_device(&device).training,
        }
    }

    /// The embedded inputs and the layers' shared inputs of a training forward, for running the
    /// stack one layer at a time ([`Self::layer`], then [`Self::final_norm`]): activation
    /// checkpointing keeps each layer's input only and recomputes the layer in the backward.
    /// `docs` as in [`Self::forward_hidden_packed`].
    ///
    /// # Shapes
    /// - `input_ids`: `[b, t]` -> `[b, t, hidden]`
    pub fn embed_for_layers<'a>(
        &self,
        input_ids: Tensor<2, Int>,
        attention_mask: Option<Tensor<2, Bool>>,
        docs: Option<&'a Documents>,
    ) -> (Tensor<3>, LayerInputs<'a>) {
        let docs = docs.filter(|d| !d.is_single());
        let inputs = self.layer_inputs(&input_ids, attention_mask, docs, None);
        (self.embed(input_ids), inputs)
    }

    /// The token embeddings, in f32 (even from a bf16 table).
    ///
    /// # Shapes
    /// - `input_ids`: `[b, t]` -> `[b, t, hidden]`
    pub fn embed(&self, input_ids: Tensor<2, Int>) -> Tensor<3> {
        widened(self.model.embed_tokens.forward(input_ids))
    }

    /// Decoder layer `i` on `x`, as inside [`Self::forward_hidden`].
    ///
    /// # Shapes
    /// - `x`: `[b, t, hidden]` -> `[b, t, hidden]`
    pub fn layer(
        &self,
        i: usize,
        x: Tensor<3>,
        inputs: &LayerInputs<'_>,
    ) -> (Tensor<3>, Option<RouterOutput>) {
        self.model.layers[i].forward(
            x,
            &inputs.rope,
            inputs.mask.as_ref(),
            inputs.doc_mask.as_ref(),
            None,
            inputs.training,
        )
    }

    /// The MoE blocks, in layer order (the order of a forward's router outputs).
    pub fn sparse_layers(&self) -> impl Iterator<Item = &SparseMoe> {
        self.model.layers.iter().filter_map(|l| match &l.mlp {
            FeedForward::Sparse(moe) => Some(moe),
            FeedForward::Dense(_) => None,
        })
    }

    /// [`Self::sparse_layers`], mutably.
    pub fn sparse_layers_mut(&mut self) -> impl Iterator<Item = &mut SparseMoe> {
        self.model
            .layers
            .iter_mut()
            .filter_map(|l| match &mut l.mlp {
                FeedForward::Sparse(moe) => Some(moe),
                FeedForward::Dense(_) => None,
            })
    }

    /// The final RMSNorm, after the last layer.
    pub fn final_norm(&self, x: Tensor<3>) -> Tensor<3> {
        self.model.norm.forward(x)
    }

    /// Project hidden states to vocabulary logits (tied: `h @ embed_tokens^T`).
    ///
    /// # Shapes
    /// - `hidden`: `[b, t, hidden]` -> `[b, t, vocab]`
    pub fn lm_head(&self, hidden: Tensor<3>) -> Tensor<3> {
        match &self.lm_head {
            Some(head) => project(head, hidden),
            None => {
                let w = self.model.embed_tokens.weight.val(); // [vocab, hidden]
                let [b, t, h] = hidden.dims();
                let v = w.dims()[0];
                // One 2-D `[b*t, h] @ [h, vocab]`: flex runs a 3-D batched matmul against the
                // transposed (strided) table 8x slower when decoding one token, 11% slower at
                // training shapes (benches/README.md).
                // Decoding one token: the multithreaded matrix-vector kernel reads the table's
                // rows directly.
                let rows = hidden.reshape([b * t, h]);
                let logits = if b * t == 1 {
                    row_matmul(rows, w.transpose())
                } else if let Some(logits) = linear_rows_transposed(&rows, &w) {
                    // Inference on Flex: the table read in place (a bf16 one not widened).
                    logits
                } else {
                    rows.matmul(widened(w).transpose())
                };
                logits.reshape([b, t, v])
            }
        }
    }

    /// Summed next-token cross-entropy of the LM head's logits over `targets` (`-100` =
    /// ignored), as [`cross_entropy_sum`] of [`Self::lm_head`]. On Flex the head and the loss run
    /// as one kernel ([`linear_cross_entropy`]) that never forms the `[b, t, vocab]` logits; a
    /// LoRA-adapted or biased head, bf16 weights and other devices take the composed path.
    ///
    /// # Shapes
    /// - `hidden`: `[b, t, hidden]`, `targets`: `[b, t]` -> `[1]`
    pub fn head_cross_entropy_sum(&self, hidden: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
        let [b, t, d] = hidden.dims();
        let rows = hidden.clone().reshape([b * t, d]);
        let flat = targets.clone().reshape([b * t]);
        let fused = match &self.lm_head {
            Some(head) if head.weight.adapter().is_none() && head.bias.is_none() => {
                linear_cross_entropy(&rows, &head.weight.val(), &flat, false)
            }
            Some(_) => None,
            None => linear_cross_entropy(&rows, &self.model.embed_tokens.weight.val(), &flat, true),
        };
        fused.unwrap_or_else(|| cross_entropy_sum(self.lm_head(hidden), targets))
    }

    /// The same model with its matrices (projections, experts, routers, embedding, LM head)
    /// stored in bf16, for inference: decoding reads half the bytes per token; the products
    /// round their inputs to bf16 and accumulate in f32 (on the bf16 kernel where the CPU has
    /// AVX512-BF16), and so do the attention's products; norms and the softmax stay f32.
    /// Logits then match HF's with bf16 weights, bf16 inputs to every `nn.Linear` and the
    /// attention's products in bf16 (`tests/bf16.rs`).
    pub fn with_bf16_weights(self) -> Self {
        self.with_matrices(DType::BF16)
    }

    /// The same model with its matrices (every 2-D parameter, LoRA factors included) cast to
    /// `dtype`, one at a time; norms and biases as they are. `with_matrices(DType::F32)` widens
    /// a bf16 LoRA base before its adapters merge (`materialize`), so that the merge is
    /// `bf16(W) + scale * A B` in f32.
    pub fn with_matrices(self, dtype: DType) -> Self {
        struct Cast(DType);
        impl burn::module::ModuleMapper for Cast {
            fn map_float<const D: usize>(
                &mut self,
                param: burn::module::Param<Tensor<D>>,
            ) -> burn::module::Param<Tensor<D>> {
                let dtype = self.0;
                if D == 2 {
                    // Detached: a cast of a tracked weight would be a graph node, not a leaf.
                    param.map(|t| {
                        if t.dtype() == dtype {
                            t
                        } else {
                            t.detach().cast(dtype)
                        }
                    })
                } else {
                    param
                }
            }
        }
        self.map(&mut Cast(dtype))
    }

    /// An empty KV cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.config.num_hidden_layers)
    }
}

/// `true` where query `i` (the last `t` of `s` positions) must not see key `j`: keys in the
/// future, or padding keys.
///
/// # Shapes
/// - `attention_mask`: `[b, s]` (true = real token) -> `[b, 1, t, s]`
fn causal_padding_mask(attention_mask: Tensor<2, Bool>, t: usize) -> Tensor<4, Bool> {
    let [b, s] = attention_mask.dims();
    let device = attention_mask.device();
    let past = (s - t) as i64;
    let rows = Tensor::<1, Int>::arange(past..past + t as i64, &device).reshape([t, 1]);
    let cols = Tensor::<1, Int>::arange(0..s as i64, &device).reshape([1, s]);
    let future = cols.expand([t, s]).greater(rows.expand([t, s])); // [t, s]
    let padding = attention_mask
        .bool_not()
        .reshape([b, 1, 1, s])
        .expand([b, 1, t, s]);
    future
        .reshape([1, 1, t, s])
        .expand([b, 1, t, s])
        .bool_or(padding)
}
