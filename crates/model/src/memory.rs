//! Memory bounds checked before allocating: what a model's parameters (and, for training, its
//! gradients, optimizer state and activations) will take, against what the machine has.
//!
//! A config is a few bytes that can ask for terabytes (`num_hidden_layers = 1000000000`). The
//! estimate is computed in `u128` from the config alone, so it cannot overflow, and the model is
//! refused before any tensor exists, with the config fields that make it large. The limit is
//! `QWEN_BURN_MEMORY_LIMIT` when set (bytes, or with a `KiB`/`MiB`/`GiB`/`TiB` suffix), else
//! the `MemAvailable` figure of `/proc/meminfo`; where neither exists, nothing is refused.

use crate::config::Qwen3Config;
use crate::error::{ModelError, Result};

/// The environment variable that sets the memory limit.
pub const MEMORY_LIMIT_ENV: &str = "QWEN_BURN_MEMORY_LIMIT";

/// Bytes of one f32 value.
const F32: u128 = 4;

/// One term of an estimate: its bytes and the config fields it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// Estimated bytes.
    pub bytes: u128,
    /// What it is, naming the fields: `"embeddings (vocab_size x hidden_size)"`.
    pub what: String,
}

/// An estimate of the memory something will take, as the sum of its parts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Estimate {
    /// The terms.
    pub parts: Vec<Part>,
}

impl Estimate {
    /// Add a term.
    pub fn push(&mut self, bytes: u128, what: impl Into<String>) {
        self.parts.push(Part {
            bytes,
            what: what.into(),
        });
    }

    /// The total in bytes.
    pub fn total(&self) -> u128 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    /// Refuse with [`ModelError::TooLarge`] when the total exceeds the limit.
    pub fn check(&self, what: &str) -> Result<()> {
        let Some((available, source)) = memory_limit()? else {
            return Ok(());
        };
        let need = self.total();
        if need <= u128::from(available) {
            return Ok(());
        }
        let mut parts = self.parts.clone();
        parts.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        // The terms that matter: the three largest, leaving out any under 1% of the total.
        let parts = parts
            .iter()
            .take(3)
            .filter(|p| p.bytes >= need / 100)
            .map(|p| format!("{} {}", human(p.bytes), p.what))
            .collect::<Vec<_>>()
            .join(", ");
        Err(ModelError::TooLarge {
            what: what.to_string(),
            need: human(need),
            available: human(u128::from(available)),
            limit_source: source,
            parts,
        })
    }
}

/// Bytes in human units (`3.2 TiB`).
pub fn human(bytes: u128) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Parse `123`, `64GiB`, `512 MiB`, `1.5TiB` (binary units; `K`/`M`/`G`/`T` and `KB`.. are
/// read as the same binary units).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = number * scale;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// The memory limit and where it comes from, if one is known.
pub fn memory_limit() -> Result<Option<(u64, String)>> {
    if let Ok(text) = std::env::var(MEMORY_LIMIT_ENV) {
        return match parse_bytes(&text) {
            Some(bytes) => Ok(Some((bytes, format!("{MEMORY_LIMIT_ENV}={text}")))),
            None => Err(ModelError::InvalidInput(format!(
                "{MEMORY_LIMIT_ENV}={text}: expected bytes, e.g. 64GiB or 68719476736"
            ))),
        };
    }
    Ok(mem_available().map(|b| (b, "MemAvailable in /proc/meminfo".to_string())))
}

/// `MemAvailable` of `/proc/meminfo` in bytes (Linux only).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl Qwen3Config {
    /// Parameter bytes (f32), by part, each naming the config fields it grows with. Computed in
    /// `u128`: no config can overflow it.
    pub fn parameter_estimate(&self) -> Estimate {
        let n = |x: usize| x as u128;
        let (h, hd) = (n(self.hidden_size), n(self.head_dim));
        let (hq, hkv) = (n(self.num_attention_heads), n(self.num_key_value_heads));
        let layers = n(self.num_hidden_layers);
        let mut estimate = Estimate::default();
        let embedding = n(self.vocab_size) * h * F32;
        estimate.push(embedding, "embeddings (vocab_size x hidden_size)");
        if !self.tie_word_embeddings {
            estimate.push(embedding, "LM head (vocab_size x hidden_size, untied)");
        }
        let attention = (2 * hq * hd * h + 2 * hkv * hd * h) * F32;
        estimate.push(
            layers * attention,
            "attention (num_hidden_layers x hidden_size x head_dim x heads)",
        );
        let moe_layers = n(self.moe_layers_count());
        let dense_layers = layers - moe_layers;
        estimate.push(
            dense_layers * 3 * h * n(self.intermediate_size) * F32,
            "dense MLPs (num_hidden_layers x hidden_size x intermediate_size)",
        );
        if let Some(moe) = &self.moe {
            estimate.push(
                moe_layers * n(moe.num_experts) * (3 * h * n(moe.moe_intermediate_size) + h) * F32,
                "experts (MoE layers x num_experts x hidden_size x moe_intermediate_size)",
            );
        }
        estimate.push(
            layers * 4 * h * F32,
            "norms (num_hidden_layers x hidden_size)",
        );
        estimate
    }

    /// The number of MoE layers, without building the list (`num_hidden_layers` may be huge).
    fn moe_layers_count(&self) -> usize {
        let Some(moe) = &self.moe else {
            return 0;
        };
        let step = moe.decoder_sparse_step.max(1);
        let stepped = self.num_hidden_layers / step;
        let excluded = moe
            .mlp_only_layers
            .iter()
            .filter(|&&l| l < self.num_hidden_layers && (l + 1).is_multiple_of(step))
            .count();
        stepped.saturating_sub(excluded)
    }

    /// Refuse a model whose parameters alone exceed the memory limit, naming the fields.
    pub fn check_fits_in_memory(&self, what: &str) -> Result<()> {
        self.parameter_estimate().check(what)
    }

    /// The memory of one forward without gradients over `rows` rows of `tokens` tokens that
    /// keeps every position's logits (scoring): the parameters, the logits and their
    /// log-probabilities (`rows x tokens x vocab_size`, twice), and one layer's activations at a
    /// time. `shape` names the options that set `rows x tokens` (`--batch-size x --context`).
    pub fn forward_estimate(&self, rows: usize, tokens: usize, shape: &str) -> Estimate {
        let n = |x: usize| x as u128;
        let mut estimate = self.parameter_estimate();
        let positions = n(rows) * n(tokens);
        estimate.push(
            2 * positions * n(self.vocab_size) * F32,
            format!("logits and log-probabilities ({shape} x vocab_size, twice)"),
        );
        let (h, hd) = (n(self.hidden_size), n(self.head_dim));
        let (hq, hkv) = (n(self.num_attention_heads), n(self.num_key_value_heads));
        let inner = match &self.moe {
            Some(moe) => n(moe.num_experts_per_tok) * n(moe.moe_intermediate_size),
            None => n(self.intermediate_size),
        };
        estimate.push(
            positions * (5 * h + 2 * hq * hd + 2 * hkv * hd + 3 * inner) * F32,
            format!("one layer's activations ({shape} x hidden sizes)"),
        );
        estimate
    }
}

impl Qwen3Config {
    /// The memory of a generation's prefill over a prompt of `tokens` tokens: the parameters,
    /// the KV cache that holds them (every layer's keys and values, in a buffer of the next power
    /// of two positions) and one layer's activations over the prompt. The new tokens are not
    /// counted: `max_new_tokens` is a bound the cache grows towards, not a size reserved.
    /// `shape` names what sets `tokens` (`the prompt`, `the conversation`).
    pub fn generation_estimate(&self, tokens: usize, shape: &str) -> Estimate {
        let n = |x: usize| x as u128;
        let mut estimate = self.parameter_estimate();
        let capacity = n(tokens).max(1).next_power_of_two().max(256);
        estimate.push(
            2 * n(self.num_hidden_layers)
                * n(self.num_key_value_heads)
                * n(self.head_dim)
                * capacity
                * F32,
            format!(
                "KV cache ({shape}'s tokens x num_hidden_layers x num_key_value_heads x head_dim, \
                 keys and values)"
            ),
        );
        let activations = self.forward_estimate(1, tokens, shape).parts.pop();
        if let Some(part) = activations {
            estimate.parts.push(part);
        }
        estimate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("123"), Some(123));
        assert_eq!(parse_bytes("64GiB"), Some(64 << 30));
        assert_eq!(parse_bytes("512 MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("1.5k"), Some(1536));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_bytes("1e30"), None);
        assert_eq!(human(3 << 40), "3.0 TiB");
    }

    fn config(json: serde_json::Value) -> Qwen3Config {
        Qwen3Config::from_json(&json, false).unwrap()
    }

    #[test]
    fn the_estimate_counts_what_num_params_counts() {
        for json in [
            serde_json::json!({"vocab_size": 100, "hidden_size": 16, "intermediate_size": 40,
                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8, "tie_word_embeddings": true}),
            serde_json::json!({"model_type": "qwen3_moe", "vocab_size": 100, "hidden_size": 16,
                "intermediate_size": 40, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "num_experts": 6,
                "num_experts_per_tok": 2, "moe_intermediate_size": 12, "decoder_sparse_step": 2,
                "mlp_only_layers": [3]}),
        ] {
            let c = config(json);
            let counted = c.num_params() as u128 * 4;
            let estimated = c.parameter_estimate().total();
            // The estimate leaves out the q/k norms (2 x head_dim per layer) and counts four
            // hidden-size vectors per layer for the norms: within 1% here.
            let diff = counted.abs_diff(estimated) as f64 / counted as f64;
            assert!(diff < 0.01, "counted {counted}, estimated {estimated}");
        }
    }

    #[test]
    fn a_billion_layers_is_refused_naming_the_field_without_allocating() {
        let c = config(serde_json::json!({"vocab_size": 100, "hidden_size": 1024,
            "intermediate_size": 3072, "num_hidden_layers": 1_000_000_000u64,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}));
        let e = Estimate {
            parts: c.parameter_estimate().parts,
        };
        assert!(e.total() > 1u128 << 50, "{}", e.total());
        let err = match memory_limit().unwrap() {
            Some(_) => e.check("the model").unwrap_err().to_string(),
            None => return,
        };
        assert!(err.contains("num_hidden_layers"), "{err}");
        assert!(err.contains("PiB"), "{err}");
    }
}
