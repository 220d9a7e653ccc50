//! The fused attention against Burn's composed attention: values and gradients.

use super::*;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, Distribution, TensorData};

fn composed(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f32) -> Tensor<4> {
    let [b, hq, t, hd] = q.dims();
    let [_, hkv, s, _] = k.dims();
    let rep = |x: Tensor<4>| {
        x.unsqueeze_dim::<5>(2)
            .expand([b, hkv, hq / hkv, s, hd])
            .reshape([b, hq, s, hd])
    };
    let _ = t;
    let options = AttentionModuleOptions {
        scale: Some(f64::from(scale)),
        softcap: None,
        is_causal: true,
    };
    attention(q, rep(k), rep(v), None, None, options)
}

/// Packed rows: the kernel with per-query document starts against Burn's attention with the
/// equivalent block-diagonal causal mask, values and q/k/v gradients. Boundaries fall inside
/// the first 64-row query block and a document crosses its end; a one-token document; one
/// row is a single document. At `hd = 8` the products run on `gemm`, at 32 on the register
/// tiles where the CPU has AVX-512.
#[test]
fn fused_attention_keeps_packed_documents_apart() {
    for hd in [8, 32] {
        packed_documents_case(hd);
    }
}

fn packed_documents_case(hd: usize) {
    let device = Device::flex().autodiff();
    let (b, hq, hkv, t) = (3, 4, 2, 100);
    let lens: [&[usize]; 3] = [&[30, 1, 45, 24], &[100], &[64, 36]];
    // Each token's document start in its row (what `Documents::starts` computes), and the
    // composed attention's equivalent mask: `true` for a future key or one before the start.
    let mut starts = Vec::new();
    for row in lens {
        let mut first = 0;
        for &n in row {
            starts.extend(std::iter::repeat_n(first as u32, n));
            first += n;
        }
    }
    let mut blocked = Vec::with_capacity(b * t * t);
    for r in 0..b {
        for i in 0..t {
            let start = starts[r * t + i] as usize;
            blocked.extend((0..t).map(|j| j < start || j > i));
        }
    }
    let doc_mask =
        Tensor::<4, burn::tensor::Bool>::from_data(TensorData::new(blocked, [b, 1, t, t]), &device);
    let starts: Arc<[u32]> = starts.into();
    let normal = Distribution::Normal(0.0, 1.0);
    let q = Tensor::<4>::random([b, hq, t, hd], normal, &device).require_grad();
    let k = Tensor::<4>::random([b, hkv, t, hd], normal, &device).require_grad();
    let v = Tensor::<4>::random([b, hkv, t, hd], normal, &device).require_grad();
    let d_out = Tensor::<4>::random([b, hq, t, hd], normal, &device);
    let scale = (hd as f32).powf(-0.5);
    let fused = causal_attention(&q, &k, &v, scale, Some(&starts), Precision::F32)
        .expect("flex autodiff takes the kernel");
    let rep = |x: Tensor<4>| {
        x.unsqueeze_dim::<5>(2)
            .expand([b, hkv, hq / hkv, t, hd])
            .reshape([b, hq, t, hd])
    };
    let options = AttentionModuleOptions {
        scale: Some(f64::from(scale)),
        softcap: None,
        is_causal: false,
    };
    let mask = doc_mask.expand([b, hq, t, t]);
    let reference = attention(
        q.clone(),
        rep(k.clone()),
        rep(v.clone()),
        Some(mask),
        None,
        options,
    );
    let value = (fused.clone() - reference.clone())
        .abs()
        .max()
        .into_scalar::<f32>();
    assert!(value <= 2e-5, "hd {hd}: outputs differ by {value}");
    let ga = (fused * d_out.clone()).sum().backward();
    let gb = (reference * d_out).sum().backward();
    for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
        let (a, c) = (x.grad(&ga).unwrap(), x.grad(&gb).unwrap());
        let diff = (a - c).abs().max().into_scalar::<f32>();
        assert!(diff <= 5e-5, "hd {hd}: d{name} differs by {diff}");
    }
}

/// Values and the gradients of q, k and v against Burn's attention (GQA by repeating KV
/// heads), on Flex with autodiff; `s > t` checks the bottom-right causal alignment. Head sizes
/// 32, 64 and 128 run on the register tiles (where the CPU has AVX-512), with row and key
/// counts that leave partial tiles and query blocks.
#[test]
fn fused_attention_matches_the_composed_attention() {
    let device = Device::flex().autodiff();
    for (b, hq, hkv, t, s, hd) in [
        (2, 4, 2, 9, 9, 8),
        (1, 8, 4, 64, 64, 32),
        (2, 2, 1, 5, 12, 16),
        (1, 3, 3, 1, 1, 4),
        (1, 4, 2, 150, 157, 32),
        (1, 2, 1, 70, 70, 64),
        (1, 2, 2, 37, 41, 128),
    ] {
        let normal = Distribution::Normal(0.0, 1.0);
        let q = Tensor::<4>::random([b, hq, t, hd], normal, &device).require_grad();
        let k = Tensor::<4>::random([b, hkv, s, hd], normal, &device).require_grad();
        let v = Tensor::<4>::random([b, hkv, s, hd], normal, &device).require_grad();
        let d_out = Tensor::<4>::random([b, hq, t, hd], normal, &device);
        let scale = (hd as f32).powf(-0.5) * 1.5;
        let fused = causal_attention(&q, &k, &v, scale, None, Precision::F32)
            .expect("flex autodiff takes the kernel");
        let reference = composed(q.clone(), k.clone(), v.clone(), scale);
        let value = (fused.clone() - reference.clone())
            .abs()
            .max()
            .into_scalar::<f32>();
        assert!(
            value <= 2e-5,
            "{:?}: outputs differ by {value}",
            (b, hq, hkv, t, s, hd)
        );
        let ga = (fused * d_out.clone()).sum().backward();
        let gb = (reference * d_out).sum().backward();
        for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
            let (a, c) = (x.grad(&ga).unwrap(), x.grad(&gb).unwrap());
            let diff = (a - c).abs().max().into_scalar::<f32>();
            assert!(
                diff <= 5e-5,
                "{:?}: d{name} differs by {diff}",
                (b, hq, hkv, t, s, hd)
            );
        }
    }
}
