//! Time of the fused causal attention (forward, and forward + backward) at a training shape,
//! with the GFLOP/s of the products it needs (causal half only) and as if it ran the full `t x t`
//! square (the kernel's query blocks skip all but the diagonal tiles of the upper half). A sixth
//! size packs each row with documents of that many tokens (the document mask), to compare
//! with the same rows as one document. Each figure at f32 and at bf16 precision (the products
//! on bf16 operands, issue 41), in alternating rounds; the best of each.
//!
//!     cargo run --release --example attention_kernel -- 8 8 4 256 32
//!     cargo run --release --example attention_kernel -- 2 8 4 1024 32 128

use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use qwen_burn_kernels::{Precision, causal_attention, in_pool};
use qwen_burn_model::Documents;

fn best(f: &dyn Fn()) -> f64 {
    f();
    (0..20)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes b hq hkv t hd"))
        .collect();
    let (&[b, hq, hkv, t, hd], doc) = (&args[..5.min(args.len())], args.get(5).copied()) else {
        panic!("usage: attention_kernel B HQ HKV T HD [DOCUMENT_TOKENS]");
    };
    let docs = doc.map(|d| {
        let positions = (0..b * t).map(|i| ((i % t) % d) as u32).collect();
        Documents::new(b, t, positions).expect("a valid layout")
    });
    let device = Device::flex().autodiff();
    let normal = Distribution::Normal(0.0, 1.0);
    let q = Tensor::<4>::random([b, hq, t, hd], normal, &device).require_grad();
    let k = Tensor::<4>::random([b, hkv, t, hd], normal, &device).require_grad();
    let v = Tensor::<4>::random([b, hkv, t, hd], normal, &device).require_grad();
    let scale = (hd as f32).powf(-0.5);
    let run = |precision: Precision, backward: bool| {
        let starts = docs.as_ref().map(|d| d.starts());
        let out = causal_attention(&q, &k, &v, scale, starts, precision).expect("flex kernel");
        if backward {
            let grads = out.sum().backward();
            let _ = q.grad(&grads);
        } else {
            let _ = out.narrow(0, 0, 1).sum().into_scalar::<f32>();
        }
    };
    // One product of a head: 2 t^2 hd flops for the square, about half of it causal (per
    // document when packed: t / d squares of d).
    let span = doc.unwrap_or(t).min(t);
    let square = 2.0 * (b * hq * t * span * hd) as f64;
    let needed = square * (span + 1) as f64 / (2 * span) as f64;
    in_pool(|| {
        let precisions = [Precision::F32, Precision::Bf16];
        let mut times = [[f64::MAX; 2]; 2];
        for _round in 0..3 {
            for (p, t) in precisions.iter().zip(times.iter_mut()) {
                t[0] = t[0].min(best(&|| run(*p, false)));
                t[1] = t[1].min(best(&|| run(*p, true)));
            }
        }
        for (p, [fwd, both]) in precisions.iter().zip(times) {
            println!(
                "{p:?}: forward {:.2} ms ({:.0} GFLOP/s causal, {:.0} run); forward+backward {:.2} ms \
             ({:.0} GFLOP/s causal, {:.0} run)",
                fwd * 1e3,
                2.0 * needed / fwd / 1e9,
                2.0 * square / fwd / 1e9,
                both * 1e3,
                7.0 * needed / both / 1e9,
                7.0 * square / both / 1e9,
            );
        }
    });
}
