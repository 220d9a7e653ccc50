//! Time of the fused LM head + cross-entropy (`kernels::linear_cross_entropy`, value and both
//! gradients) at a training shape, against the three products it runs.
//!
//!     cargo run --release --example head_loss_kernel -- 2048 256 8192 [--bf16]
//!
//! `--bf16`: at mixed precision (`Precision::Bf16`, the products in bf16 where the CPU has a
//! kernel), as `training.precision = "bf16"` runs it.

use std::time::Instant;

use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use qwen_burn_kernels::{Precision, in_pool, linear_cross_entropy, with_precision};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let bf16 = args.iter().any(|a| a == "--bf16");
    args.retain(|a| a != "--bf16");
    let precision = if bf16 {
        Precision::Bf16
    } else {
        Precision::F32
    };
    let args: Vec<usize> = args
        .iter()
        .map(|a| a.parse().expect("sizes n d v"))
        .collect();
    let [n, d, v] = args[..] else {
        panic!("usage: head_loss_kernel N D V");
    };
    let device = Device::flex().autodiff();
    let normal = Distribution::Normal(0.0, 1.0);
    let h = Tensor::<2>::random([n, d], normal, &device).require_grad();
    let w = (Tensor::<2>::random([d, v], normal, &device) * 0.05).require_grad();
    let targets: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % v as i64).collect();
    let y = Tensor::<1, Int>::from_data(TensorData::new(targets, [n]), &device);
    let run = || {
        with_precision(precision, || {
            let loss = linear_cross_entropy(&h, &w, &y, false).expect("flex kernel");
            let grads = loss.backward();
            let _ = w.grad(&grads);
        })
    };
    in_pool(|| {
        run();
        let best = (0..10)
            .map(|_| {
                let start = Instant::now();
                run();
                start.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min);
        let flops = 6.0 * (n * d * v) as f64;
        println!(
            "head + loss at {precision:?} {:.2} ms: {:.0} GFLOP/s over its three products",
            best * 1e3,
            flops / best / 1e9
        );
    });
}
