//! Shared helpers of the trainer's integration tests: a tiny model, deterministic batches, and
//! the largest gradient difference between two gradient sets.

#![allow(dead_code)]

pub mod rl;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use qwen_burn_data::Batch;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use serde_json::json;

/// Vocabulary 64, hidden 32, 2 layers, 4 query / 2 KV heads of width 8; MoE: 4 experts, top-2.
/// `initializer_range` `None` keeps the config default.
pub fn tiny_config(moe: bool, initializer_range: Option<f64>, aux_coef: f64) -> Qwen3Config {
    let mut v = json!({
        "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    });
    if let Some(range) = initializer_range {
        v["initializer_range"] = json!(range);
    }
    if moe {
        v["model_type"] = json!("qwen3_moe");
        v["num_experts"] = json!(4);
        v["num_experts_per_tok"] = json!(2);
        v["moe_intermediate_size"] = json!(16);
        v["router_aux_loss_coef"] = json!(aux_coef);
        v["output_router_logits"] = json!(true);
    }
    Qwen3Config::from_json(&v, true).unwrap()
}

/// The MoE [`tiny_config`] with the balancing loss `kind` (`hf`, `per_layer`, `sequence`,
/// `global_batch`) at coefficient `aux_coef`.
pub fn tiny_moe_config(kind: &str, aux_coef: f64) -> Qwen3Config {
    let mut v = tiny_config(true, None, aux_coef).to_hf_json();
    v["router_aux_loss_type"] = json!(kind);
    Qwen3Config::from_json(&v, false).unwrap()
}

/// `rows` windows of `t + 1` pseudo-random tokens below 64 (a fixed LCG seeded by `seed`) as
/// `[rows, t]` inputs and next-token targets.
pub fn lcg_batch(rows: usize, t: usize, seed: u64) -> Batch {
    let mut s = seed;
    let tokens: Vec<u32> = (0..rows * (t + 1))
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as u32 % 64
        })
        .collect();
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let w = &tokens[r * (t + 1)..(r + 1) * (t + 1)];
        inputs.extend_from_slice(&w[..t]);
        targets.extend(w[1..].iter().map(|&x| i64::from(x)));
    }
    Batch {
        batch_size: rows,
        seq_len: t,
        inputs,
        targets,
        attention_mask: None,
        positions: None,
        pairs: None,
    }
}

/// Largest absolute difference between the gradients `a` and `b` over all float parameters of
/// `model`, and how many parameters were compared. Panics if a parameter lacks a gradient.
pub fn worst_grad_diff(
    model: &Qwen3ForCausalLM,
    a: &GradientsParams,
    b: &GradientsParams,
) -> (f32, usize) {
    struct Worst<'a> {
        a: &'a GradientsParams,
        b: &'a GradientsParams,
        worst: f32,
        count: usize,
    }
    impl ModuleVisitor for Worst<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let (Some(a), Some(b)) = (self.a.get::<D>(param.id), self.b.get::<D>(param.id)) else {
                panic!("a parameter lacks a gradient");
            };
            self.worst = self.worst.max((a - b).abs().max().into_scalar::<f32>());
            self.count += 1;
        }
    }
    let mut w = Worst {
        a,
        b,
        worst: 0.0,
        count: 0,
    };
    model.visit(&mut w);
    (w.worst, w.count)
}

/// Every float parameter by its path (Burn's module names, which are HF's keys).
pub fn param_ids(model: &Qwen3ForCausalLM) -> Vec<(String, ParamId)> {
    struct All(Vec<String>, Vec<(String, ParamId)>);
    impl ModuleVisitor for All {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            // The enum variant of a layer's feed-forward (`mlp.Dense`, `mlp.Sparse`) is no HF key.
            let path = self
                .0
                .join(".")
                .replace(".Dense.", ".")
                .replace(".Sparse.", ".");
            self.1.push((path, param.id));
        }
    }
    let mut all = All(Vec::new(), Vec::new());
    model.visit(&mut all);
    all.1
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// `grads` of `model` equal the HF gradients `want` (a JSON object: HF parameter name to its
/// flattened gradient, HF's `[out, in]` layout for linear weights) within 1e-5 of their
/// largest magnitude; `what` names the case in failures.
pub fn assert_grads_equal_hf(
    model: &Qwen3ForCausalLM,
    grads: &GradientsParams,
    want: &serde_json::Value,
    what: &str,
) {
    let ids = param_ids(model);
    let name = what;
    for (param, values) in want.as_object().unwrap() {
        let theirs: Vec<f32> = values
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let id = ids
            .iter()
            .find(|(p, _)| p == param)
            .unwrap_or_else(|| {
                let names: Vec<_> = ids.iter().map(|(p, _)| p.as_str()).collect();
                panic!("{param} not among {names:?}")
            })
            .1;
        let ours: Vec<f32> = if param.ends_with("norm.weight") {
            grads
                .get::<1>(id)
                .expect(param)
                .try_into_vec_as::<f32>()
                .unwrap()
        } else {
            // Burn keeps a linear weight as [in, out]; HF as [out, in].
            let g = grads.get::<2>(id).expect(param);
            g.transpose().try_into_vec_as::<f32>().unwrap()
        };
        assert_eq!(ours.len(), theirs.len(), "{name}: {param}");
        let scale = max_abs(&theirs);
        let diff = ours
            .iter()
            .zip(&theirs)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            scale > 0.0,
            "{name}: {param}: a zero gradient compares nothing"
        );
        assert!(
            diff <= 1e-5 * scale,
            "{name}: {param} gradient differs by {diff} (largest {scale})"
        );
    }
}
