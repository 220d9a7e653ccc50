//! Model configuration in HF `config.json` terms.
//!
//! [`Qwen3Config`] reads the `config.json` of `model_type` `qwen3` and `qwen3_moe` in both the
//! transformers 4.x spelling (`rope_theta` + `rope_scaling`) and the 5.x spelling
//! (`rope_parameters`), and writes the 4.x spelling that published hub checkpoints use (both
//! transformers generations read it). The same parser reads the `[model]` table of our own TOML
//! run configs in strict mode, where an unknown key is an error.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{ModelError, Result};

/// Which HF architecture a config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    /// `qwen3`: every layer has a dense SwiGLU MLP.
    Qwen3,
    /// `qwen3_moe`: layers chosen by `decoder_sparse_step` / `mlp_only_layers` use sparse experts.
    Qwen3Moe,
}

impl ModelType {
    /// The HF `model_type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3_moe",
        }
    }

    /// The HF `architectures` entry.
    pub fn architecture(self) -> &'static str {
        match self {
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Qwen3Moe => "Qwen3MoeForCausalLM",
        }
    }
}

/// RoPE frequency scaling, as HF's `modeling_rope_utils.py` defines it.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Position interpolation: `inv_freq / factor`.
    Linear {
        /// Interpolation factor.
        factor: f64,
    },
    /// Dynamic NTK: the base grows once the sequence exceeds `max_position_embeddings`.
    Dynamic {
        /// Scaling factor.
        factor: f64,
    },
    /// YaRN: NTK-by-parts frequencies plus an attention (mscale) factor on cos and sin.
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// Training context of the unscaled model (defaults to `max_position_embeddings`).
        original_max_position_embeddings: Option<usize>,
        /// Explicit attention factor; else derived from `mscale` or `0.1 ln(factor) + 1`.
        attention_factor: Option<f64>,
        /// High-frequency boundary in rotations (HF default 32).
        beta_fast: f64,
        /// Low-frequency boundary in rotations (HF default 1).
        beta_slow: f64,
        /// DeepSeek-style mscale numerator.
        mscale: Option<f64>,
        /// DeepSeek-style mscale denominator.
        mscale_all_dim: Option<f64>,
        /// Round the correction range to whole dimensions (HF default true).
        truncate: bool,
    },
    /// Llama 3.1 frequency-band scaling.
    Llama3 {
        /// Scaling factor.
        factor: f64,
        /// Low-frequency band boundary.
        low_freq_factor: f64,
        /// High-frequency band boundary.
        high_freq_factor: f64,
        /// Training context of the unscaled model.
        original_max_position_embeddings: usize,
    },
}

/// Mixture-of-Experts settings (`qwen3_moe` only).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Number of routed experts `E`.
    pub num_experts: usize,
    /// Experts per token (top-k).
    pub num_experts_per_tok: usize,
    /// SwiGLU inner size of each expert.
    pub moe_intermediate_size: usize,
    /// Renormalise the k selected probabilities to sum to one.
    pub norm_topk_prob: bool,
    /// Weight of the load-balancing loss in the training loss.
    pub router_aux_loss_coef: f64,
    /// As in HF: the router losses (load balancing, and our z-loss) are added to the training
    /// loss only when this is true. When false they are still measured and logged.
    pub output_router_logits: bool,
    /// Layer `i` is sparse iff `(i + 1) % decoder_sparse_step == 0` and `i` is not in `mlp_only_layers`.
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP.
    pub mlp_only_layers: Vec<usize>,
    /// Router z-loss weight (ST-MoE); not part of HF Qwen3-MoE, 0 disables it.
    pub router_z_loss_coef: f64,
    /// Aux-loss-free balancing (DeepSeek-V3): per-expert routing bias update rate; 0 disables it.
    pub router_bias_update_rate: f64,
    /// Which load-balancing loss `router_aux_loss_coef` weighs (not an HF key; `hf` when absent).
    pub router_aux_loss_type: BalanceLoss,
}

/// The load-balancing loss of a MoE model (`router_aux_loss_type`). `f_e` is the fraction of
/// tokens whose top-k includes expert `e` (so `sum_e f_e = k`) and `P_e` the mean router
/// probability of `e`; see `moe.rs` for the formulas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BalanceLoss {
    /// HF `load_balancing_loss_func`: `E * sum_e f_e * P_e` over the tokens of all MoE layers
    /// pooled together. Balanced value `k`. A layer that overloads one expert can be offset by
    /// another that overloads a different one.
    #[default]
    Hf,
    /// Switch / GShard: `E * sum_e f_e * P_e` per MoE layer, averaged over layers. Balanced `k`.
    PerLayer,
    /// DeepSeek-V3's sequence-wise loss: `sum_e f'_e * P_e` per sequence and layer with
    /// `f'_e = E / k * f_e`, averaged over sequences and layers. Balanced value `1`.
    Sequence,
    /// Qwen's global-batch loss (Qiu et al., 2025): as `per_layer`, but `f_e` counted over every
    /// micro-batch and data-parallel replica of the optimizer step. Balanced `k`.
    GlobalBatch,
}

impl BalanceLoss {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BalanceLoss::Hf => "hf",
            BalanceLoss::PerLayer => "per_layer",
            BalanceLoss::Sequence => "sequence",
            BalanceLoss::GlobalBatch => "global_batch",
        }
    }

    /// Parse the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [
            BalanceLoss::Hf,
            BalanceLoss::PerLayer,
            BalanceLoss::Sequence,
            BalanceLoss::GlobalBatch,
        ]
        .into_iter()
        .find(|b| b.as_str() == s)
    }

    /// The loss of a perfectly balanced router.
    pub fn balanced_value(self, top_k: usize) -> f64 {
        match self {
            BalanceLoss::Sequence => 1.0,
            _ => top_k as f64,
        }
    }
}

/// A Qwen3 / Qwen3-MoE configuration with HF field names.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    /// `qwen3` or `qwen3_moe`.
    pub model_type: ModelType,
    /// Embedding rows.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Dense SwiGLU inner size.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Per-head width; explicit in Qwen3 and not necessarily `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    /// Context the model was trained for (also the dynamic-NTK threshold).
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE scaling variant.
    pub rope_scaling: RopeScaling,
    /// Share the embedding matrix with the LM head.
    pub tie_word_embeddings: bool,
    /// Bias on q, k, v and o projections.
    pub attention_bias: bool,
    /// Std of the normal init of linear and embedding weights.
    pub initializer_range: f64,
    /// Beginning-of-sequence token.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token(s).
    pub eos_token_id: Vec<u32>,
    /// Padding token.
    pub pad_token_id: Option<u32>,
    /// MoE settings, `Some` iff `model_type` is `qwen3_moe`.
    pub moe: Option<MoeConfig>,
}

/// Keys we read, plus HF bookkeeping keys that carry no model semantics.
const KNOWN_KEYS: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "tie_word_embeddings",
    "attention_bias",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "hidden_act",
    "attention_dropout",
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "layer_types",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "router_aux_loss_coef",
    "output_router_logits",
    "decoder_sparse_step",
    "mlp_only_layers",
    "router_z_loss_coef",
    "router_bias_update_rate",
    "router_aux_loss_type",
    "architectures",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "use_cache",
];

/// Keys that only `qwen3_moe` reads; in strict mode they are an error on a dense `qwen3`.
const MOE_ONLY_KEYS: &[&str] = &[
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "router_aux_loss_coef",
    "output_router_logits",
    "decoder_sparse_step",
    "mlp_only_layers",
    "router_z_loss_coef",
    "router_bias_update_rate",
    "router_aux_loss_type",
];

/// Typed accessors over a JSON object that name the field in every error.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &'static str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                ModelError::invalid(key, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    fn req_usize(&self, key: &'static str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| ModelError::invalid(key, "required field is missing"))
    }

    fn f64(&self, key: &'static str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| ModelError::invalid(key, format!("expected a number, found {v}"))),
        }
    }

    fn bool(&self, key: &'static str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                ModelError::invalid(key, format!("expected true or false, found {v}"))
            }),
        }
    }

    fn str(&self, key: &'static str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| ModelError::invalid(key, format!("expected a string, found {v}"))),
        }
    }

    fn token_ids(&self, key: &'static str) -> Result<Vec<u32>> {
        let bad = || ModelError::invalid(key, "expected a token id or a list of token ids");
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().map(|x| x as u32).ok_or_else(bad))
                .collect(),
            Some(v) => v.as_u64().map(|x| vec![x as u32]).ok_or_else(bad),
        }
    }
}

impl Qwen3Config {
    /// Read an HF `config.json` (unknown keys are ignored, as transformers does).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io("read", path, e))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| ModelError::ConfigParse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::from_json(&value, false).map_err(|e| match e {
            ModelError::InvalidConfig { field, reason } => ModelError::InvalidConfig {
                field,
                reason: format!("{reason} (in {})", path.display()),
            },
            other => other,
        })
    }

    /// Parse a JSON object in HF terms and validate it. With `strict`, keys we do not know are
    /// an error (used for our own TOML configs, where a typo must not be silently ignored).
    pub fn from_json(value: &Value, strict: bool) -> Result<Self> {
        let obj = value
            .as_object()
            .ok_or_else(|| ModelError::invalid("config", "expected a JSON object"))?;
        if strict && let Some(key) = obj.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(ModelError::InvalidConfig {
                field: "config",
                reason: format!("unknown key `{key}`"),
            });
        }
        let f = Fields { obj };
        let model_type = match f.str("model_type")?.unwrap_or("qwen3") {
            "qwen3" => ModelType::Qwen3,
            "qwen3_moe" => ModelType::Qwen3Moe,
            other => {
                return Err(ModelError::invalid(
                    "model_type",
                    format!("`{other}` is not supported (expected `qwen3` or `qwen3_moe`)"),
                ));
            }
        };
        if strict
            && model_type == ModelType::Qwen3
            && let Some(key) = MOE_ONLY_KEYS.iter().find(|k| f.get(k).is_some())
        {
            return Err(ModelError::invalid(
                key,
                "is a Qwen3-MoE setting but model_type is `qwen3` (dense); set \
                 model_type = \"qwen3_moe\" or remove it",
            ));
        }
        if let Some(act) = f.str("hidden_act")?
            && act != "silu"
        {
            return Err(ModelError::invalid(
                "hidden_act",
                format!("`{act}` is not supported (expected `silu`)"),
            ));
        }
        if f.bool("use_sliding_window")?.unwrap_or(false) {
            return Err(ModelError::invalid(
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        if f.f64("attention_dropout")?.unwrap_or(0.0) != 0.0 {
            return Err(ModelError::invalid(
                "attention_dropout",
                "attention dropout is not supported (expected 0.0)",
            ));
        }
        let hidden_size = f.req_usize("hidden_size")?;
        let num_attention_heads = f.req_usize("num_attention_heads")?;
        let head_dim = match f.usize("head_dim")? {
            Some(h) => h,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        let (rope_theta, rope_scaling) = parse_rope(&f)?;
        let moe = match model_type {
            ModelType::Qwen3 => None,
            ModelType::Qwen3Moe => Some(MoeConfig {
                num_experts: match f.usize("num_experts")? {
                    Some(n) => n,
                    None => f.usize("num_local_experts")?.unwrap_or(128),
                },
                num_experts_per_tok: f.usize("num_experts_per_tok")?.unwrap_or(8),
                moe_intermediate_size: f.usize("moe_intermediate_size")?.unwrap_or(768),
                norm_topk_prob: f.bool("norm_topk_prob")?.unwrap_or(false),
                router_aux_loss_coef: f.f64("router_aux_loss_coef")?.unwrap_or(0.001),
                output_router_logits: f.bool("output_router_logits")?.unwrap_or(false),
                decoder_sparse_step: f.usize("decoder_sparse_step")?.unwrap_or(1),
                mlp_only_layers: match f.get("mlp_only_layers") {
                    None => Vec::new(),
                    Some(v) => v
                        .as_array()
                        .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect())
                        .ok_or_else(|| {
                            ModelError::invalid(
                                "mlp_only_layers",
                                "expected a list of layer indices",
                            )
                        })?,
                },
                router_z_loss_coef: f.f64("router_z_loss_coef")?.unwrap_or(0.0),
                router_bias_update_rate: f.f64("router_bias_update_rate")?.unwrap_or(0.0),
                router_aux_loss_type: match f.str("router_aux_loss_type")? {
                    None => BalanceLoss::Hf,
                    Some(s) => BalanceLoss::parse(s).ok_or_else(|| {
                        ModelError::invalid(
                            "router_aux_loss_type",
                            format!(
                                "unknown `{s}` (expected hf, per_layer, sequence or global_batch)"
                            ),
                        )
                    })?,
                },
            }),
        };
        if strict
            && let Some(moe) = &moe
            && !moe.output_router_logits
        {
            // HF adds the router losses only with output_router_logits; a coefficient the user
            // wrote would otherwise do nothing.
            let aux_written = f.get("router_aux_loss_coef").is_some();
            for (key, coef) in [
                (
                    "router_aux_loss_coef",
                    if aux_written {
                        moe.router_aux_loss_coef
                    } else {
                        0.0
                    },
                ),
                ("router_z_loss_coef", moe.router_z_loss_coef),
            ] {
                if coef > 0.0 {
                    return Err(ModelError::invalid(
                        key,
                        format!(
                            "= {coef} has no effect while output_router_logits is false: as in HF, \
                             router losses are added to the training loss only when \
                             output_router_logits = true; set it, or set {key} = 0"
                        ),
                    ));
                }
            }
        }
        let config = Self {
            model_type,
            vocab_size: f.req_usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.req_usize("intermediate_size")?,
            num_hidden_layers: f.req_usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: f
                .usize("num_key_value_heads")?
                .unwrap_or(num_attention_heads),
            head_dim,
            max_position_embeddings: f.usize("max_position_embeddings")?.unwrap_or(32768),
            rms_norm_eps: f.f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: f.bool("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: f.bool("attention_bias")?.unwrap_or(false),
            initializer_range: f.f64("initializer_range")?.unwrap_or(0.02),
            bos_token_id: f.usize("bos_token_id")?.map(|x| x as u32),
            eos_token_id: f.token_ids("eos_token_id")?,
            pad_token_id: f.usize("pad_token_id")?.map(|x| x as u32),
            moe,
        };
        config.validate()?;
        Ok(config)
    }

    /// Check every rule the model relies on; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(ModelError::invalid(field, "must be greater than 0"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(ModelError::invalid(
                "num_key_value_heads",
                format!(
                    "num_attention_heads ({}) must be divisible by num_key_value_heads ({})",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ModelError::invalid(
                "head_dim",
                format!(
                    "must be even for rotary embeddings, found {}",
                    self.head_dim
                ),
            ));
        }
        if not_positive(self.rms_norm_eps) {
            return Err(ModelError::invalid(
                "rms_norm_eps",
                "must be greater than 0",
            ));
        }
        if not_positive(self.rope_theta) {
            return Err(ModelError::invalid("rope_theta", "must be greater than 0"));
        }
        let factor = match &self.rope_scaling {
            RopeScaling::Default => 1.0,
            RopeScaling::Linear { factor }
            | RopeScaling::Dynamic { factor }
            | RopeScaling::Yarn { factor, .. }
            | RopeScaling::Llama3 { factor, .. } => *factor,
        };
        if not_positive(factor) {
            return Err(ModelError::invalid(
                "rope_scaling",
                format!("factor must be greater than 0, found {factor}"),
            ));
        }
        if let RopeScaling::Llama3 {
            low_freq_factor,
            high_freq_factor,
            ..
        } = &self.rope_scaling
            && not_positive(high_freq_factor - low_freq_factor)
        {
            return Err(ModelError::invalid(
                "rope_scaling",
                "llama3 needs high_freq_factor > low_freq_factor",
            ));
        }
        if let Some(moe) = &self.moe {
            if moe.num_experts == 0 {
                return Err(ModelError::invalid("num_experts", "must be greater than 0"));
            }
            if moe.num_experts_per_tok == 0 || moe.num_experts_per_tok > moe.num_experts {
                return Err(ModelError::invalid(
                    "num_experts_per_tok",
                    format!(
                        "must be in 1..={} (num_experts), found {}",
                        moe.num_experts, moe.num_experts_per_tok
                    ),
                ));
            }
            if moe.moe_intermediate_size == 0 {
                return Err(ModelError::invalid(
                    "moe_intermediate_size",
                    "must be greater than 0",
                ));
            }
            if moe.decoder_sparse_step == 0 {
                return Err(ModelError::invalid(
                    "decoder_sparse_step",
                    "must be at least 1",
                ));
            }
            if let Some(bad) = moe
                .mlp_only_layers
                .iter()
                .find(|&&l| l >= self.num_hidden_layers)
            {
                return Err(ModelError::invalid(
                    "mlp_only_layers",
                    format!(
                        "layer {bad} does not exist (num_hidden_layers = {})",
                        self.num_hidden_layers
                    ),
                ));
            }
            if moe.router_aux_loss_coef < 0.0
                || moe.router_z_loss_coef < 0.0
                || moe.router_bias_update_rate < 0.0
            {
                return Err(ModelError::invalid(
                    "router_aux_loss_coef",
                    "router coefficients and rates must be non-negative",
                ));
            }
        }
        Ok(())
    }

    /// Whether decoder layer `layer` uses the sparse MoE block (HF `Qwen3MoeDecoderLayer` rule).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        match &self.moe {
            None => false,
            Some(moe) => {
                !moe.mlp_only_layers.contains(&layer)
                    && moe.num_experts > 0
                    && (layer + 1).is_multiple_of(moe.decoder_sparse_step)
            }
        }
    }

    /// Indices of the MoE layers.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.num_hidden_layers)
            .filter(|&l| self.is_moe_layer(l))
            .collect()
    }

    /// The HF `config.json` object (transformers 4.x spelling, read by 4.x and 5.x).
    pub fn to_hf_json(&self) -> Value {
        let mut obj = json!({
            "architectures": [self.model_type.architecture()],
            "model_type": self.model_type.as_str(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling_json(&self.rope_scaling),
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": self.initializer_range,
            "use_sliding_window": false,
            "use_cache": true,
            "torch_dtype": "float32",
        });
        let map = obj.as_object_mut().expect("json! object");
        if let Some(bos) = self.bos_token_id {
            map.insert("bos_token_id".into(), json!(bos));
        }
        match self.eos_token_id.as_slice() {
            [] => {}
            [one] => {
                map.insert("eos_token_id".into(), json!(one));
            }
            many => {
                map.insert("eos_token_id".into(), json!(many));
            }
        }
        if let Some(pad) = self.pad_token_id {
            map.insert("pad_token_id".into(), json!(pad));
        }
        if let Some(moe) = &self.moe {
            map.insert("num_experts".into(), json!(moe.num_experts));
            map.insert("num_experts_per_tok".into(), json!(moe.num_experts_per_tok));
            map.insert(
                "moe_intermediate_size".into(),
                json!(moe.moe_intermediate_size),
            );
            map.insert("norm_topk_prob".into(), json!(moe.norm_topk_prob));
            map.insert(
                "router_aux_loss_coef".into(),
                json!(moe.router_aux_loss_coef),
            );
            map.insert(
                "output_router_logits".into(),
                json!(moe.output_router_logits),
            );
            map.insert("decoder_sparse_step".into(), json!(moe.decoder_sparse_step));
            map.insert("mlp_only_layers".into(), json!(moe.mlp_only_layers));
            if moe.router_z_loss_coef > 0.0 {
                map.insert("router_z_loss_coef".into(), json!(moe.router_z_loss_coef));
            }
            if moe.router_aux_loss_type != BalanceLoss::Hf {
                map.insert(
                    "router_aux_loss_type".into(),
                    json!(moe.router_aux_loss_type.as_str()),
                );
            }
            if moe.router_bias_update_rate > 0.0 {
                map.insert(
                    "router_bias_update_rate".into(),
                    json!(moe.router_bias_update_rate),
                );
            }
        }
        obj
    }

    /// Write `config.json` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join("config.json");
        let text = serde_json::to_string_pretty(&self.to_hf_json()).expect("config serialises");
        std::fs::write(&path, text).map_err(|e| ModelError::io("write", path, e))
    }

    /// Parameters of the model (embeddings and LM head counted once when tied).
    pub fn num_params(&self) -> usize {
        let (h, hd) = (self.hidden_size, self.head_dim);
        let (hq, hkv) = (self.num_attention_heads, self.num_key_value_heads);
        let bias = |n: usize| if self.attention_bias { n } else { 0 };
        let attn = h * hq * hd
            + 2 * h * hkv * hd
            + hq * hd * h
            + bias(hq * hd + 2 * hkv * hd + h)
            + 2 * hd;
        let mut total = self.vocab_size * h + h;
        if !self.tie_word_embeddings {
            total += self.vocab_size * h;
        }
        for layer in 0..self.num_hidden_layers {
            total += attn + 2 * h + self.ffn_params(layer, false);
        }
        total
    }

    /// Parameters a token passes through (MoE counts only the top-k experts and the router);
    /// the input embedding is excluded, the LM head included, as in the 6N FLOPs rule.
    pub fn active_params_per_token(&self) -> usize {
        let (h, hd) = (self.hidden_size, self.head_dim);
        let (hq, hkv) = (self.num_attention_heads, self.num_key_value_heads);
        let attn = h * hq * hd + 2 * h * hkv * hd + hq * hd * h;
        let mut total = self.vocab_size * h;
        for layer in 0..self.num_hidden_layers {
            total += attn + self.ffn_params(layer, true);
        }
        total
    }

    fn ffn_params(&self, layer: usize, active_only: bool) -> usize {
        let h = self.hidden_size;
        match &self.moe {
            Some(moe) if self.is_moe_layer(layer) => {
                let experts = if active_only {
                    moe.num_experts_per_tok
                } else {
                    moe.num_experts
                };
                h * moe.num_experts + experts * 3 * h * moe.moe_intermediate_size
            }
            _ => 3 * h * self.intermediate_size,
        }
    }

    /// Forward FLOPs per token of attention score and value products at context `seq_len`
    /// (PaLM appendix B: `2 * layers * seq * heads * head_dim * 2`, causal halving not applied).
    pub fn attention_flops_per_token(&self, seq_len: usize) -> usize {
        4 * self.num_hidden_layers * seq_len * self.num_attention_heads * self.head_dim
    }
}

/// True for zero, negative and NaN values.
fn not_positive(x: f64) -> bool {
    x.is_nan() || x <= 0.0
}

fn parse_rope(f: &Fields<'_>) -> Result<(f64, RopeScaling)> {
    // transformers 5.x folds the base into `rope_parameters`; 4.x has `rope_theta` + `rope_scaling`.
    let params = f.get("rope_parameters");
    let scaling = f.get("rope_scaling");
    let dict = match (params, scaling) {
        (Some(p), _) => Some(("rope_parameters", p)),
        (None, Some(s)) => Some(("rope_scaling", s)),
        (None, None) => None,
    };
    let mut theta = f.f64("rope_theta")?;
    let scaling = match dict {
        None => RopeScaling::Default,
        Some((field, value)) => {
            let obj = value.as_object().ok_or_else(|| {
                ModelError::invalid(field, format!("expected an object, found {value}"))
            })?;
            let d = Fields { obj };
            if let Some(t) = d.f64("rope_theta")? {
                theta = Some(t);
            }
            let rope_type = match d.str("rope_type")? {
                Some(t) => t,
                None => d.str("type")?.unwrap_or("default"),
            };
            let factor = || -> Result<f64> {
                d.f64("factor")?.ok_or_else(|| {
                    ModelError::invalid(field, format!("rope_type `{rope_type}` needs `factor`"))
                })
            };
            match rope_type {
                "default" => RopeScaling::Default,
                "linear" => RopeScaling::Linear { factor: factor()? },
                "dynamic" => RopeScaling::Dynamic { factor: factor()? },
                "yarn" => RopeScaling::Yarn {
                    factor: factor()?,
                    original_max_position_embeddings: d
                        .usize("original_max_position_embeddings")?,
                    attention_factor: d.f64("attention_factor")?,
                    beta_fast: d.f64("beta_fast")?.unwrap_or(32.0),
                    beta_slow: d.f64("beta_slow")?.unwrap_or(1.0),
                    mscale: d.f64("mscale")?,
                    mscale_all_dim: d.f64("mscale_all_dim")?,
                    truncate: d.bool("truncate")?.unwrap_or(true),
                },
                "llama3" => RopeScaling::Llama3 {
                    factor: factor()?,
                    low_freq_factor: d.f64("low_freq_factor")?.unwrap_or(1.0),
                    high_freq_factor: d.f64("high_freq_factor")?.unwrap_or(4.0),
                    original_max_position_embeddings: d
                        .usize("original_max_position_embeddings")?
                        .ok_or_else(|| {
                            ModelError::invalid(
                                field,
                                "llama3 needs `original_max_position_embeddings`",
                            )
                        })?,
                },
                other => {
                    return Err(ModelError::invalid(
                        "rope_type",
                        format!(
                            "unknown rope_type `{other}` (expected one of default, linear, dynamic, yarn, llama3)"
                        ),
                    ));
                }
            }
        }
    };
    Ok((theta.unwrap_or(10000.0), scaling))
}

fn rope_scaling_json(scaling: &RopeScaling) -> Value {
    match scaling {
        RopeScaling::Default => Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Dynamic { factor } => json!({"rope_type": "dynamic", "factor": factor}),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            truncate,
        } => {
            let mut v = json!({
                "rope_type": "yarn", "factor": factor, "beta_fast": beta_fast,
                "beta_slow": beta_slow, "truncate": truncate,
            });
            let m = v.as_object_mut().expect("object");
            if let Some(x) = original_max_position_embeddings {
                m.insert("original_max_position_embeddings".into(), json!(x));
            }
            if let Some(x) = attention_factor {
                m.insert("attention_factor".into(), json!(x));
            }
            if let Some(x) = mscale {
                m.insert("mscale".into(), json!(x));
            }
            if let Some(x) = mscale_all_dim {
                m.insert("mscale_all_dim".into(), json!(x));
            }
            v
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => json!({
            "rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({
            "model_type": "qwen3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6,
        })
    }

    fn err_of(mut patch: impl FnMut(&mut Map<String, Value>)) -> String {
        let mut v = base();
        patch(v.as_object_mut().unwrap());
        Qwen3Config::from_json(&v, true).unwrap_err().to_string()
    }

    #[test]
    fn reads_both_rope_spellings() {
        let mut v4 = base();
        v4["rope_theta"] = json!(1e6);
        v4["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
        let mut v5 = base();
        v5["rope_parameters"] = json!({"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0});
        let a = Qwen3Config::from_json(&v4, true).unwrap();
        let b = Qwen3Config::from_json(&v5, true).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rope_theta, 1e6);
        assert_eq!(a.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        // What we write reads back identically.
        assert_eq!(Qwen3Config::from_json(&a.to_hf_json(), true).unwrap(), a);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = err_of(|m| {
            m.insert("num_key_value_heads".into(), json!(3));
        });
        assert!(
            e.contains("num_key_value_heads") && e.contains("divisible"),
            "{e}"
        );
        let e = err_of(|m| {
            m.insert("head_dim".into(), json!(7));
        });
        assert!(e.contains("head_dim") && e.contains("even"), "{e}");
        let e = err_of(|m| {
            m.insert(
                "rope_scaling".into(),
                json!({"rope_type": "wavy", "factor": 2.0}),
            );
        });
        assert!(e.contains("rope_type") && e.contains("wavy"), "{e}");
        let e = err_of(|m| {
            m.insert("hiden_size".into(), json!(3));
        });
        assert!(e.contains("unknown key `hiden_size`"), "{e}");
        let e = err_of(|m| {
            m.insert("hidden_size".into(), json!("wide"));
        });
        assert!(e.contains("hidden_size") && e.contains("integer"), "{e}");
    }

    #[test]
    fn moe_layer_rule_matches_hf() {
        let mut v = base();
        v["model_type"] = json!("qwen3_moe");
        v["num_hidden_layers"] = json!(4);
        v["num_experts"] = json!(4);
        v["num_experts_per_tok"] = json!(2);
        v["decoder_sparse_step"] = json!(2);
        v["mlp_only_layers"] = json!([3]);
        let c = Qwen3Config::from_json(&v, true).unwrap();
        assert_eq!(c.moe_layers(), vec![1]);
    }

    #[test]
    fn moe_keys_on_a_dense_model_are_refused_in_strict_mode() {
        for key in MOE_ONLY_KEYS {
            let e = err_of(|m| {
                m.insert(key.to_string(), json!(1));
            });
            assert!(e.contains(key) && e.contains("qwen3_moe"), "{key}: {e}");
        }
        // An HF config.json (lenient) is read as transformers reads it.
        let mut v = base();
        v["num_experts"] = json!(8);
        assert!(Qwen3Config::from_json(&v, false).unwrap().moe.is_none());
    }

    #[test]
    fn router_loss_coefficients_need_output_router_logits_in_strict_mode() {
        let mut v = base();
        v["model_type"] = json!("qwen3_moe");
        v["num_experts"] = json!(4);
        v["num_experts_per_tok"] = json!(2);
        for key in ["router_aux_loss_coef", "router_z_loss_coef"] {
            let mut w = v.clone();
            w[key] = json!(0.01);
            let e = Qwen3Config::from_json(&w, true).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("output_router_logits"), "{e}");
            w["output_router_logits"] = json!(true);
            Qwen3Config::from_json(&w, true).unwrap();
            // HF files with output_router_logits = false (as published Qwen3-MoE configs) load.
            w["output_router_logits"] = json!(false);
            let c = Qwen3Config::from_json(&w, false).unwrap();
            assert!(!c.moe.unwrap().output_router_logits);
        }
        // The HF default coefficient (not written) is not an error.
        Qwen3Config::from_json(&v, true).unwrap();
    }
}
