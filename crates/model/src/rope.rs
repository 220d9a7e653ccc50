//! Rotary position embeddings with HF's rotate-half layout and its scaling variants.
//!
//! Frequencies follow `transformers.modeling_rope_utils` step by step in f32 (the reference
//! computes them in f32 too), so the tables agree with HF to the last bit or one ulp. The
//! tables are built on the host for the positions of each forward call (a few kB) and
//! uploaded once per forward; every layer shares them.

use burn::tensor::{Device, Tensor, TensorData};

use crate::config::{Qwen3Config, RopeScaling};

/// Inverse frequencies and the cos/sin multiplier for one forward call.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeFrequencies {
    /// `head_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's mscale; 1 otherwise).
    pub attention_factor: f32,
}

/// Plain RoPE frequencies `1 / base^(2i/d)`, as `_compute_default_rope_parameters`.
fn default_inv_freq(base: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / dim as f32;
            1.0f32 / (base as f32).powf(exponent)
        })
        .collect()
}

/// The frequencies HF uses for a forward whose largest position is `seq_len - 1`.
/// `seq_len` only matters for dynamic NTK.
pub fn rope_frequencies(config: &Qwen3Config, seq_len: usize) -> RopeFrequencies {
    let dim = config.head_dim;
    let base = config.rope_theta;
    let plain = |inv_freq| RopeFrequencies {
        inv_freq,
        attention_factor: 1.0,
    };
    match &config.rope_scaling {
        RopeScaling::Default => plain(default_inv_freq(base, dim)),
        RopeScaling::Linear { factor } => plain(
            default_inv_freq(base, dim)
                .into_iter()
                .map(|f| f / *factor as f32)
                .collect(),
        ),
        RopeScaling::Dynamic { factor } => {
            // `_compute_dynamic_ntk_parameters`: the base grows with the sequence once it is
            // longer than max_position_embeddings.
            let max_pos = config.max_position_embeddings as f64;
            let seq = (seq_len as f64).max(max_pos);
            let base = base
                * ((factor * seq / max_pos) - (factor - 1.0)).powf(dim as f64 / (dim as f64 - 2.0));
            plain(default_inv_freq(base, dim))
        }
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
            let factor = *factor;
            let original =
                original_max_position_embeddings.unwrap_or(config.max_position_embeddings) as f64;
            let get_mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let attention_factor = match (attention_factor, mscale, mscale_all_dim) {
                (Some(a), _, _) => *a,
                (None, Some(m), Some(mad)) if *m != 0.0 && *mad != 0.0 => {
                    get_mscale(factor, *m) / get_mscale(factor, *mad)
                }
                _ => get_mscale(factor, 1.0),
            };
            let correction_dim = |rotations: f64| {
                (dim as f64 * (original / (rotations * 2.0 * std::f64::consts::PI)).ln())
                    / (2.0 * base.ln())
            };
            let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
            if *truncate {
                low = low.floor();
                high = high.ceil();
            }
            let low = low.max(0.0) as f32;
            let mut high = high.min(dim as f64 - 1.0) as f32;
            if low == high {
                high += 0.001;
            }
            let inv_freq = (0..dim / 2)
                .map(|i| {
                    let pos_freq = (base as f32).powf((2 * i) as f32 / dim as f32);
                    let extrapolation = 1.0f32 / pos_freq;
                    let interpolation = 1.0f32 / (factor as f32 * pos_freq);
                    let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation_factor = 1.0 - ramp;
                    interpolation * (1.0 - extrapolation_factor)
                        + extrapolation * extrapolation_factor
                })
                .collect();
            RopeFrequencies {
                inv_freq,
                attention_factor: attention_factor as f32,
            }
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, low, high) = (
                *factor as f32,
                *low_freq_factor as f32,
                *high_freq_factor as f32,
            );
            let old_context = *original_max_position_embeddings as f32;
            let low_freq_wavelen = old_context / low;
            let high_freq_wavelen = old_context / high;
            let inv_freq = default_inv_freq(base, dim)
                .into_iter()
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    let scaled = if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        f
                    };
                    let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    if medium {
                        let smooth = (old_context / wavelen - low) / (high - low);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                })
                .collect();
            plain(inv_freq)
        }
    }
}

/// cos and sin tables for the positions of one forward call.
#[derive(Debug, Clone)]
pub struct RopeTables {
    /// `[rows, 1, t, head_dim]`, already multiplied by the attention factor; `rows` is 1 when
    /// every batch row has the same positions, else the batch size.
    pub cos: Tensor<4>,
    /// Same shape as `cos`.
    pub sin: Tensor<4>,
}

/// `emb = cat(freqs, freqs)` at `pos`, as HF, times the attention factor.
fn push_position(freqs: &RopeFrequencies, pos: f32, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    for _ in 0..2 {
        for &f in &freqs.inv_freq {
            let angle = pos * f;
            cos.push(angle.cos() * freqs.attention_factor);
            sin.push(angle.sin() * freqs.attention_factor);
        }
    }
}

impl RopeTables {
    /// Tables for positions `start..start + len`, shared by every batch row.
    pub fn new(freqs: &RopeFrequencies, start: usize, len: usize, device: &Device) -> Self {
        let dim = 2 * freqs.inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(len * dim), Vec::with_capacity(len * dim));
        for pos in start..start + len {
            push_position(freqs, pos as f32, &mut cos, &mut sin);
        }
        Self::from_values(cos, sin, 1, len, dim, device)
    }

    /// Tables for per-row positions (`[rows, len]`, row-major): packed rows whose positions
    /// restart at each document ([`crate::documents::Documents`]).
    pub fn for_positions(
        freqs: &RopeFrequencies,
        positions: &[u32],
        rows: usize,
        len: usize,
        device: &Device,
    ) -> Self {
        let dim = 2 * freqs.inv_freq.len();
        let n = rows * len * dim;
        let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for &pos in positions {
            push_position(freqs, pos as f32, &mut cos, &mut sin);
        }
        Self::from_values(cos, sin, rows, len, dim, device)
    }

    fn from_values(
        cos: Vec<f32>,
        sin: Vec<f32>,
        rows: usize,
        len: usize,
        dim: usize,
        device: &Device,
    ) -> Self {
        let table = |v| Tensor::<4>::from_data(TensorData::new(v, [rows, 1, len, dim]), device);
        Self {
            cos: table(cos),
            sin: table(sin),
        }
    }

    /// Rotate `x` by its positions: `x * cos + rotate_half(x) * sin`.
    ///
    /// # Shapes
    /// - `x`: `[b, heads, t, head_dim]` -> same
    pub fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        let [_, _, t, dim] = x.dims();
        let rows = self.cos.dims()[0];
        // Flex: one pass each way through the strided input (qwen_burn_kernels::rope).
        let table = |m: &Tensor<4>| m.clone().reshape([rows, t, dim]);
        if let Some(y) = qwen_burn_kernels::rope(&x, &table(&self.cos), &table(&self.sin)) {
            return y;
        }
        let half = dim / 2;
        // rotate_half(x) = cat(-x[.., half:], x[.., :half])
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * self.cos.clone() + rotated * self.sin.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(scaling: serde_json::Value, hd: usize, theta: f64, max_pos: usize) -> Qwen3Config {
        Qwen3Config::from_json(
            &json!({
                "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
                "num_attention_heads": 1, "head_dim": hd, "rope_theta": theta,
                "max_position_embeddings": max_pos, "rope_scaling": scaling,
            }),
            true,
        )
        .unwrap()
    }

    #[test]
    fn yarn_matches_the_qwen3_reference_numbers() {
        // qwen3.md 1.4: hd=128, theta=1e6, L_orig=32768, factor 4: low=23, high=40, factor 1.1386.
        let c = config(
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
            128,
            1e6,
            131072,
        );
        let f = rope_frequencies(&c, 10);
        assert!(
            (f.attention_factor - 1.138_629_4).abs() < 1e-6,
            "{}",
            f.attention_factor
        );
        let plain = default_inv_freq(1e6, 128);
        // Below `low` the high frequencies are kept, above `high` they are divided by the factor.
        for (i, (ours, plain)) in f.inv_freq.iter().zip(&plain).enumerate() {
            if i <= 23 {
                assert_eq!(ours, plain, "dim {i}");
            } else if i >= 40 {
                assert!((ours - plain / 4.0).abs() <= plain * 1e-6, "dim {i}");
            }
        }
        let plain30 = default_inv_freq(1e6, 128)[30];
        assert!(f.inv_freq[30] < plain30 && f.inv_freq[30] > plain30 / 4.0);
    }

    #[test]
    fn dynamic_only_changes_beyond_max_positions() {
        let c = config(
            json!({"rope_type": "dynamic", "factor": 2.0}),
            16,
            10000.0,
            32,
        );
        assert_eq!(
            rope_frequencies(&c, 20).inv_freq,
            default_inv_freq(10000.0, 16)
        );
        let long = rope_frequencies(&c, 64).inv_freq;
        assert!(long[1] < default_inv_freq(10000.0, 16)[1]);
    }
}
