//! RoPE settings in `config.json`: the 4.x `rope_scaling` dict (`type` or `rope_type`) and the
//! 5.x `rope_parameters` dict (which also carries `rope_theta`), read into [`RopeScaling`] and
//! written back in the 4.x spelling.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::RopeScaling;
use crate::error::{ModelError, Result};

/// A RoPE dict: 4.x `rope_scaling` (`type` or `rope_type`) or 5.x `rope_parameters` (which also
/// carries `rope_theta`).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RopeDict {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) rope_type: Option<String>,
    #[serde(default, rename = "type", skip_serializing)]
    pub(super) legacy_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) rope_theta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) original_max_position_embeddings: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) attention_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) beta_fast: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) beta_slow: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) mscale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) mscale_all_dim: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) truncate: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) low_freq_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) high_freq_factor: Option<f64>,
    #[serde(flatten, skip_serializing)]
    pub(super) extra: BTreeMap<String, Value>,
}

/// `(rope_theta, scaling)` of a `config.json` from either spelling (its `rope_parameters`,
/// `rope_scaling` and `rope_theta` keys); 5.x `rope_parameters` wins.
pub(super) fn rope_of(
    rope_parameters: Option<&RopeDict>,
    rope_scaling: Option<&RopeDict>,
    rope_theta: Option<f64>,
    strict: bool,
) -> Result<(f64, RopeScaling)> {
    let (field, dict) = match (rope_parameters, rope_scaling) {
        (Some(p), _) => ("rope_parameters", p),
        (None, Some(s)) => ("rope_scaling", s),
        (None, None) => return Ok((rope_theta.unwrap_or(10000.0), RopeScaling::Default)),
    };
    if strict && let Some(key) = dict.extra.keys().next() {
        return Err(ModelError::invalid(
            format!("{field}.{key}"),
            format!("unknown key `{key}`"),
        ));
    }
    let theta = dict.rope_theta.or(rope_theta).unwrap_or(10000.0);
    let rope_type = dict
        .rope_type
        .as_deref()
        .or(dict.legacy_type.as_deref())
        .unwrap_or("default");
    let factor = || {
        dict.factor.ok_or_else(|| {
            ModelError::invalid(field, format!("rope_type `{rope_type}` needs `factor`"))
        })
    };
    let scaling = match rope_type {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "dynamic" => RopeScaling::Dynamic { factor: factor()? },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: dict.original_max_position_embeddings,
            attention_factor: dict.attention_factor,
            beta_fast: dict.beta_fast.unwrap_or(32.0),
            beta_slow: dict.beta_slow.unwrap_or(1.0),
            mscale: dict.mscale,
            mscale_all_dim: dict.mscale_all_dim,
            truncate: dict.truncate.unwrap_or(true),
        },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: dict.low_freq_factor.unwrap_or(1.0),
            high_freq_factor: dict.high_freq_factor.unwrap_or(4.0),
            original_max_position_embeddings: dict.original_max_position_embeddings.ok_or_else(
                || ModelError::invalid(field, "llama3 needs `original_max_position_embeddings`"),
            )?,
        },
        other => {
            return Err(ModelError::invalid(
                "rope_type",
                format!(
                    "unknown rope_type `{other}` (expected one of default, linear, dynamic, yarn, llama3)"
                ),
            ));
        }
    };
    Ok((theta, scaling))
}

/// The 4.x `rope_scaling` dict of a scaling (`None` for plain RoPE, written as `null`).
pub(super) fn rope_dict(scaling: &RopeScaling) -> Option<RopeDict> {
    let d = |rope_type: &str| RopeDict {
        rope_type: Some(rope_type.into()),
        ..RopeDict::default()
    };
    Some(match scaling {
        RopeScaling::Default => return None,
        RopeScaling::Linear { factor } => RopeDict {
            factor: Some(*factor),
            ..d("linear")
        },
        RopeScaling::Dynamic { factor } => RopeDict {
            factor: Some(*factor),
            ..d("dynamic")
        },
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            truncate,
        } => RopeDict {
            factor: Some(*factor),
            original_max_position_embeddings: *original_max_position_embeddings,
            attention_factor: *attention_factor,
            beta_fast: Some(*beta_fast),
            beta_slow: Some(*beta_slow),
            mscale: *mscale,
            mscale_all_dim: *mscale_all_dim,
            truncate: Some(*truncate),
            ..d("yarn")
        },
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => RopeDict {
            factor: Some(*factor),
            low_freq_factor: Some(*low_freq_factor),
            high_freq_factor: Some(*high_freq_factor),
            original_max_position_embeddings: Some(*original_max_position_embeddings),
            ..d("llama3")
        },
    })
}
