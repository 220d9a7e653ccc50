//! Model configuration in HF `config.json` terms.
//!
//! [`Qwen3Config`] reads the `config.json` of `model_type` `qwen3` and `qwen3_moe` in both the
//! transformers 4.x spelling (`rope_theta` + `rope_scaling`) and the 5.x spelling
//! (`rope_parameters`), and writes the 4.x spelling that published hub checkpoints use (both
//! transformers generations read it). The same parser reads the `[model]` table of our own TOML
//! run configs in strict mode, where an unknown key is an error.

use std::path::Path;

use serde_json::Value;

use crate::error::{ModelError, Result};

mod hf;
mod moe;
mod rope_json;
use hf::HfConfig;
pub(crate) use hf::one_or_many;
pub use moe::{BalanceLoss, MoeConfig};

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
        if !value.is_object() {
            return Err(ModelError::invalid("config", "expected a JSON object"));
        }
        let config = HfConfig::from_json(value)?.into_config(strict)?;
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
        if let Some((field, value)) = self.first_non_finite() {
            return Err(ModelError::invalid(
                field,
                format!("{value} is not allowed (expected a finite number)"),
            ));
        }
        if self.initializer_range < 0.0 {
            return Err(ModelError::invalid(
                "initializer_range",
                format!("must be >= 0, found {}", self.initializer_range),
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
            let cf = moe.router_capacity_factor;
            if !(cf == 0.0 || (cf.is_finite() && cf >= 1.0)) {
                return Err(ModelError::invalid(
                    "router_capacity_factor",
                    format!(
                        "{cf} (expected 0 for no capacity, or a factor of at least 1 so that every \
                         token finds its {} experts)",
                        moe.num_experts_per_tok
                    ),
                ));
            }
            if moe.router_assignment_loss_coef > 0.0 && moe.router_capacity_factor == 0.0 {
                return Err(ModelError::invalid(
                    "router_assignment_loss_coef",
                    format!(
                        "{} needs a training-time capacity (router_capacity_factor >= 1): the loss's \
                         target is the capped assignment",
                        moe.router_assignment_loss_coef
                    ),
                ));
            }
            if moe.router_aux_loss_coef < 0.0
                || moe.router_z_loss_coef < 0.0
                || moe.router_bias_update_rate < 0.0
                || moe.router_assignment_loss_coef < 0.0
            {
                return Err(ModelError::invalid(
                    "router_aux_loss_coef",
                    "router coefficients and rates must be non-negative (router_aux_loss_coef, \
                     router_z_loss_coef, router_bias_update_rate, router_assignment_loss_coef)",
                ));
            }
        }
        Ok(())
    }

    /// The first float setting that is NaN or infinite, as `(field, value)`.
    fn first_non_finite(&self) -> Option<(&'static str, f64)> {
        let mut values = vec![
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
            ("initializer_range", self.initializer_range),
        ];
        match &self.rope_scaling {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor } => {
                values.push(("rope_scaling.factor", *factor));
            }
            RopeScaling::Yarn {
                factor,
                attention_factor,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                ..
            } => {
                values.extend([
                    ("rope_scaling.factor", *factor),
                    ("rope_scaling.beta_fast", *beta_fast),
                    ("rope_scaling.beta_slow", *beta_slow),
                ]);
                let optional = [
                    ("rope_scaling.attention_factor", attention_factor),
                    ("rope_scaling.mscale", mscale),
                    ("rope_scaling.mscale_all_dim", mscale_all_dim),
                ];
                values.extend(optional.iter().filter_map(|(k, v)| v.map(|v| (*k, v))));
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                ..
            } => values.extend([
                ("rope_scaling.factor", *factor),
                ("rope_scaling.low_freq_factor", *low_freq_factor),
                ("rope_scaling.high_freq_factor", *high_freq_factor),
            ]),
        }
        if let Some(moe) = &self.moe {
            values.extend([
                ("router_aux_loss_coef", moe.router_aux_loss_coef),
                ("router_z_loss_coef", moe.router_z_loss_coef),
                ("router_bias_update_rate", moe.router_bias_update_rate),
                ("router_capacity_factor", moe.router_capacity_factor),
                (
                    "router_assignment_loss_coef",
                    moe.router_assignment_loss_coef,
                ),
            ]);
        }
        values.into_iter().find(|(_, v)| !v.is_finite())
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
        serde_json::to_value(HfConfig::from_config(self)).expect("config serialises")
    }

    /// Write `config.json` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join("config.json");
        let text = serde_json::to_string_pretty(&self.to_hf_json()).expect("config serialises");
        // Through a temporary file renamed into place: a reader never sees half a config.
        let tmp = dir.join(format!("config.json.tmp.{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            ModelError::io("write", &tmp, e)
        })?;
        std::fs::rename(&tmp, &path).map_err(|e| ModelError::io("rename", path, e))
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

#[cfg(test)]
mod tests;
