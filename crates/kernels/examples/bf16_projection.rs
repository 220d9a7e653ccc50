//! Time of a frozen projection `x @ W` forward and its input gradient (`kernels::linear_rows`,
//! as a LoRA base weight runs) with `W` stored in f32 against `W` stored in bf16 (computed in
//! bf16 where the CPU has a kernel, `bf16_path`, capped by `QWEN_BURN_BF16_KERNEL`), and of an f32 `W` at mixed precision
//! (`Precision::Bf16`), at the shapes of a model: rows, then `d_in x d_out` pairs.
//!
//!     cargo run --release --example bf16_projection -- 512 2048x2048 2048x1024 2048x6144 6144x2048
//!
//! With `--amx-walks` first, on a CPU with AMX: the bf16 weight and the mixed-precision product
//! under each way of walking the tiles (`AmxWalk`: reduction blocks per group, prefetching),
//! three rounds alternating, against the default walk. With `--task-packing` first: the bf16
//! weight and the mixed-precision product with the tasks packing their own columns of the
//! weight (`set_task_packing(true)`, the default) and with the weight packed up front (also
//! with the weight trained at mixed precision: its gradient too), five
//! rounds alternating.

use std::time::Instant;

use burn::tensor::{DType, Device, Distribution, Tensor};
use qwen_burn_kernels::{
    AmxWalk, Bf16Path, Precision, chosen_bf16_path, detected_bf16_path, in_pool,
    keep_packed_weights, linear_rows, set_amx_walk, set_task_packing, with_precision,
};

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    let walks = args.next_if(|a| a == "--amx-walks").is_some();
    let task_packing = args.next_if(|a| a == "--task-packing").is_some();
    let n: usize = args.next().and_then(|a| a.parse().ok()).expect("rows");
    let shapes: Vec<(usize, usize)> = args
        .map(|a| {
            let (k, m) = a.split_once('x').expect("KxM");
            (k.parse().expect("K"), m.parse().expect("M"))
        })
        .collect();
    let path = chosen_bf16_path().unwrap_or_else(|e| panic!("{e}"));
    println!(
        "bf16 products: {path:?} (this CPU's best: {:?}; QWEN_BURN_BF16_KERNEL picks)",
        detected_bf16_path()
    );
    if walks {
        if path != Bf16Path::Amx {
            println!("--amx-walks: the products do not run on AMX here ({path:?})");
            return;
        }
        amx_walks(n, &shapes);
        return;
    }
    if task_packing {
        task_packings(n, &shapes);
        return;
    }
    let device = Device::flex().autodiff();
    for (k, m) in shapes {
        let [x, dy, w32, w16] = operands(n, k, m, &device);
        let time = |w: &Tensor<2>, precision: Precision| best_time(&x, &dy, w, precision);
        let (a, b) = (time(&w32, Precision::F32), time(&w16, Precision::F32));
        let c = time(&w32, Precision::Bf16);
        // The bf16 weight packed on first use and kept (as inference keeps it): the products
        // without the packing of `W`.
        let d = {
            let _kept = keep_packed_weights();
            time(&w16, Precision::F32)
        };
        let flops = 4.0 * (n * k * m) as f64;
        println!(
            "{n} x {k} x {m}: f32 {:.1} ms ({:.0} GFLOP/s), bf16 W {:.1} ms ({:.0} GFLOP/s), \
             f32 W at bf16 precision {:.1} ms ({:.0} GFLOP/s), bf16 W packed once {:.1} ms \
             ({:.0} GFLOP/s); f32/bf16 W {:.2}",
            a * 1e3,
            flops / a / 1e9,
            b * 1e3,
            flops / b / 1e9,
            c * 1e3,
            flops / c / 1e9,
            d * 1e3,
            flops / d / 1e9,
            a / b
        );
    }
}

/// The input (tracked), the output's gradient, and the weight `[k, m]` in f32 and in bf16, for
/// `n` rows.
fn operands(n: usize, k: usize, m: usize, device: &Device) -> [Tensor<2>; 4] {
    let normal = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<2>::random([n, k], normal, device).require_grad();
    let dy = Tensor::<2>::random([n, m], normal, device);
    let w32 = Tensor::<2>::random([k, m], normal, device) * 0.02;
    let w16 = w32.clone().cast(DType::BF16);
    [x, dy, w32, w16]
}

/// Best of five forward + input-gradient passes of `x @ w` at `precision`, in seconds.
fn best_time(x: &Tensor<2>, dy: &Tensor<2>, w: &Tensor<2>, precision: Precision) -> f64 {
    let run = || {
        let y = with_precision(precision, || linear_rows(x, w)).expect("flex kernel");
        let grads = with_precision(precision, || (y * dy.clone()).sum().backward());
        let _ = x.grad(&grads);
    };
    in_pool(|| {
        run();
        (0..5)
            .map(|_| {
                let start = Instant::now();
                run();
                start.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    })
}

/// Each [`AmxWalk`] on each shape, rounds alternating; GFLOP/s of the bf16 weight and of the
/// f32 weight at bf16 precision, and their ratio to the default walk's in the same round.
fn amx_walks(n: usize, shapes: &[(usize, usize)]) {
    let device = Device::flex().autodiff();
    let walks: Vec<AmxWalk> = (1..=4)
        .flat_map(|group| [false, true].map(|prefetch| AmxWalk { group, prefetch }))
        .collect();
    for &(k, m) in shapes {
        let [x, dy, w32, w16] = operands(n, k, m, &device);
        let flops = 4.0 * (n * k * m) as f64;
        for round in 0..3 {
            let mut rates = Vec::new();
            for &walk in &walks {
                set_amx_walk(walk).expect("a walk of 1 to 4 blocks");
                let bf16_w = flops / best_time(&x, &dy, &w16, Precision::F32) / 1e9;
                let mixed = flops / best_time(&x, &dy, &w32, Precision::Bf16) / 1e9;
                rates.push((walk, bf16_w, mixed));
            }
            set_amx_walk(AmxWalk::DEFAULT).expect("the default walk");
            let (_, base_w, base_mixed) = *rates
                .iter()
                .find(|r| r.0 == AmxWalk::DEFAULT)
                .expect("the default walk is swept");
            for (walk, bf16_w, mixed) in rates {
                println!(
                    "{n} x {k} x {m} round {round}: group {} prefetch {:5}: bf16 W {bf16_w:.0} \
                     GFLOP/s ({:.2}x default), mixed {mixed:.0} GFLOP/s ({:.2}x)",
                    walk.group,
                    walk.prefetch,
                    bf16_w / base_w,
                    mixed / base_mixed
                );
            }
        }
    }
}

/// The products with the tasks packing their own columns of the weight against the weight
/// packed up front, five rounds alternating: GFLOP/s and the ratio within each round.
fn task_packings(n: usize, shapes: &[(usize, usize)]) {
    let device = Device::flex().autodiff();
    for &(k, m) in shapes {
        let [x, dy, w32, w16] = operands(n, k, m, &device);
        let flops = 4.0 * (n * k * m) as f64;
        for round in 0..5 {
            let rate = |on: bool, w: &Tensor<2>, precision: Precision| {
                set_task_packing(on);
                flops / best_time(&x, &dy, w, precision) / 1e9
            };
            let (w_on, w_off) = (
                rate(true, &w16, Precision::F32),
                rate(false, &w16, Precision::F32),
            );
            let (m_on, m_off) = (
                rate(true, &w32, Precision::Bf16),
                rate(false, &w32, Precision::Bf16),
            );
            // The weight trained too: its gradient `x^T dy` (`a` the transposed input, `b` the
            // output's gradient), the product mixed-precision training adds.
            let trained = w32.clone().require_grad();
            let (t_on, t_off) = (
                rate(true, &trained, Precision::Bf16) * 1.5,
                rate(false, &trained, Precision::Bf16) * 1.5,
            );
            set_task_packing(true);
            println!(
                "{n} x {k} x {m} round {round}: bf16 W {w_on:.0} / {w_off:.0} GFLOP/s ({:.3}x), \
                 mixed {m_on:.0} / {m_off:.0} ({:.3}x), mixed with dW {t_on:.0} / {t_off:.0} \
                 ({:.3}x) (tasks packing / up front)",
                w_on / w_off,
                m_on / m_off,
                t_on / t_off
            );
        }
    }
}
