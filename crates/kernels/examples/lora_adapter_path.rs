//! Time of LoRA's adapter path `s (x @ a) @ b`, forward and backward (the gradients of `x`,
//! `a` and `b`), fused (`kernels::lora_delta`) against the composed projections it replaces
//! (`linear_rows` twice and a scale), alternating, at the shapes of a model: rows, rank, then
//! `d_in x d_out` pairs.
//!
//!     cargo run --release --example lora_adapter_path -- 512 8 2048x2048 2048x1024 2048x6144 6144x2048

use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use qwen_burn_kernels::{in_pool, linear_rows, lora_delta};

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
            let a = Tensor::<2>::random([k, r], normal, &device).require_grad();
            let b = Tensor::<2>::random([r, m], normal, &device).require_grad();
            let dy = Tensor::<2>::random([n, m], normal, &device);
            let fused = || {
                let y = lora_delta(&x, &a, &b, 2.0).expect("flex autodiff");
                let g = (y * dy.clone()).sum().backward();
                let _ = (x.grad(&g), a.grad(&g), b.grad(&g));
            };
            let composed = || {
                let low = linear_rows(&x, &a).expect("flex autodiff").mul_scalar(2.0);
                let y = linear_rows(&low, &b).expect("flex autodiff");
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
                "{n} x {k} -> rank {r} -> {m}: fused {:.2} ms, composed {:.2} ms, composed/fused {:.2}",
                f * 1e3,
                c * 1e3,
                c / f
            );
        }
        println!(
            "all shapes: fused {:.2} ms, composed {:.2} ms, composed/fused {:.2}",
            fused_total * 1e3,
            composed_total * 1e3,
            composed_total / fused_total
        );
    });
}
