//! The sparse MoE dispatch against a naive reference that runs every expert on every token and
//! masks by the routing weights: outputs and the gradients of every parameter agree to 1e-5.

#![allow(deprecated)] // Device::ndarray: burn-ndarray is deprecated upstream but still a supported device here.

use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_model::block::FeedForward;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::moe::{Routing, SparseMoe, naive_forward};
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
use serde_json::json;

const TOL: f32 = 1e-5;

fn moe_layer(norm_topk_prob: bool, device: &Device) -> SparseMoe {
    let config = Qwen3Config::from_json(
        &json!({
            "model_type": "qwen3_moe", "vocab_size": 16, "hidden_size": 24, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
            "norm_topk_prob": norm_topk_prob, "initializer_range": 0.3,
        }),
        true,
    )
    .unwrap();
    let model = init_weights(Qwen3ForCausalLM::new(&config, device), 7);
    match model.model.layers.into_iter().next().unwrap().mlp {
        FeedForward::Sparse(moe) => moe,
        FeedForward::Dense(_) => panic!("layer 0 must be MoE"),
    }
}

fn max_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    (a - b).abs().max().into_scalar::<f32>()
}

fn random(shape: [usize; 3], seed: u64, device: &Device) -> Tensor<3> {
    let n = shape.iter().product::<usize>();
    // A small LCG keeps the inputs identical on every backend.
    let mut s = seed;
    let values: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

fn check(device: Device, norm_topk_prob: bool) {
    let device = device.autodiff();
    let moe = moe_layer(norm_topk_prob, &device);
    let x = random([3, 5, 24], 11, &device).require_grad();
    let r = random([3, 5, 24], 12, &device);

    let (sparse, router) = moe.forward(x.clone(), Routing::for_device(&x.device()));
    let dense = naive_forward(&moe, x.clone());
    let out_diff = max_diff(sparse.clone(), dense.clone());
    assert_eq!(router.expert_counts.iter().sum::<usize>(), 3 * 5 * 2);
    assert!(out_diff <= TOL, "outputs differ by {out_diff}");

    let g_sparse = (sparse * r.clone()).sum().backward();
    let g_dense = (dense * r).sum().backward();
    let mut checked = 0;
    let mut worst = 0.0f32;
    let mut cmp2 = |name: &str, p: &burn::module::Param<Tensor<2>>| {
        let a = p
            .val()
            .grad(&g_sparse)
            .unwrap_or_else(|| panic!("no sparse grad for {name}"));
        let b = p
            .val()
            .grad(&g_dense)
            .unwrap_or_else(|| panic!("no dense grad for {name}"));
        let d = max_diff(a, b);
        assert!(d <= TOL, "gradient of {name} differs by {d}");
        worst = worst.max(d);
        checked += 1;
    };
    cmp2("gate", &moe.gate.weight);
    for (i, e) in moe.experts.iter().enumerate() {
        cmp2(&format!("experts.{i}.gate_proj"), &e.gate_proj.weight);
        cmp2(&format!("experts.{i}.up_proj"), &e.up_proj.weight);
        cmp2(&format!("experts.{i}.down_proj"), &e.down_proj.weight);
    }
    let dx = max_diff(x.grad(&g_sparse).unwrap(), x.grad(&g_dense).unwrap());
    assert!(dx <= TOL, "input gradient differs by {dx}");
    println!(
        "{device:?} norm_topk_prob={norm_topk_prob}: output diff {out_diff:.2e}, worst grad diff {worst:.2e} over {checked} params, dx {dx:.2e}"
    );
}

#[test]
fn sparse_dispatch_matches_naive_on_flex() {
    check(Device::flex(), true);
    check(Device::flex(), false);
}

#[test]
fn sparse_dispatch_matches_naive_on_ndarray() {
    check(Device::ndarray(), true);
}

#[test]
fn aux_loss_of_a_balanced_router_is_k() {
    // Uniform logits: every expert has probability 1/E and (ties broken by index) f sums to 1
    // per slot, so E * sum f * P = k exactly as HF's formula gives.
    let device = Device::flex();
    let logits = Tensor::<2>::zeros([8, 4], &device);
    let aux = qwen_burn_model::load_balancing_loss(&[logits], 4, 2, None).into_scalar::<f32>();
    assert!(
        (aux - 2.0).abs() < 1e-6,
        "balanced aux loss {aux}, expected 2"
    );
}

/// Aux-loss-free balancing: the routing bias changes which experts are chosen, never the
/// weights they are combined with (the unbiased router probabilities), and no gradient reaches
/// the bias.
#[test]
fn routing_bias_changes_selection_only() {
    let device = Device::flex().autodiff();
    let config = Qwen3Config::from_json(
        &json!({
            "model_type": "qwen3_moe", "vocab_size": 16, "hidden_size": 24, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
            "norm_topk_prob": false, "initializer_range": 0.3, "router_bias_update_rate": 0.01,
        }),
        true,
    )
    .unwrap();
    let model = init_weights(Qwen3ForCausalLM::new(&config, &device), 7);
    let mut moe = match model.model.layers.into_iter().next().unwrap().mlp {
        FeedForward::Sparse(moe) => moe,
        FeedForward::Dense(_) => panic!("layer 0 must be MoE"),
    };
    // Expert 5 gets a bias far above any probability gap: it is in every token's top-2.
    let bias_id = moe.routing_bias.as_ref().unwrap().id;
    let bias = Tensor::<1>::from_data(
        TensorData::new(vec![0.0f32, 0.0, 0.0, 0.0, 0.0, 5.0], [6]),
        &device,
    );
    moe.routing_bias =
        Some(burn::module::Param::initialized(bias_id, bias).set_require_grad(false));
    let x = random([2, 4, 24], 21, &device).require_grad();
    let (y, router) = moe.forward(x.clone(), Routing::for_device(&x.device()));
    assert_eq!(
        router.expert_counts[5], 8,
        "the bias put expert 5 in every top-2"
    );

    // Reference: selection = top-2 of (p + bias), weights = the unbiased p of those experts.
    let n = 8;
    let xf = x.clone().reshape([n, 24]);
    let probs = burn::tensor::activation::softmax(moe.gate.forward(xf.clone()), 1);
    let p: Vec<f32> = probs.clone().try_into_vec_as::<f32>().unwrap();
    let b = [0.0f32, 0.0, 0.0, 0.0, 0.0, 5.0];
    let mut routing = vec![0.0f32; n * 6];
    let mut unbiased_top2_has_5 = 0;
    for t in 0..n {
        let row = &p[t * 6..(t + 1) * 6];
        let mut order: Vec<usize> = (0..6).collect();
        order.sort_by(|&i, &j| (row[j] + b[j]).total_cmp(&(row[i] + b[i])));
        for &e in &order[..2] {
            routing[t * 6 + e] = row[e];
        }
        let mut plain: Vec<usize> = (0..6).collect();
        plain.sort_by(|&i, &j| row[j].total_cmp(&row[i]));
        unbiased_top2_has_5 += usize::from(plain[..2].contains(&5));
    }
    assert!(
        unbiased_top2_has_5 < n,
        "without the bias expert 5 is not always chosen"
    );
    let routing = Tensor::<2>::from_data(TensorData::new(routing, [n, 6]), &device);
    let mut want = Tensor::<2>::zeros([n, 24], &device);
    for (e, expert) in moe.experts.iter().enumerate() {
        want = want + expert.forward(xf.clone()) * routing.clone().narrow(1, e, 1);
    }
    let diff = max_diff(y.clone().reshape([n, 24]), want);
    assert!(
        diff <= TOL,
        "combine weights are not the unbiased probabilities: {diff}"
    );
    let grads = y.sum().backward();
    assert!(
        moe.routing_bias
            .as_ref()
            .unwrap()
            .val()
            .grad(&grads)
            .is_none()
    );
}
