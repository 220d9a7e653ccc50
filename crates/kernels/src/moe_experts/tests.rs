//! The fused experts against the composed per-expert path: values and gradients.

use super::*;
use burn::tensor::activation::silu;
use burn::tensor::{Device, Distribution, IndexingUpdateOp, TensorData};

/// Every expert on every token, weighted by a dense `[n, E]` routing matrix that is zero
/// outside each token's slots: Burn's own ops only.
fn composed(
    x: Tensor<2>,
    gate: Tensor<3>,
    up: Tensor<3>,
    down: Tensor<3>,
    w: Tensor<2>,
    ids: Tensor<2, Int>,
) -> Tensor<2> {
    let [n, h] = x.dims();
    let [e, _, i] = gate.dims();
    let routing = Tensor::<2>::zeros([n, e], &x.device()).scatter(1, ids, w, IndexingUpdateOp::Add);
    let mut y = Tensor::<2>::zeros([n, h], &x.device());
    for ex in 0..e {
        let pick = |m: &Tensor<3>, r: usize, c: usize| m.clone().narrow(0, ex, 1).reshape([r, c]);
        let a = silu(x.clone().matmul(pick(&gate, h, i))) * x.clone().matmul(pick(&up, h, i));
        let out = a.matmul(pick(&down, i, h));
        y = y + out * routing.clone().narrow(1, ex, 1);
    }
    y
}

/// Values and all five gradients against the composed experts, with an expert that gets no
/// tokens, on Flex with autodiff.
#[test]
fn fused_experts_match_the_composed_ops() {
    let device = Device::flex().autodiff();
    let normal = Distribution::Normal(0.0, 1.0);
    let (n, k, h, i, e) = (13, 2, 8, 6, 5);
    // Distinct experts per token; expert 4 is never chosen.
    let ids: Vec<i64> = (0..n as i64)
        .flat_map(|t| [t % 4, (t + 1 + t % 3) % 4])
        .collect();
    assert!(ids.chunks(2).all(|p| p[0] != p[1]));
    let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [n, k]), &device);
    let x = Tensor::<2>::random([n, h], normal, &device).require_grad();
    let gate = Tensor::<3>::random([e, h, i], normal, &device).require_grad();
    let up = Tensor::<3>::random([e, h, i], normal, &device).require_grad();
    let down = Tensor::<3>::random([e, i, h], normal, &device).require_grad();
    let w = Tensor::<2>::random([n, k], Distribution::Uniform(0.1, 1.0), &device).require_grad();
    let dy = Tensor::<2>::random([n, h], normal, &device);
    let fused = moe_experts(&x, &gate, &up, &down, &w, &ids).expect("flex takes the kernel");
    let reference = composed(
        x.clone(),
        gate.clone(),
        up.clone(),
        down.clone(),
        w.clone(),
        ids.clone(),
    );
    let scale = reference.clone().abs().max().into_scalar::<f32>();
    let value = (fused.clone() - reference.clone())
        .abs()
        .max()
        .into_scalar::<f32>();
    assert!(value <= 1e-5 * scale.max(1.0), "values differ by {value}");
    let ga = (fused * dy.clone()).sum().backward();
    let gb = (reference * dy).sum().backward();
    let check = |name: &str, a: Tensor<2>, b: Tensor<2>| {
        let scale = b.clone().abs().max().into_scalar::<f32>();
        let diff = (a - b).abs().max().into_scalar::<f32>();
        assert!(
            diff <= 1e-5 * scale.max(1.0),
            "d{name} differs by {diff} (scale {scale})"
        );
    };
    check("x", x.grad(&ga).unwrap(), x.grad(&gb).unwrap());
    check("w", w.grad(&ga).unwrap(), w.grad(&gb).unwrap());
    for (name, m) in [("gate", &gate), ("up", &up), ("down", &down)] {
        let (a, b) = (m.grad(&ga).unwrap(), m.grad(&gb).unwrap());
        let [ee, r, c] = a.dims();
        check(name, a.reshape([ee * r, c]), b.reshape([ee * r, c]));
    }
    // The unused expert's gradients are zero.
    let unused = gate
        .grad(&ga)
        .unwrap()
        .narrow(0, 4, 1)
        .abs()
        .max()
        .into_scalar::<f32>();
    assert_eq!(unused, 0.0);
}
