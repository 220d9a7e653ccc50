//! Attention of one new token over the KV cache, for decoding.
//!
//! The composed path concatenates the prefix, repeats each KV head for its query heads
//! (`repeat_kv` copies the whole cache) and runs the general attention. Here each query head
//! reads its KV head's rows of the cache buffer in place: scores, softmax and the weighted sum of
//! values in one pass per head, heads spread over rayon's threads. No `[b, hq, 1, len]` scores
//! tensor, no copy of the cache.
//!
//! At bf16 precision the products take bf16 operands, as the prefill's ([`crate::attention`]):
//! the query, keys and values rounded to bf16 as they are read, the exponentials rounded before
//! they weight the values, the sums in f32 and the division by the softmax's sum last.

use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use crate::bf16::round_bits;
use crate::products::Precision;

/// `x` rounded to bf16 (to nearest even), as f32.
#[inline(always)]
fn rounded(x: f32) -> f32 {
    f32::from_bits(u32::from(round_bits(x)) << 16)
}

/// Backends with a decode-attention kernel (Flex); [`decode_attention`] sends the others to the
/// composed path.
#[backend_extension(Flex)]
pub trait DecodeAttention: Backend {
    /// `softmax(q k[..len]^T * scale) v[..len]` per query head, for `q: [b, hq, 1, hd]` and the
    /// cache buffers `k`, `v`: `[b, hkv, capacity, hd]`; query head `h` reads KV head
    /// `h / (hq / hkv)`; the products at `precision`.
    fn decode_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        len: usize,
        scale: f32,
        precision: Precision,
    ) -> FloatTensor<Self>;
}

impl DecodeAttention for Flex {
    fn decode_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        len: usize,
        scale: f32,
        precision: Precision,
    ) -> FloatTensor<Self> {
        flex_decode_attention(&q, &k, &v, len, scale, precision)
    }
}

/// The attention of one query position over the first `len` cached positions, on plain Flex
/// with f32 tensors, its products at `precision`; `None` elsewhere (the caller then takes the
/// composed path).
///
/// # Shapes
/// - `q`: `[b, hq, 1, hd]`, `k`, `v`: `[b, hkv, capacity, hd]` -> `[b, hq, 1, hd]`
pub fn decode_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    len: usize,
    scale: f32,
    precision: Precision,
) -> Option<Tensor<4>> {
    let flex = super::flex_inference(&q.device());
    let f32s = [q.dtype(), k.dtype(), v.dtype()]
        .iter()
        .all(|d| *d == DType::F32);
    let [_, hq, t, _] = q.dims();
    let hkv = k.dims()[1];
    if !flex || !f32s || t != 1 || hkv == 0 || hq % hkv != 0 || len == 0 || len > k.dims()[2] {
        return None;
    }
    Some(Tensor::from_dispatch(
        <Dispatch as DecodeAttention>::decode_attention(
            q.clone().into_dispatch(),
            k.clone().into_dispatch(),
            v.clone().into_dispatch(),
            len,
            scale,
            precision,
        ),
    ))
}

fn flex_decode_attention(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    len: usize,
    scale: f32,
    precision: Precision,
) -> FlexTensor {
    let contiguous = |t: &FlexTensor| {
        if t.is_contiguous() && t.layout().start_offset() == 0 {
            t.clone()
        } else {
            t.to_contiguous()
        }
    };
    let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
    let (qs, ks) = (q.layout().shape().clone(), k.layout().shape().clone());
    let (b, hq, hd) = (qs[0], qs[1], qs[3]);
    let (hkv, capacity) = (ks[1], ks[2]);
    let group = hq / hkv;
    let (qd, kd, vd) = (q.storage::<f32>(), k.storage::<f32>(), v.storage::<f32>());
    let bf16 = precision == Precision::Bf16;
    let mut out = vec![0.0f32; b * hq * hd];
    // Heads per task: enough work (about 64k multiply-adds) to pay for a thread hand-off.
    let min_heads = (65_536 / (2 * len * hd).max(1)).max(1);
    out.par_chunks_mut(hd)
        .with_min_len(min_heads)
        .enumerate()
        .for_each(|(bh, o)| {
            let (bi, h) = (bh / hq, bh % hq);
            let base = (bi * hkv + h / group) * capacity * hd;
            let qv = &qd[bh * hd..(bh + 1) * hd];
            let mut scores: Vec<f32> = if bf16 {
                let qv: Vec<f32> = qv.iter().map(|&x| rounded(x)).collect();
                (0..len)
                    .map(|j| dot_rounded(&qv, &kd[base + j * hd..base + (j + 1) * hd]) * scale)
                    .collect()
            } else {
                (0..len)
                    .map(|j| {
                        let row = &kd[base + j * hd..base + (j + 1) * hd];
                        qv.iter().zip(row).map(|(a, b)| a * b).sum::<f32>() * scale
                    })
                    .collect()
            };
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            if bf16 {
                for (j, p) in scores.iter().enumerate() {
                    add_rounded(o, rounded(*p), &vd[base + j * hd..base + (j + 1) * hd]);
                }
                o.iter_mut().for_each(|y| *y /= sum);
                return;
            }
            for (j, p) in scores.iter().enumerate() {
                let row = &vd[base + j * hd..base + (j + 1) * hd];
                let w = p / sum;
                for (y, x) in o.iter_mut().zip(row) {
                    *y += w * x;
                }
            }
        });
    FlexTensor::from_data(TensorData::new(out, [b, hq, 1, hd]))
}

simd_dispatch! {
    /// `q . bf16(k)` for a rounded `q`, in 16 running sums (so that it vectorises).
    fn dot_rounded(q: &[f32], k: &[f32]) -> f32 = dot_rounded_generic
}

#[inline(always)]
fn dot_rounded_generic(q: &[f32], k: &[f32]) -> f32 {
    let mut sums = [0.0f32; 16];
    let (qc, kc) = (q.chunks_exact(16), k.chunks_exact(16));
    let tail: f32 = qc
        .remainder()
        .iter()
        .zip(kc.remainder())
        .map(|(a, &b)| a * rounded(b))
        .sum();
    for (a, b) in qc.zip(kc) {
        for l in 0..16 {
            sums[l] += a[l] * rounded(b[l]);
        }
    }
    sums.iter().sum::<f32>() + tail
}

simd_dispatch! {
    /// `o += w bf16(v)`.
    fn add_rounded(o: &mut [f32], w: f32, v: &[f32]) = add_rounded_generic
}

#[inline(always)]
fn add_rounded_generic(o: &mut [f32], w: f32, v: &[f32]) {
    for (y, &x) in o.iter_mut().zip(v) {
        *y += w * rounded(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::{Device, Distribution};

    /// Against the composed attention (GQA by repeating KV heads) over the filled positions of a
    /// larger buffer.
    #[test]
    fn decode_attention_matches_the_composed_attention() {
        let device = Device::flex();
        for (b, hq, hkv, len, cap, hd) in [
            (1, 16, 8, 160, 256, 128),
            (2, 4, 1, 7, 8, 16),
            (1, 2, 2, 1, 4, 8),
        ] {
            let normal = Distribution::Normal(0.0, 1.0);
            let q = Tensor::<4>::random([b, hq, 1, hd], normal, &device);
            let k = Tensor::<4>::random([b, hkv, cap, hd], normal, &device);
            let v = Tensor::<4>::random([b, hkv, cap, hd], normal, &device);
            let scale = (hd as f32).powf(-0.5);
            let got = decode_attention(&q, &k, &v, len, scale, Precision::F32)
                .expect("flex f32 takes the kernel");
            let rep = |x: Tensor<4>| {
                let n = hq / hkv;
                x.narrow(2, 0, len)
                    .unsqueeze_dim::<5>(2)
                    .expand([b, hkv, n, len, hd])
                    .reshape([b, hq, len, hd])
            };
            let options = AttentionModuleOptions {
                scale: Some(f64::from(scale)),
                softcap: None,
                is_causal: false,
            };
            let expected = attention(q, rep(k), rep(v), None, None, options);
            let diff = (got - expected).abs().max().into_scalar::<f32>();
            assert!(
                diff < 1e-5,
                "b={b} hq={hq} hkv={hkv} len={len}: max abs diff {diff}"
            );
        }
    }

    /// At bf16 the decode kernel computes what the prefill's kernel computes for the last
    /// query row (both round the same operands; their f32 sums run in other orders), within
    /// 1e-4 of the largest output, and differs from the f32 decode by more than that.
    #[test]
    fn bf16_decode_matches_the_bf16_prefill() {
        let device = Device::flex();
        let (b, hq, hkv, len, hd) = (1, 4, 2, 77, 128);
        let normal = Distribution::Normal(0.0, 1.0);
        let q = Tensor::<4>::random([b, hq, 1, hd], normal, &device);
        let k = Tensor::<4>::random([b, hkv, len, hd], normal, &device);
        let v = Tensor::<4>::random([b, hkv, len, hd], normal, &device);
        let scale = (hd as f32).powf(-0.5);
        let prefill = crate::causal_attention(&q, &k, &v, scale, None, Precision::Bf16)
            .expect("the prefill kernel");
        let top = prefill.clone().abs().max().into_scalar::<f32>();
        for (precision, close) in [(Precision::Bf16, true), (Precision::F32, false)] {
            let got = decode_attention(&q, &k, &v, len, scale, precision).expect("the kernel");
            let diff = (got - prefill.clone()).abs().max().into_scalar::<f32>();
            assert_eq!(
                diff <= 1e-4 * top,
                close,
                "{precision:?}: {diff} from the bf16 prefill (largest {top})"
            );
        }
    }

    #[test]
    fn other_devices_take_the_composed_path() {
        #[allow(deprecated)]
        let device = Device::ndarray();
        let q = Tensor::<4>::zeros([1, 2, 1, 4], &device);
        let k = Tensor::<4>::zeros([1, 1, 4, 4], &device);
        assert!(decode_attention(&q, &k, &k, 2, 1.0, Precision::F32).is_none());
        let q = Tensor::<4>::zeros([1, 2, 2, 4], &Device::flex());
        let k = Tensor::<4>::zeros([1, 1, 4, 4], &Device::flex());
        assert!(
            decode_attention(&q, &k, &k, 2, 1.0, Precision::F32).is_none(),
            "two query positions"
        );
    }
}
