//! Time of the LoRA adapter's rank-8 products on their own (Flex's `matmul`, `gemm`), at the
//! rows and projections of the Qwen3-1.7B LoRA benchmark (512 rows): forward `x a` and
//! `low b`, backward `dy b^T`, `low^T dy`, `x^T dlow` and `dlow a^T`, best of 20 each
//! (output read back included). The ones that write or read a whole `[512, 6144]` activation
//! take about a millisecond: memory, not arithmetic.
//!
//!     cargo run --release --example thin_products

use burn::tensor::{Device, Distribution, Tensor};
use qwen_burn_kernels::in_pool;
use std::time::Instant;

type Job<'a> = (&'a str, Box<dyn Fn() -> Tensor<2> + 'a>);

fn main() {
    let device = Device::flex();
    let normal = Distribution::Normal(0.0, 1.0);
    let (n, r) = (512, 8);
    in_pool(|| {
        for (k, m) in [
            (2048usize, 2048usize),
            (2048, 1024),
            (2048, 6144),
            (6144, 2048),
        ] {
            let x = Tensor::<2>::random([n, k], normal, &device);
            let a = Tensor::<2>::random([k, r], normal, &device);
            let b = Tensor::<2>::random([r, m], normal, &device);
            let dy = Tensor::<2>::random([n, m], normal, &device);
            let low = Tensor::<2>::random([n, r], normal, &device);
            let jobs: Vec<Job<'_>> = vec![
                ("x a", Box::new(|| x.clone().matmul(a.clone()))),
                ("low b", Box::new(|| low.clone().matmul(b.clone()))),
                (
                    "dy b^T",
                    Box::new(|| dy.clone().matmul(b.clone().transpose())),
                ),
                (
                    "low^T dy",
                    Box::new(|| low.clone().transpose().matmul(dy.clone())),
                ),
                (
                    "x^T dlow",
                    Box::new(|| x.clone().transpose().matmul(low.clone())),
                ),
                (
                    "dlow a^T",
                    Box::new(|| low.clone().matmul(a.clone().transpose())),
                ),
            ];
            let mut line = format!("{k}->{m}:");
            for (name, f) in &jobs {
                let _ = f().into_data();
                let mut best = f64::MAX;
                for _ in 0..20 {
                    let s = Instant::now();
                    let y = f();
                    let _ = y.into_data();
                    best = best.min(s.elapsed().as_secs_f64());
                }
                line += &format!(" {name} {:.3}", best * 1e3);
            }
            println!("{line} ms");
        }
    });
}
