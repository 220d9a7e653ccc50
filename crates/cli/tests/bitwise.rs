//! L2 of reproducibility (issue 40): under `training.reproducible = "bitwise"`, the splits of one
//! global batch of 16 rows (16 x 1, 8 x 2, 4 x 4, 2 x 8, and 8 x 2 over the replicas `flex,flex`)
//! give bit-identical step losses and final weights, dense and MoE, full and LoRA, AdamW and
//! Muon.

mod common;
use common::*;

const LORA: &str = "\n[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q_proj\", \"v_proj\", \"gate_proj\", \"down_proj\"]\n";

/// The step losses and the exported weights (LoRA merged) of a 3-step run.
fn run(
    dir: &std::path::Path,
    moe: bool,
    extra: &str,
    sets: &[&str],
    (b, k): (usize, usize),
    device: &str,
) -> (Vec<(u64, f64)>, Vec<u8>) {
    std::fs::create_dir_all(dir).unwrap();
    let config = tiny_config(dir, moe, 3, 3, extra);
    let run = dir.join("run");
    let (batch, accum) = (
        format!("training.batch_size={b}"),
        format!("training.grad_accum={k}"),
    );
    let mut args = vec![
        "train",
        "--config",
        s(&config),
        "--run-dir",
        s(&run),
        "--device",
        device,
        "--set",
        &batch,
        "--set",
        &accum,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    ok(&qwen_burn(&args, &[]));
    let out = dir.join("hf");
    let mut args = vec!["export", "--checkpoint", s(&run), "--out", s(&out)];
    if moe {
        args.push("--drop-routing-bias");
    }
    ok(&qwen_burn(&args, &[]));
    let weights = std::fs::read(out.join("model.safetensors")).unwrap();
    (train_losses(&run), weights)
}

const SPLITS: [((usize, usize), &str); 5] = [
    ((16, 1), "flex"),
    ((8, 2), "flex"),
    ((4, 4), "flex"),
    ((2, 8), "flex"),
    ((8, 2), "flex,flex"),
];

fn same_bits_for_every_split(label: &str, moe: bool, extra: &str, sets: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sets = sets.to_vec();
    sets.push("training.reproducible=\"bitwise\"");
    let runs: Vec<_> = SPLITS
        .iter()
        .enumerate()
        .map(|(i, &(split, device))| {
            let sub = dir.path().join(format!("s{i}"));
            run(&sub, moe, extra, &sets, split, device)
        })
        .collect();
    let (first_losses, first_weights) = &runs[0];
    assert_eq!(first_losses.len(), 3, "{label}");
    for ((split, device), (losses, weights)) in SPLITS.iter().zip(&runs).skip(1) {
        assert_eq!(losses.len(), 3, "{label}");
        for ((step, a), (_, b)) in first_losses.iter().zip(losses) {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{label}, {split:?} on {device}, step {step}: {a} vs {b}"
            );
        }
        assert!(
            weights == first_weights,
            "{label}: {split:?} on {device} ends with other weights than 16 x 1"
        );
    }
}

#[test]
fn bitwise_dense_adamw_and_muon() {
    same_bits_for_every_split("dense, AdamW", false, "", &[]);
    same_bits_for_every_split("dense, Muon", false, "", &["optimizer.kind=muon"]);
}

#[test]
fn bitwise_moe_adamw_and_muon() {
    same_bits_for_every_split("MoE, AdamW", true, "", &[]);
    same_bits_for_every_split("MoE, Muon", true, "", &["optimizer.kind=muon"]);
}

#[test]
fn bitwise_lora_dense_and_moe() {
    same_bits_for_every_split("dense, LoRA", false, LORA, &[]);
    same_bits_for_every_split("MoE, LoRA", true, LORA, &[]);
}

/// Without the mode the splits train on the same rows but round differently: the weights of
/// 16 x 1 and 2 x 8 differ (which is what the mode is for; were they equal, the tests above
/// would prove nothing about it).
#[test]
fn bitwise_is_needed_the_default_mode_rounds_by_split() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, a) = run(&dir.path().join("a"), false, "", &[], (16, 1), "flex");
    let (_, b) = run(&dir.path().join("b"), false, "", &[], (2, 8), "flex");
    assert!(
        a != b,
        "16 x 1 and 2 x 8 gave the same bits without the mode"
    );
}

/// The objectives whose rows belong together (pairs, groups) are refused, naming the key.
#[test]
fn bitwise_refuses_preference_and_prompt_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 3, 3, "");
    for kind in ["preference", "prompts"] {
        let out = qwen_burn(
            &[
                "train",
                "--config",
                s(&config),
                "--run-dir",
                s(&dir.path().join(kind)),
                "--set",
                &format!("data.kind=\"{kind}\""),
                "--set",
                "training.reproducible=\"bitwise\"",
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{kind}: {err}");
        assert!(err.contains("training.reproducible"), "{kind}: {err}");
    }
}
