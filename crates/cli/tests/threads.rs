//! L0 of reproducibility (issue 40): the same binary, config and seed give bit-identical
//! weights and losses whatever the number of threads (`RAYON_NUM_THREADS` 1 and 2), dense and
//! MoE.

mod common;
use common::*;

fn run_with_threads(moe: bool, threads: &str) -> (Vec<(u64, f64)>, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), moe, 3, 3, "");
    let run = dir.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[("RAYON_NUM_THREADS", threads)],
    ));
    // The checkpoint's record holds Burn's random parameter ids; the HF export holds only the
    // tensors (for MoE without the routing biases, which the later steps' losses depend on).
    let out = dir.path().join("hf");
    let mut args = vec!["export", "--checkpoint", s(&run), "--out", s(&out)];
    if moe {
        args.push("--drop-routing-bias");
    }
    ok(&qwen_burn(&args, &[]));
    let weights = std::fs::read(out.join("model.safetensors")).unwrap();
    (train_losses(&run), weights)
}

#[test]
fn one_thread_and_two_give_the_same_bits() {
    for moe in [false, true] {
        let (losses_1, weights_1) = run_with_threads(moe, "1");
        let (losses_2, weights_2) = run_with_threads(moe, "2");
        assert_eq!(losses_1.len(), 3);
        for ((step, a), (_, b)) in losses_1.iter().zip(&losses_2) {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "moe {moe}, step {step}: {a} vs {b}"
            );
        }
        assert!(weights_1 == weights_2, "moe {moe}: the weights differ");
    }
}
