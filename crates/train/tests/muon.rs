//! Muon against `torch.optim.Muon` (PyTorch 2.15): one and three steps on given weights and
//! gradients, for a tall, a wide and a square matrix, with both learning-rate scales by shape.
//! The fixture (`tests/fixtures/muon/make_muon_fixture.py`) holds torch's steps as shipped
//! (Newton–Schulz in bfloat16) and with the iteration in float32, the reference of this f32
//! implementation; on Flex with its fused Newton–Schulz kernel, and on the composed path that
//! NdArray, wgpu and `fused_kernels = false` take. Also which parameters Muon trains: dense,
//! MoE, tied and LoRA models.

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::Optimizer;
use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use qwen_burn_train::config::{
    AdjustLr, LoraConfig, LoraTarget, MuonSettings, OptimizerConfig, OptimizerKind,
};
use qwen_burn_train::optim::muon::{TorchLayoutMuon, muon_param_ids};
use serde_json::Value;

/// Against torch with the iteration in f32: the same arithmetic in another order.
const F32_TOL: f32 = 2e-5;
/// Against torch as shipped: its bfloat16 iteration is ~3 decimal digits.
const BF16_TOL: f32 = 5e-3;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// A `[out, in]` row-major matrix as Burn's `[in, out]` tensor.
fn burn_layout(flat: &[f32], out: usize, inp: usize, device: &Device) -> Tensor<2> {
    Tensor::<2>::from_data(TensorData::new(flat.to_vec(), [out, inp]), device).transpose()
}

#[test]
fn one_and_three_steps_equal_torch_muon() {
    check_against_torch(&Device::flex(), "flex, fused", true);
}

#[test]
fn the_composed_path_equals_torch_muon_too() {
    qwen_burn_kernels::with_fused_kernels(false, || {
        check_against_torch(&Device::flex(), "flex, fused_kernels = false", false)
    });
}

#[test]
#[allow(deprecated)] // Device::ndarray: deprecated upstream, still a supported device here.
fn ndarray_equals_torch_muon() {
    check_against_torch(&Device::ndarray(), "ndarray", false);
}

/// Muon's steps on `device` against torch's; `fused` says which path must run there.
fn check_against_torch(device: &Device, path_name: &str, fused: bool) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/muon/expected.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let lr = fixture["lr"].as_f64().unwrap();
    let device = device.clone();
    let mut worst = (0.0f32, 0.0f32);
    for case in fixture["cases"].as_array().unwrap() {
        let shape: Vec<usize> = case["shape_torch"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        let (out, inp) = (shape[0], shape[1]);
        for (adjust, name) in [
            (AdjustLr::Original, "original"),
            (AdjustLr::MatchRmsAdamw, "match_rms_adamw"),
        ] {
            let cfg = OptimizerConfig {
                lr,
                kind: OptimizerKind::Muon,
                muon: MuonSettings {
                    lr,
                    weight_decay: fixture["weight_decay"].as_f64().unwrap(),
                    momentum: fixture["momentum"].as_f64().unwrap(),
                    ns_steps: 5,
                    adjust_lr: adjust,
                },
                ..OptimizerConfig::default()
            };
            let muon = TorchLayoutMuon::new(&cfg);
            let mut w = burn_layout(&floats(&case["w0"]), out, inp, &device);
            assert_eq!(
                qwen_burn_kernels::fused_newton_schulz_applies(&w),
                fused,
                "{path_name}: the path under test"
            );
            let mut state = None;
            for (k, g) in case["grads"].as_array().unwrap().iter().enumerate() {
                let g = burn_layout(&floats(g), out, inp, &device);
                let (next, s) = muon.step(lr, w, g, state);
                (w, state) = (next, s);
                let ours: Vec<f32> = w.clone().transpose().try_into_vec_as::<f32>().unwrap();
                if k != 0 && k != 2 {
                    continue; // steps 1 and 3
                }
                for (reference, tol, slot) in [
                    (&case[format!("torch_f32_{name}")], F32_TOL, 0),
                    (&case[format!("torch_{name}")], BF16_TOL, 1),
                ] {
                    let theirs = floats(&reference[k]);
                    let diff = ours
                        .iter()
                        .zip(&theirs)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f32::max);
                    if slot == 0 {
                        worst.0 = worst.0.max(diff);
                    } else {
                        worst.1 = worst.1.max(diff);
                    }
                    assert!(
                        diff <= tol,
                        "{path_name}: [{out}, {inp}] {name} step {}: max |ours - torch| {diff:.2e} \
                         > {tol:.0e} ({})",
                        k + 1,
                        if slot == 0 {
                            "f32 iteration"
                        } else {
                            "as shipped, bf16"
                        }
                    );
                }
            }
        }
    }
    eprintln!(
        "{path_name}: worst |Muon - torch|: {:.2e} (f32 iteration), {:.2e} (torch's bf16)",
        worst.0, worst.1
    );
}

/// Every float parameter's path and rank.
fn params<M: Module>(model: &M) -> Vec<(String, ParamId, usize)> {
    struct All {
        path: Vec<String>,
        found: Vec<(String, ParamId, usize)>,
    }
    impl ModuleVisitor for All {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.found.push((self.path.join("."), param.id, D));
        }
    }
    let mut all = All {
        path: Vec::new(),
        found: Vec::new(),
    };
    model.visit(&mut all);
    all.found
}

fn config(json: &str) -> Qwen3Config {
    Qwen3Config::from_json(&serde_json::from_str(json).unwrap(), true).unwrap()
}

const DENSE: &str = r#"{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 32,
    "tie_word_embeddings": false}"#;

/// The paths Muon trains in `model`, and the 2-D paths it leaves to AdamW.
fn routed<M: Module>(model: &M) -> (Vec<String>, Vec<String>) {
    let muon = muon_param_ids(model);
    let all = params(model);
    let (mut to_muon, mut to_adamw) = (Vec::new(), Vec::new());
    for (path, id, rank) in all {
        if muon.contains(&id) {
            assert_eq!(rank, 2, "{path}: Muon takes matrices only");
            to_muon.push(path);
        } else if rank == 2 {
            to_adamw.push(path);
        }
    }
    (to_muon, to_adamw)
}

#[test]
fn muon_trains_the_hidden_matrices_and_adamw_the_rest() {
    let device = Device::flex();
    // Dense, untied: 7 projections a layer; embedding and head to AdamW.
    let dense = Qwen3ForCausalLM::new(&config(DENSE), &device);
    let (muon, adamw) = routed(&dense);
    assert_eq!(muon.len(), 2 * 7, "{muon:#?}");
    for name in [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ] {
        assert_eq!(
            muon.iter().filter(|p| p.contains(name)).count(),
            2,
            "{name}"
        );
    }
    assert_eq!(adamw.len(), 2, "embedding and head: {adamw:?}");
    assert!(adamw.iter().any(|p| p.contains("embed_tokens")));
    assert!(adamw.iter().any(|p| p.contains("lm_head")));

    // Tied: the one embedding matrix stays with AdamW.
    let tied = Qwen3ForCausalLM::new(
        &config(&DENSE.replace(
            "\"tie_word_embeddings\": false",
            "\"tie_word_embeddings\": true",
        )),
        &device,
    );
    let (muon, adamw) = routed(&tied);
    assert_eq!((muon.len(), adamw.len()), (14, 1), "{adamw:?}");

    // MoE: each expert's three matrices on their own; the router to AdamW.
    let moe = Qwen3ForCausalLM::new(
        &config(
            r#"{"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16,
            "intermediate_size": 32, "moe_intermediate_size": 8, "num_experts": 4,
            "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 32,
            "tie_word_embeddings": true}"#,
        ),
        &device,
    );
    let (muon, adamw) = routed(&moe);
    assert_eq!(muon.len(), 2 * (4 + 4 * 3), "{muon:#?}");
    assert_eq!(
        adamw.iter().filter(|p| p.ends_with(".gate.weight")).count(),
        2,
        "the routers: {adamw:?}"
    );
    assert_eq!(adamw.len(), 3, "embedding and two routers: {adamw:?}");

    // LoRA on q and v: adapters of rank 8 or more go to Muon; below that (rank 2 here) to
    // AdamW, where Muon's equal-sized step on one or two directions diverged
    // (`experiments/007-optimizers`).
    for (rank, to_muon) in [(2, false), (8, true)] {
        let lora = qwen_burn_train::run::checkpoint::apply_lora(
            Qwen3ForCausalLM::new(&config(DENSE), &device),
            &LoraConfig {
                rank,
                alpha: 2.0 * rank as f64,
                targets: vec![LoraTarget::QProj, LoraTarget::VProj],
                ..Default::default()
            },
        );
        // The adapters are the `a` and `b` matrices under each adapted weight's `lora`.
        let adapters: Vec<String> = params(&lora)
            .into_iter()
            .filter(|(p, _, _)| p.contains(".lora"))
            .map(|(p, _, _)| p)
            .collect();
        assert_eq!(adapters.len(), 2 * 2 * 2, "A and B of q and v in 2 layers");
        let (muon, adamw) = routed(&lora);
        for p in &adapters {
            let (want, other) = if to_muon {
                (&muon, &adamw)
            } else {
                (&adamw, &muon)
            };
            assert!(
                want.contains(p) && !other.contains(p),
                "rank {rank}: {p} to {}",
                if to_muon { "Muon" } else { "AdamW" }
            );
        }
    }
}
