//! Gradient accumulation equals the large batch: the gradients of k micro-batches of size b
//! equal those of one batch of k*b within 1e-5 (dense, and MoE with the CE loss).

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use qwen_burn_data::Batch;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use qwen_burn_train::trainer::forward_backward;
use serde_json::json;

fn config(moe: bool) -> Qwen3Config {
    let mut v = json!({
        "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "initializer_range": 0.1,
    });
    if moe {
        v["model_type"] = json!("qwen3_moe");
        v["num_experts"] = json!(4);
        v["num_experts_per_tok"] = json!(2);
        v["moe_intermediate_size"] = json!(16);
        v["router_aux_loss_coef"] = json!(0.0);
    }
    Qwen3Config::from_json(&v, true).unwrap()
}

fn batch(rows: usize, t: usize, seed: u64) -> Batch {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 40) as u32 % 64
    };
    let tokens: Vec<u32> = (0..rows * (t + 1)).map(|_| next()).collect();
    let mut inputs = Vec::new();
    let mut targets = Vec::new();
    for r in 0..rows {
        let w = &tokens[r * (t + 1)..(r + 1) * (t + 1)];
        inputs.extend_from_slice(&w[..t]);
        targets.extend(w[1..].iter().map(|&x| i64::from(x)));
    }
    // Some ignored targets, so the normalisation by the global count matters.
    targets[1] = -100;
    Batch {
        batch_size: rows,
        seq_len: t,
        inputs,
        targets,
        attention_mask: None,
    }
}

fn concat(batches: &[Batch]) -> Batch {
    Batch {
        batch_size: batches.iter().map(|b| b.batch_size).sum(),
        seq_len: batches[0].seq_len,
        inputs: batches.iter().flat_map(|b| b.inputs.clone()).collect(),
        targets: batches.iter().flat_map(|b| b.targets.clone()).collect(),
        attention_mask: None,
    }
}

struct Compare<'a> {
    a: &'a GradientsParams,
    b: &'a GradientsParams,
    worst: f32,
    count: usize,
}

impl ModuleVisitor for Compare<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let (Some(a), Some(b)) = (self.a.get::<D>(param.id), self.b.get::<D>(param.id)) else {
            panic!("a parameter lacks a gradient");
        };
        let d = (a - b).abs().max().into_scalar::<f32>();
        self.worst = self.worst.max(d);
        self.count += 1;
    }
}

fn check(moe: bool) {
    let device = Device::flex().autodiff();
    let model = init_weights(Qwen3ForCausalLM::new(&config(moe), &device), 3);
    let micro: Vec<Batch> = (0..4).map(|i| batch(2, 12, 100 + i)).collect();
    let (g_small, s_small) = forward_backward(&model, &micro, &device).unwrap();
    let (g_big, s_big) = forward_backward(&model, &[concat(&micro)], &device).unwrap();
    let mut cmp = Compare {
        a: &g_small,
        b: &g_big,
        worst: 0.0,
        count: 0,
    };
    model.visit(&mut cmp);
    println!(
        "moe={moe}: {} parameter gradients, worst diff {:.2e}; loss {} vs {}",
        cmp.count, cmp.worst, s_small.loss, s_big.loss
    );
    assert!(cmp.count > 10);
    assert!(
        cmp.worst <= 1e-5,
        "accumulated gradients differ by {}",
        cmp.worst
    );
    assert!((s_small.loss - s_big.loss).abs() <= 1e-5);
}

#[test]
fn four_micro_batches_equal_one_large_batch_dense() {
    check(false);
}

#[test]
fn four_micro_batches_equal_one_large_batch_moe() {
    check(true);
}
