//! GFLOP/s of Flex's f32 matmul at the shapes of a training step (forward `x W`, input gradient
//! `dY W^T`, weight gradient `X^T dY`), for comparing with PyTorch at the same shapes
//! (`benches/matmul_shapes.py`).
//!
//!     cargo run --release -p qwen-burn-model --example matmul_shapes -- 256 1024 3072

use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor};

fn time(f: impl Fn() -> Tensor<2>) -> f64 {
    let _ = f().sum().into_scalar::<f32>();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let y = f();
        let _ = y.narrow(0, 0, 1).narrow(1, 0, 1).into_scalar::<f32>();
        best = best.min(start.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes m k n"))
        .collect();
    let [m, k, n] = args[..] else {
        panic!("usage: matmul_shapes M K N");
    };
    let d = Device::flex();
    let normal = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<2>::random([m, k], normal, &d);
    let w = Tensor::<2>::random([k, n], normal, &d);
    let dy = Tensor::<2>::random([m, n], normal, &d);
    let wt_store = Tensor::<2>::random([n, k], normal, &d);
    let flops = 2.0 * (m * k * n) as f64;
    let run = |name: &str, f: &dyn Fn() -> Tensor<2>| {
        let s = time(f);
        println!(
            "{name:28} m={m} k={k} n={n}: {:7.1} GFLOP/s ({:.2} ms)",
            flops / s / 1e9,
            s * 1e3
        );
    };
    qwen_burn_kernels::in_pool(|| {
        run("x @ w", &|| x.clone().matmul(w.clone()));
        run("dy @ w^T (strided)", &|| {
            dy.clone().matmul(w.clone().transpose())
        });
        run("x^T @ dy (strided)", &|| {
            x.clone().transpose().matmul(dy.clone())
        });
        run("x @ e^T (tied head)", &|| {
            x.clone().matmul(wt_store.clone().transpose())
        });
    });
}
