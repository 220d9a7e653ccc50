//! `config.json` as HF transformers reads and writes it, by serde derive: [`HfConfig`] has one
//! optional field per key we use (4.x and 5.x spellings side by side), known bookkeeping keys
//! as ignored values, and everything else in a flattened `extra` map, which strict mode (our own
//! TOML `[model]` tables) requires to be empty. [`HfConfig::into_config`] applies HF's defaults
//! and turns it into the typed [`Qwen3Config`]; [`HfConfig::from_config`] is the way back.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::rope_json::{RopeDict, rope_dict, rope_of};
use super::{BalanceLoss, ModelType, MoeConfig, Qwen3Config};
use crate::error::{ModelError, Result};

/// An HF token-id field: one id, a list of ids, or `null`.
pub(crate) fn one_or_many<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
        Null(()),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(x) => vec![x],
        OneOrMany::Many(v) => v,
        OneOrMany::Null(()) => Vec::new(),
    })
}

fn eos_out<S: serde::Serializer>(ids: &[u32], s: S) -> std::result::Result<S::Ok, S::Error> {
    match ids {
        [one] => s.serialize_u32(*one),
        many => many.serialize(s),
    }
}

macro_rules! hf_config {
    ($($(#[$m:meta])* $name:ident: $ty:ty,)*) => {
        /// The keys of an HF Qwen3 / Qwen3-MoE `config.json` (see the module docs).
        #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
        pub(crate) struct HfConfig {
            $(
                $(#[$m])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $name: Option<$ty>,
            )*
            /// One id or a list.
            #[serde(
                default,
                deserialize_with = "one_or_many",
                serialize_with = "eos_out",
                skip_serializing_if = "Vec::is_empty"
            )]
            pub eos_token_id: Vec<u32>,
            /// Keys we do not know.
            #[serde(flatten, skip_serializing)]
            pub extra: BTreeMap<String, Value>,
        }
    };
}

hf_config! {
    architectures: Value,
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
    max_position_embeddings: usize,
    rms_norm_eps: f64,
    rope_theta: f64,
    rope_scaling: RopeDict,
    rope_parameters: RopeDict,
    tie_word_embeddings: bool,
    attention_bias: bool,
    attention_dropout: f64,
    hidden_act: String,
    initializer_range: f64,
    bos_token_id: u32,
    pad_token_id: u32,
    use_sliding_window: bool,
    sliding_window: Value,
    max_window_layers: Value,
    layer_types: Value,
    use_cache: Value,
    torch_dtype: Value,
    dtype: Value,
    transformers_version: Value,
    num_experts: usize,
    num_local_experts: usize,
    num_experts_per_tok: usize,
    moe_intermediate_size: usize,
    norm_topk_prob: bool,
    router_aux_loss_coef: f64,
    output_router_logits: bool,
    decoder_sparse_step: usize,
    mlp_only_layers: Vec<usize>,
    router_z_loss_coef: f64,
    router_bias_update_rate: f64,
    router_capacity_factor: f64,
    router_centering: bool,
    router_assignment_loss_coef: f64,
    router_aux_loss_type: String,
}

impl HfConfig {
    /// Deserialise a JSON object; a type error names the key (`rope_scaling.factor`).
    pub(crate) fn from_json(value: &Value) -> Result<Self> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let reason = e.into_inner().to_string();
            ModelError::invalid(if path == "." { "config".into() } else { path }, reason)
        })
    }

    /// Keys set only on `qwen3_moe`.
    fn moe_keys_set(&self) -> Vec<&'static str> {
        [
            ("num_experts", self.num_experts.is_some()),
            ("num_local_experts", self.num_local_experts.is_some()),
            ("num_experts_per_tok", self.num_experts_per_tok.is_some()),
            (
                "moe_intermediate_size",
                self.moe_intermediate_size.is_some(),
            ),
            ("norm_topk_prob", self.norm_topk_prob.is_some()),
            ("router_aux_loss_coef", self.router_aux_loss_coef.is_some()),
            ("output_router_logits", self.output_router_logits.is_some()),
            ("decoder_sparse_step", self.decoder_sparse_step.is_some()),
            ("mlp_only_layers", self.mlp_only_layers.is_some()),
            ("router_z_loss_coef", self.router_z_loss_coef.is_some()),
            (
                "router_bias_update_rate",
                self.router_bias_update_rate.is_some(),
            ),
            (
                "router_capacity_factor",
                self.router_capacity_factor.is_some(),
            ),
            ("router_centering", self.router_centering.is_some()),
            (
                "router_assignment_loss_coef",
                self.router_assignment_loss_coef.is_some(),
            ),
            ("router_aux_loss_type", self.router_aux_loss_type.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect()
    }

    /// Apply HF's defaults and build the typed config. `strict`: unknown keys and keys the
    /// model type does not read are errors (our TOML configs); otherwise they are ignored, as
    /// transformers does with `config.json`.
    pub(crate) fn into_config(self, strict: bool) -> Result<Qwen3Config> {
        if strict && let Some(key) = self.extra.keys().next() {
            return Err(ModelError::invalid(
                key.clone(),
                format!("unknown key `{key}`"),
            ));
        }
        let model_type = match self.model_type.as_deref().unwrap_or("qwen3") {
            "qwen3" => ModelType::Qwen3,
            "qwen3_moe" => ModelType::Qwen3Moe,
            other => {
                return Err(ModelError::invalid(
                    "model_type",
                    format!("`{other}` is not supported (expected `qwen3` or `qwen3_moe`)"),
                ));
            }
        };
        if strict {
            // HF bookkeeping that transformers writes into config.json and that changes nothing
            // about the model built here: in a run config it would be a setting that is
            // silently ignored.
            let written = [
                ("architectures", self.architectures.is_some()),
                ("torch_dtype", self.torch_dtype.is_some()),
                ("dtype", self.dtype.is_some()),
                ("transformers_version", self.transformers_version.is_some()),
                ("use_cache", self.use_cache.is_some()),
                ("sliding_window", self.sliding_window.is_some()),
                ("max_window_layers", self.max_window_layers.is_some()),
                ("layer_types", self.layer_types.is_some()),
            ];
            if let Some((key, _)) = written.iter().find(|(_, set)| *set) {
                return Err(ModelError::invalid(
                    *key,
                    "has no effect in a run config (it is HF bookkeeping: qwen-burn trains in                      f32, names the architecture from model_type, and has no sliding window);                      remove it",
                ));
            }
        }
        if strict
            && model_type == ModelType::Qwen3
            && let Some(key) = self.moe_keys_set().first()
        {
            return Err(ModelError::invalid(
                *key,
                "is a Qwen3-MoE setting but model_type is `qwen3` (dense); set \
                 model_type = \"qwen3_moe\" or remove it",
            ));
        }
        if let Some(act) = &self.hidden_act
            && act != "silu"
        {
            return Err(ModelError::invalid(
                "hidden_act",
                format!("`{act}` is not supported (expected `silu`)"),
            ));
        }
        if self.use_sliding_window == Some(true) {
            return Err(ModelError::invalid(
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        if self.attention_dropout.unwrap_or(0.0) != 0.0 {
            return Err(ModelError::invalid(
                "attention_dropout",
                "attention dropout is not supported (expected 0.0)",
            ));
        }
        let required = |v: Option<usize>, key: &'static str| {
            v.ok_or_else(|| ModelError::invalid(key, "required field is missing"))
        };
        let hidden_size = required(self.hidden_size, "hidden_size")?;
        let num_attention_heads = required(self.num_attention_heads, "num_attention_heads")?;
        let head_dim = self
            .head_dim
            .unwrap_or_else(|| hidden_size.checked_div(num_attention_heads).unwrap_or(0));
        let (rope_theta, rope_scaling) = rope_of(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
            strict,
        )?;
        let moe = match model_type {
            ModelType::Qwen3 => None,
            ModelType::Qwen3Moe => Some(self.moe(strict)?),
        };
        Ok(Qwen3Config {
            model_type,
            vocab_size: required(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: required(self.intermediate_size, "intermediate_size")?,
            num_hidden_layers: required(self.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(32768),
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            attention_bias: self.attention_bias.unwrap_or(false),
            initializer_range: self.initializer_range.unwrap_or(0.02),
            bos_token_id: self.bos_token_id,
            eos_token_id: self.eos_token_id,
            pad_token_id: self.pad_token_id,
            moe,
        })
    }

    fn moe(&self, strict: bool) -> Result<MoeConfig> {
        let moe = MoeConfig {
            num_experts: self.num_experts.or(self.num_local_experts).unwrap_or(128),
            num_experts_per_tok: self.num_experts_per_tok.unwrap_or(8),
            moe_intermediate_size: self.moe_intermediate_size.unwrap_or(768),
            norm_topk_prob: self.norm_topk_prob.unwrap_or(false),
            router_aux_loss_coef: self.router_aux_loss_coef.unwrap_or(0.001),
            output_router_logits: self.output_router_logits.unwrap_or(false),
            decoder_sparse_step: self.decoder_sparse_step.unwrap_or(1),
            mlp_only_layers: self.mlp_only_layers.clone().unwrap_or_default(),
            router_z_loss_coef: self.router_z_loss_coef.unwrap_or(0.0),
            router_bias_update_rate: self.router_bias_update_rate.unwrap_or(0.0),
            router_capacity_factor: self.router_capacity_factor.unwrap_or(0.0),
            router_centering: self.router_centering.unwrap_or(false),
            router_assignment_loss_coef: self.router_assignment_loss_coef.unwrap_or(0.0),
            router_aux_loss_type: match self.router_aux_loss_type.as_deref() {
                None => BalanceLoss::Hf,
                Some(s) => BalanceLoss::parse(s).ok_or_else(|| {
                    ModelError::invalid(
                        "router_aux_loss_type",
                        format!("unknown `{s}` (expected hf, per_layer, sequence or global_batch)"),
                    )
                })?,
            },
        };
        if strict && !moe.output_router_logits {
            // HF adds the router losses only with output_router_logits; a coefficient the user
            // wrote would otherwise do nothing.
            let written_aux = self.router_aux_loss_coef.unwrap_or(0.0);
            for (key, coef) in [
                ("router_aux_loss_coef", written_aux),
                ("router_z_loss_coef", moe.router_z_loss_coef),
                (
                    "router_assignment_loss_coef",
                    moe.router_assignment_loss_coef,
                ),
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
        Ok(moe)
    }

    /// The `config.json` we write: the 4.x spelling that published checkpoints use (both
    /// transformers generations read it), our extra MoE keys only when they are not off.
    pub(crate) fn from_config(c: &Qwen3Config) -> Self {
        let moe = c.moe.as_ref();
        HfConfig {
            architectures: Some(serde_json::json!([c.model_type.architecture()])),
            model_type: Some(c.model_type.as_str().into()),
            vocab_size: Some(c.vocab_size),
            hidden_size: Some(c.hidden_size),
            intermediate_size: Some(c.intermediate_size),
            num_hidden_layers: Some(c.num_hidden_layers),
            num_attention_heads: Some(c.num_attention_heads),
            num_key_value_heads: Some(c.num_key_value_heads),
            head_dim: Some(c.head_dim),
            max_position_embeddings: Some(c.max_position_embeddings),
            rms_norm_eps: Some(c.rms_norm_eps),
            rope_theta: Some(c.rope_theta),
            rope_scaling: rope_dict(&c.rope_scaling),
            tie_word_embeddings: Some(c.tie_word_embeddings),
            attention_bias: Some(c.attention_bias),
            attention_dropout: Some(0.0),
            hidden_act: Some("silu".into()),
            initializer_range: Some(c.initializer_range),
            bos_token_id: c.bos_token_id,
            eos_token_id: c.eos_token_id.clone(),
            pad_token_id: c.pad_token_id,
            use_sliding_window: Some(false),
            use_cache: Some(Value::Bool(true)),
            torch_dtype: Some(Value::String("float32".into())),
            num_experts: moe.map(|m| m.num_experts),
            num_experts_per_tok: moe.map(|m| m.num_experts_per_tok),
            moe_intermediate_size: moe.map(|m| m.moe_intermediate_size),
            norm_topk_prob: moe.map(|m| m.norm_topk_prob),
            router_aux_loss_coef: moe.map(|m| m.router_aux_loss_coef),
            output_router_logits: moe.map(|m| m.output_router_logits),
            decoder_sparse_step: moe.map(|m| m.decoder_sparse_step),
            mlp_only_layers: moe.map(|m| m.mlp_only_layers.clone()),
            router_z_loss_coef: moe.map(|m| m.router_z_loss_coef).filter(|&x| x > 0.0),
            router_bias_update_rate: moe.map(|m| m.router_bias_update_rate).filter(|&x| x > 0.0),
            router_capacity_factor: moe.map(|m| m.router_capacity_factor).filter(|&x| x > 0.0),
            router_centering: moe.map(|m| m.router_centering).filter(|&on| on),
            router_assignment_loss_coef: moe
                .map(|m| m.router_assignment_loss_coef)
                .filter(|&x| x > 0.0),
            router_aux_loss_type: moe
                .map(|m| m.router_aux_loss_type)
                .filter(|&t| t != BalanceLoss::Hf)
                .map(|t| t.as_str().into()),
            ..HfConfig::default()
        }
    }
}
