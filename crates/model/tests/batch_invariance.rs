//! L1 of reproducibility (issue 40): a row's hidden states are the same bits alone and inside a
//! batch of other rows, dense and MoE, at widths where `gemm` would otherwise change its
//! summation order with the row count (few outputs per head group, reductions over 512) and
//! with few tokens per expert. A forward of one token in all (decoding) takes the
//! matrix-vector kernels instead, and is not covered.

use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use serde_json::json;

fn model(moe: bool, hidden: usize, device: &Device) -> Qwen3ForCausalLM {
    let mut c = json!({
        "model_type": "qwen3", "vocab_size": 512, "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "initializer_range": 0.1,
    });
    if moe {
        c["model_type"] = json!("qwen3_moe");
        c["num_experts"] = json!(4);
        c["num_experts_per_tok"] = json!(2);
        c["moe_intermediate_size"] = json!(32);
    }
    let config = Qwen3Config::from_json(&c, true).unwrap();
    init_weights(Qwen3ForCausalLM::new(&config, device), 3)
}

/// `rows x t` token ids below 512 from a fixed LCG.
fn ids(rows: usize, t: usize, seed: u64) -> Vec<i64> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..rows * t)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 512) as i64
        })
        .collect()
}

#[test]
fn a_rows_hidden_states_do_not_depend_on_the_batch() {
    let device = Device::flex();
    for (moe, hidden, t) in [
        (false, 64, 40),
        (true, 64, 40),
        (false, 64, 3),
        (true, 64, 3),
        (true, 64, 2),
        (false, 640, 5),
        (true, 640, 5),
    ] {
        let m = model(moe, hidden, &device);
        let row = ids(1, t, 1);
        let hidden_of = |data: Vec<i64>, b: usize| {
            let x = Tensor::<2, Int>::from_data(TensorData::new(data, [b, t]), &device);
            m.forward_hidden(x, None, None)
                .0
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
        };
        let alone = hidden_of(row.clone(), 1);
        for b in [2usize, 3, 8, 17] {
            // The probed row last, after others that change with `b`.
            let mut data = ids(b - 1, t, 7 + b as u64);
            data.extend(&row);
            let batch = hidden_of(data, b);
            let mine = &batch[batch.len() - alone.len()..];
            let differ = alone
                .iter()
                .zip(mine)
                .filter(|(a, c)| a.to_bits() != c.to_bits())
                .count();
            assert_eq!(
                differ,
                0,
                "moe {moe}, hidden {hidden}, {t} tokens, batch {b}: {differ} of {} values differ",
                alone.len()
            );
        }
    }
}
