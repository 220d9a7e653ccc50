//! Time of a LoRA projection `x @ w + s (x @ a) @ b` with a frozen bf16 `w`, forward and
//! backward (the gradients of `x`, `a` and `b`), fused (`kernels::lora_projection`) against the
//! composed products it replaces (`linear_rows` three times, a scale and an add), alternating,
//! at the shapes of a model: rows, rank, then `d_in x d_out` pairs. The loss `sum(y * dy)` and
//! its backward are part of both sides.
//!
//!     cargo run --release --example lora_projection -- 512 8 2048x2048 2048x1024 2048x6144 6144x2048

use std::time::Instant;

use burn::tensor::{DType, Device, Distribution, Tensor};
use qwen_burn_kernels::{in_pool, linear_rows, lora_projection};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).expect("rows");
    let r: usize = args.next().and_then(|a| a.parse().ok()).expect("rank");
    let shapes: Vec<(usize, usize)> = args
        .map(|a| {
            let (k, m) = a.split_once('x').expect("KxM");
            (k.parse().expect("K"), m.parse().expect("M"))
        })
        .collect();
    let device = Device::flex().autodiff();
    let normal = Distribution::Normal(0.0, 1.0);
    in_pool(|| {
        let (mut fused_total, mut composed_total) = (0.0, 0.0);
        for &(k, m) in &shapes {
            let x = Tensor::<2>::random([n, k], normal, &device).require_grad();
            let w = Tensor::<2>::random([k, m], normal, &device).cast(DType::BF16);
            let a = Tensor::<2>::random([k, r], normal, &device).require_grad();
            let b = Tensor::<2>::random([r, m], normal, &device).require_grad();
            let dy = Tensor::<2>::random([n, m], normal, &device);
            let fused = || {
                let y = lora_projection(&x, &w, &a, &b, 2.0).expect("flex autodiff");
                let g = (y * dy.clone()).sum().backward();
                let _ = (x.grad(&g), a.grad(&g), b.grad(&g));
            };
            let composed = || {
                let low = linear_rows(&x, &a).expect("flex autodiff").mul_scalar(2.0);
                let base = linear_rows(&x, &w).expect("flex autodiff");
                let y = base + linear_rows(&low, &b).expect("flex autodiff");
                let g = (y * dy.clone()).sum().backward();
                let _ = (x.grad(&g), a.grad(&g), b.grad(&g));
            };
            let (mut f, mut c) = (f64::MAX, f64::MAX);
            fused();
            composed();
            for _ in 0..10 {
                let start = Instant::now();
                fused();
                f = f.min(start.elapsed().as_secs_f64());
                let start = Instant::now();
                composed();
                c = c.min(start.elapsed().as_secs_f64());
            }
            fused_total += f;
            composed_total += c;
            println!(
                "{n} x {k} -> {m}, rank {r}: fused {:.2} ms, composed {:.2} ms, composed/fused {:.3}",
                f * 1e3,
                c * 1e3,
                c / f
            );
        }
        println!(
            "all shapes: fused {:.2} ms, composed {:.2} ms, composed/fused {:.3}",
            fused_total * 1e3,
            composed_total * 1e3,
            composed_total / fused_total
        );
    });
}
