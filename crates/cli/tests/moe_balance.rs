//! The shipped MoE default stays balanced: 40 steps of `configs/tiny_moe.toml` as shipped (its
//! model, data, batch and balancing settings, one flex device), and from step 30 on every step
//! has every MoE layer's whole-step max/mean expert load at most 1.5 and no idle expert. The
//! previous default (no training-time capacity) failed this: its worst layer sat at max/mean
//! 3.9-4.0 with up to half the experts idle from step 10 on (`experiments/005-moe-balance`).

mod common;

use common::{ok, qwen_burn, s};

#[test]
fn the_shipped_moe_default_does_not_collapse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    let cache = dir.path().join("shards");
    let cache_set = format!("data.cache_dir=\"{}\"", s(&cache));
    let out = qwen_burn(
        &[
            "train",
            "--config",
            "configs/tiny_moe.toml",
            "--run-dir",
            s(&run),
            "--max-steps",
            "40",
            "--device",
            "flex",
            "--set",
            &cache_set,
            "--set",
            "logging.interval=1",
            "--set",
            "training.eval_interval=0",
            "--set",
            "training.sample_interval=0",
            "--set",
            "checkpoint.interval=0",
        ],
        &[],
    );
    ok(&out);
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).expect("metrics.jsonl");
    let mut checked = 0;
    for line in metrics.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("a JSON record");
        let step = r["step"].as_u64().expect("step");
        if r["split"] != "train" || step < 30 {
            continue;
        }
        let layers = r["moe"].as_array().expect("per-layer MoE statistics");
        assert_eq!(layers.len(), 4, "step {step}: {layers:?}");
        for (i, l) in layers.iter().enumerate() {
            let load = l["max_over_mean_load"]
                .as_f64()
                .expect("max_over_mean_load");
            let dead = l["dead_expert_fraction"]
                .as_f64()
                .expect("dead_expert_fraction");
            assert!(
                load <= 1.5 && dead == 0.0,
                "step {step}, layer {i}: max/mean load {load}, idle experts {dead}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 11, "steps 30..=40 are all logged");
}
