//! HF `generation_config.json`: the stop tokens and sampling defaults a model ships with.
//!
//! transformers' `generate` takes its eos list and its sampling parameters from this file, and
//! call arguments override them; `qwen-burn generate` does the same with its flags. Real Qwen3
//! chat checkpoints list `<|im_end|>` here (`"eos_token_id": [151645, 151643]`) while their
//! `config.json` names one id, so reading only `config.json` lets a chat model talk past its
//! turn.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::config::one_or_many;
use crate::error::{ModelError, Result};

/// HF's defaults when `do_sample` is true and a value is absent.
const HF_DEFAULT_TEMPERATURE: f32 = 1.0;
const HF_DEFAULT_TOP_K: usize = 50;

/// Keys that do not change which tokens are generated.
const BOOKKEEPING_KEYS: &[&str] = &[
    "bos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "transformers_version",
    "_from_model_config",
    "use_cache",
    "return_dict_in_generate",
    "output_scores",
    "output_logits",
];

/// The fields of `generation_config.json` that decide what is generated.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct GenerationConfig {
    /// Tokens that end a generation (one id or a list).
    #[serde(default, deserialize_with = "one_or_many")]
    pub eos_token_id: Vec<u32>,
    /// Sample (true) or decode greedily (false, HF's default).
    #[serde(default)]
    pub do_sample: bool,
    /// Softmax temperature when sampling (HF default 1.0).
    pub temperature: Option<f32>,
    /// Top-k filter when sampling (HF default 50; 0 disables it).
    pub top_k: Option<usize>,
    /// Nucleus filter when sampling (HF default 1.0, i.e. off).
    pub top_p: Option<f32>,
    /// Default length of a generation.
    pub max_new_tokens: Option<usize>,
    /// Keys we read but do not implement (e.g. `repetition_penalty`), for a warning.
    #[serde(skip)]
    pub unsupported: Vec<String>,
}

/// Sampling parameters: `temperature` 0 means greedy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set whose probability reaches p.
    pub top_p: Option<f32>,
}

/// Values of keys that HF applies by default and that leave the output unchanged.
fn is_neutral(key: &str, value: &Value) -> bool {
    match key {
        "num_beams" | "num_return_sequences" => value.as_u64() == Some(1),
        "repetition_penalty" | "length_penalty" => value.as_f64() == Some(1.0),
        "no_repeat_ngram_size" => value.as_u64() == Some(0),
        _ => value.is_null(),
    }
}

impl GenerationConfig {
    /// Read `generation_config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io("read", path, e))?;
        let parse_err = |reason: String| ModelError::ConfigParse {
            path: path.to_path_buf(),
            reason,
        };
        let value: Value = serde_json::from_str(&text).map_err(|e| parse_err(e.to_string()))?;
        let mut config: Self =
            serde_json::from_value(value.clone()).map_err(|e| parse_err(e.to_string()))?;
        if let Some(obj) = value.as_object() {
            const READ: &[&str] = &[
                "eos_token_id",
                "do_sample",
                "temperature",
                "top_k",
                "top_p",
                "max_new_tokens",
            ];
            config.validate().map_err(|e| match e {
                ModelError::InvalidConfig { field, reason } => ModelError::InvalidConfig {
                    field,
                    reason: format!("{reason} (in {})", path.display()),
                },
                other => other,
            })?;
            config.unsupported = obj
                .iter()
                .filter(|(k, v)| {
                    !READ.contains(&k.as_str())
                        && !BOOKKEEPING_KEYS.contains(&k.as_str())
                        && !is_neutral(k, v)
                })
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
        }
        Ok(config)
    }

    /// The checks of HF's `GenerationConfig.validate` and its logits warpers on the values we
    /// read: a finite temperature, strictly positive when sampling (HF refuses 0 and asks for
    /// `do_sample = false` instead); `top_p` in (0, 1]. `top_k = 0` is allowed: no top-k filter.
    fn validate(&self) -> Result<()> {
        if let Some(t) = self.temperature {
            let ok = t.is_finite() && if self.do_sample { t > 0.0 } else { t >= 0.0 };
            if !ok {
                return Err(ModelError::invalid(
                    "temperature",
                    format!(
                        "must be a finite number > 0 when do_sample is true (for greedy \
                         decoding set do_sample = false), found {t}"
                    ),
                ));
            }
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(ModelError::invalid(
                "top_p",
                format!("must be in (0, 1], found {p}"),
            ));
        }
        Ok(())
    }

    /// `generation_config.json` in `dir`, if there is one.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("generation_config.json");
        if path.is_file() {
            Self::from_file(&path).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The sampling parameters this file asks for, with HF's defaults: greedy unless
    /// `do_sample`; when sampling, temperature 1.0 and top-k 50 unless given.
    pub fn sampling(&self) -> SamplingDefaults {
        if !self.do_sample {
            return SamplingDefaults {
                temperature: 0.0,
                top_k: None,
                top_p: None,
            };
        }
        SamplingDefaults {
            temperature: self.temperature.unwrap_or(HF_DEFAULT_TEMPERATURE),
            top_k: match self.top_k.unwrap_or(HF_DEFAULT_TOP_K) {
                0 => None,
                k => Some(k),
            },
            top_p: self.top_p.filter(|&p| p < 1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> GenerationConfig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("generation_config.json");
        std::fs::write(&path, json).unwrap();
        GenerationConfig::from_file(&path).unwrap()
    }

    #[test]
    fn qwen3_chat_generation_config() {
        // Qwen3-0.6B's generation_config.json, verbatim.
        let g = read(
            r#"{"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
                "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                "transformers_version": "4.51.0"}"#,
        );
        assert_eq!(g.eos_token_id, vec![151645, 151643]);
        assert_eq!(
            g.sampling(),
            SamplingDefaults {
                temperature: 0.6,
                top_k: Some(20),
                top_p: Some(0.95)
            }
        );
        assert!(g.unsupported.is_empty());
    }

    #[test]
    fn out_of_range_values_are_refused_naming_the_field_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("generation_config.json");
        for (json, field) in [
            (r#"{"do_sample": true, "temperature": -1.0}"#, "temperature"),
            (r#"{"do_sample": true, "temperature": 0.0}"#, "temperature"),
            (r#"{"do_sample": true, "top_p": 1.5}"#, "top_p"),
            (r#"{"do_sample": true, "top_p": -0.1}"#, "top_p"),
            (r#"{"top_p": 0.0}"#, "top_p"),
        ] {
            std::fs::write(&path, json).unwrap();
            let e = GenerationConfig::from_file(&path).unwrap_err().to_string();
            assert!(
                e.contains(field) && e.contains("generation_config.json"),
                "{json}: {e}"
            );
        }
        // top_k = 0 is HF's "no top-k filter".
        let g = read(r#"{"do_sample": true, "top_k": 0}"#);
        assert_eq!(g.sampling().top_k, None);
    }

    #[test]
    fn hf_defaults_and_unsupported_keys() {
        let g = read(r#"{"eos_token_id": 7}"#);
        assert_eq!(g.eos_token_id, vec![7]);
        assert_eq!(g.sampling().temperature, 0.0, "greedy unless do_sample");
        let g = read(r#"{"do_sample": true, "repetition_penalty": 1.1, "num_beams": 1}"#);
        assert_eq!(
            g.sampling(),
            SamplingDefaults {
                temperature: 1.0,
                top_k: Some(50),
                top_p: None
            }
        );
        assert_eq!(g.unsupported, vec!["repetition_penalty = 1.1"]);
    }
}
