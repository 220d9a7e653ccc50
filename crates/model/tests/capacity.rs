//! The training-time expert capacity (`router_capacity_factor`): the assignment keeps every
//! expert under its limit at every prefix of a sequence, gives every token `k` distinct experts,
//! is causal and per sequence, changes nothing when the limit does not bind, and balances a
//! router that cannot tell tokens apart; a MoE layer's training forward uses it and reports the
//! router's own (uncapped) choice beside it.

use burn::tensor::{Device, Distribution, Tensor};
use qwen_burn_model::Qwen3Config;
use qwen_burn_model::moe::{Routing, SparseMoe, capacity_limited_topk};
use serde_json::json;

/// Deterministic pseudo-random scores.
fn scores(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32) / (1u64 << 24) as f32
        })
        .collect()
}

fn cap(factor: f64, p: usize, k: usize, e: usize) -> usize {
    ((factor * ((p + 1) * k) as f64 / e as f64).ceil() as usize).max(1)
}

#[test]
fn every_prefix_stays_under_the_capacity_with_k_distinct_experts() {
    let (rows, t, e, k) = (3, 50, 8, 2);
    for factor in [1.0, 1.1, 1.25, 2.0] {
        // Row 0 random; rows 1 and 2: every token ranks the experts the same way (a collapsed
        // router), so the limit decides everything.
        let mut sc = scores(rows * t * e, 3);
        for r in 1..rows {
            for p in 0..t {
                for x in 0..e {
                    sc[(r * t + p) * e + x] = (e - x) as f32 + 0.001 * r as f32;
                }
            }
        }
        let ids = capacity_limited_topk(&sc, rows, t, e, k, factor, None);
        assert_eq!(ids.len(), rows * t * k);
        for r in 0..rows {
            let mut load = vec![0usize; e];
            for p in 0..t {
                let chosen = &ids[(r * t + p) * k..(r * t + p + 1) * k];
                assert!(chosen[0] != chosen[1], "factor {factor}: {chosen:?}");
                for &x in chosen {
                    load[x as usize] += 1;
                }
                let limit = cap(factor, p, k, e);
                assert!(
                    load.iter().all(|&l| l <= limit),
                    "factor {factor}, row {r}, position {p}: loads {load:?} over {limit}"
                );
            }
            // Over the whole row of the collapsed router: max/mean within the factor (plus the
            // rounding of the limit), every expert used when the factor leaves room.
            let mean = (t * k) as f64 / e as f64;
            let max = *load.iter().max().unwrap() as f64;
            assert!(max <= cap(factor, t - 1, k, e) as f64, "{load:?}");
            if factor < e as f64 / (e - 1) as f64 {
                assert!(load.iter().all(|&l| l > 0), "factor {factor}: {load:?}");
                assert!(
                    max / mean <= factor + 1.0 / mean,
                    "factor {factor}: {load:?}"
                );
            }
        }
    }
}

#[test]
fn the_assignment_is_causal_per_sequence_and_plain_top_k_when_the_limit_does_not_bind() {
    let (rows, t, e, k) = (2, 40, 8, 2);
    let sc = scores(rows * t * e, 9);
    let ids = capacity_limited_topk(&sc, rows, t, e, k, 1.1, None);
    // Later tokens of row 0 and all of row 1 change: row 0's first 20 tokens keep their experts.
    let mut other = sc.clone();
    for (i, v) in other.iter_mut().enumerate() {
        if i >= 20 * e {
            *v = 1.0 - *v;
        }
    }
    let moved = capacity_limited_topk(&other, rows, t, e, k, 1.1, None);
    assert_eq!(&ids[..20 * k], &moved[..20 * k]);
    // A row alone routes as inside the batch.
    let alone = capacity_limited_topk(&sc[t * e..], 1, t, e, k, 1.1, None);
    assert_eq!(&ids[t * k..], &alone[..]);
    // A limit that never binds: each token's best k, best first.
    let free = capacity_limited_topk(&sc, rows, t, e, k, e as f64 / k as f64 * 2.0, None);
    for i in 0..rows * t {
        let s = &sc[i * e..(i + 1) * e];
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        let want: Vec<i64> = order[..k].iter().map(|&x| x as i64).collect();
        assert_eq!(&free[i * k..(i + 1) * k], &want[..], "token {i}");
    }
}

#[test]
fn each_packed_document_is_routed_as_if_alone() {
    // One row of three documents (lengths 30, 25, 45) against each document alone, on scores
    // that rank the experts alike for every token (so the capacity binds everywhere).
    let (e, k, lens) = (8, 2, [30usize, 25, 45]);
    let t: usize = lens.iter().sum();
    let noise = scores(t * e, 5);
    let sc: Vec<f32> = (0..t * e)
        .map(|i| (i % e) as f32 + 0.01 * noise[i])
        .collect();
    let positions: Vec<u32> = lens.iter().flat_map(|&n| 0..n as u32).collect();
    let packed = capacity_limited_topk(&sc, 1, t, e, k, 1.1, Some(&positions));
    let mut start = 0;
    for &n in &lens {
        let alone = capacity_limited_topk(&sc[start * e..(start + n) * e], 1, n, e, k, 1.1, None);
        assert_eq!(
            &packed[start * k..(start + n) * k],
            &alone[..],
            "document at {start}"
        );
        start += n;
    }
    // Counting the row as one sequence routes the later documents differently.
    let whole = capacity_limited_topk(&sc, 1, t, e, k, 1.1, None);
    assert_ne!(&whole[30 * k..], &packed[30 * k..]);
}

#[test]
fn a_training_forward_routes_under_the_capacity_and_reports_the_uncapped_choice() {
    let config = Qwen3Config::from_json(
        &json!({
            "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 8, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 8, "norm_topk_prob": true,
            "router_capacity_factor": 1.1,
        }),
        true,
    )
    .unwrap();
    let moe_config = config.moe.clone().unwrap();
    for autodiff in [true, false] {
        let device = if autodiff {
            Device::flex().autodiff()
        } else {
            Device::flex()
        };
        let layer = SparseMoe::new(&config, &moe_config, &device);
        // Every token nearly the same vector: the router ranks the experts the same way for all.
        let base = Tensor::<3>::random([1, 1, 16], Distribution::Normal(0.0, 1.0), &device);
        let noise = Tensor::<3>::random([2, 64, 16], Distribution::Normal(0.0, 1e-4), &device);
        let x = base.expand([2, 64, 16]) + noise;
        let (_, router) = layer.forward(x, Routing::for_device(&device));
        let counts = &router.expert_counts;
        assert_eq!(counts.iter().sum::<usize>(), 2 * 64 * 2);
        if autodiff {
            // 2 rows x at most ceil(1.1 * 128 / 8) = 18 slots per expert.
            assert!(counts.iter().all(|&c| c > 0 && c <= 36), "{counts:?}");
            let uncapped = router.uncapped_counts.expect("uncapped counts");
            assert_eq!(*uncapped.iter().max().unwrap(), 128, "{uncapped:?}");
        } else {
            // Inference routes as HF: all tokens on the same two experts.
            assert_eq!(router.uncapped_counts, None);
            assert_eq!(*counts.iter().max().unwrap(), 128, "{counts:?}");
        }
    }
}

/// The assignment loss against a direct f64 computation (values, with padding), and its
/// gradient against central finite differences.
#[test]
fn the_assignment_loss_is_the_cross_entropy_against_the_capped_assignment() {
    use burn::tensor::{Int, TensorData};
    use qwen_burn_model::assignment_loss;
    let device = Device::flex().autodiff();
    let (n, e, k) = (6, 5, 2);
    let raw: Vec<f32> = scores(n * e, 3).iter().map(|x| 4.0 * x - 2.0).collect();
    let ids: Vec<i64> = vec![0, 1, 2, 3, 4, 0, 1, 3, 2, 4, 3, 0];
    let ids_t = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [n, k]), &device);
    // Tokens 4 and 5 are padding (a [2, 3] batch whose second row ends in padding).
    let mask_v = vec![1.0f32, 1.0, 1.0, 1.0, 0.0, 0.0];
    let mask = Tensor::<2>::from_data(TensorData::new(mask_v, [2, 3]), &device);
    let want = |v: &[f32]| -> f64 {
        let mut total = 0.0;
        for t in 0..4 {
            let row: Vec<f64> = v[t * e..(t + 1) * e]
                .iter()
                .map(|&x| f64::from(x))
                .collect();
            let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
            for j in 0..k {
                total -= row[ids[t * k + j] as usize] - lse;
            }
        }
        total / (4.0 * k as f64)
    };
    let logits =
        Tensor::<2>::from_data(TensorData::new(raw.clone(), [n, e]), &device).require_grad();
    let loss =
        assignment_loss(std::slice::from_ref(&logits), &[ids_t], Some(&mask)).expect("a loss");
    let got = f64::from(loss.clone().into_scalar::<f32>());
    assert!((got - want(&raw)).abs() < 1e-6, "{got} vs {}", want(&raw));
    let grads = loss.backward();
    let g: Vec<f32> = logits
        .grad(&grads)
        .unwrap()
        .try_into_vec_as::<f32>()
        .unwrap();
    let h = 1e-3f32;
    for i in [0, 7, 13, 19, 22, 29] {
        let (mut up, mut down) = (raw.clone(), raw.clone());
        up[i] += h;
        down[i] -= h;
        let fd = (want(&up) - want(&down)) / (2.0 * f64::from(h));
        assert!(
            (f64::from(g[i]) - fd).abs() < 1e-4,
            "logit {i}: {} vs {fd}",
            g[i]
        );
    }
    // Padding tokens get no gradient.
    assert!(g[4 * e..].iter().all(|&x| x == 0.0));
    // No pair, no loss.
    assert!(assignment_loss(&[logits], &[], None).is_none());
}
