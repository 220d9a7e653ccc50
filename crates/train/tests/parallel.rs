//! Data parallelism over two replicas gives the gradients of one device processing the same
//! micro-batches (within 1e-5), here with two threads on the flex CPU device.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use qwen_burn_data::Batch;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use qwen_burn_train::parallel::Replicas;
use qwen_burn_train::trainer::forward_backward;
use serde_json::json;

fn batch(seed: u64) -> Batch {
    let (b, t) = (2, 12);
    let mut s = seed;
    let tokens: Vec<u32> = (0..b * (t + 1))
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as u32 % 64
        })
        .collect();
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for r in 0..b {
        let w = &tokens[r * (t + 1)..(r + 1) * (t + 1)];
        inputs.extend_from_slice(&w[..t]);
        targets.extend(w[1..].iter().map(|&x| i64::from(x)));
    }
    Batch {
        batch_size: b,
        seq_len: t,
        inputs,
        targets,
        attention_mask: None,
    }
}

struct Worst<'a> {
    a: &'a GradientsParams,
    b: &'a GradientsParams,
    worst: f32,
    count: usize,
}

impl ModuleVisitor for Worst<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let (a, b) = (
            self.a.get::<D>(param.id).expect("grad a"),
            self.b.get::<D>(param.id).expect("grad b"),
        );
        self.worst = self.worst.max((a - b).abs().max().into_scalar::<f32>());
        self.count += 1;
    }
}

#[test]
fn two_replicas_equal_one_device() {
    for moe in [false, true] {
        let mut v = json!({
            "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        });
        if moe {
            v["model_type"] = json!("qwen3_moe");
            v["num_experts"] = json!(4);
            v["num_experts_per_tok"] = json!(2);
            v["moe_intermediate_size"] = json!(16);
            v["router_aux_loss_coef"] = json!(0.01);
        }
        let config = Qwen3Config::from_json(&v, true).unwrap();
        let device = Device::flex().autodiff();
        let model = init_weights(Qwen3ForCausalLM::new(&config, &device), 9);
        let batches: Vec<Batch> = (0..4).map(batch).collect();
        let (g_one, s_one) = forward_backward(&model, &batches, &device).unwrap();
        let replicas = Replicas::new(vec![device.clone(), device.clone()]);
        let (g_two, s_two) = replicas.step(&model, &batches).unwrap();
        let mut w = Worst {
            a: &g_one,
            b: &g_two,
            worst: 0.0,
            count: 0,
        };
        model.visit(&mut w);
        println!(
            "moe={moe}: {} grads, worst diff {:.2e}, loss {} vs {}",
            w.count, w.worst, s_one.loss, s_two.loss
        );
        assert!(
            w.worst <= 1e-5,
            "data-parallel gradients differ by {}",
            w.worst
        );
        assert!((s_one.loss - s_two.loss).abs() <= 1e-6);
        assert_eq!(s_one.tokens, s_two.tokens);
        assert!((s_one.aux_loss.unwrap_or(0.0) - s_two.aux_loss.unwrap_or(0.0)).abs() <= 1e-6);
    }
}
