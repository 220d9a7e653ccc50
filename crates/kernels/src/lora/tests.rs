use super::*;
use burn::tensor::{Device, Distribution};

/// Value and the three gradients against the composed products (`linear_rows(x, w)` plus
/// `(x @ a) * s @ b` in Burn's matmul), with a bf16 frozen `w`, at ranks 5, 8 and 16 and
/// widths that are not multiples of the kernels' vectors.
#[test]
fn fused_lora_projection_matches_the_composed_products() {
    use crate::linear_rows;
    let device = Device::flex().autodiff();
    let normal = Distribution::Normal(0.0, 1.0);
    for (bt, t, k, r, m, scale) in [
        (1, 3, 37, 5, 70, 2.0),
        (2, 40, 256, 8, 192, 0.5),
        (1, 33, 160, 16, 64, 1.25),
    ] {
        let dtype = DType::BF16;
        let x = Tensor::<3>::random([bt, t, k], normal, &device).require_grad();
        let w = Tensor::<2>::random([k, m], normal, &device).cast(dtype);
        let a = Tensor::<2>::random([k, r], normal, &device).require_grad();
        let b = Tensor::<2>::random([r, m], normal, &device).require_grad();
        let dy = Tensor::<3>::random([bt, t, m], normal, &device);
        let fused = lora_projection(&x, &w, &a, &b, scale).expect("flex autodiff fuses");
        let low = x.clone().reshape([bt * t, k]).matmul(a.clone()) * scale;
        let base = linear_rows(&x, &w).expect("flex autodiff");
        let reference = base + low.matmul(b.clone()).reshape([bt, t, m]);
        let size = reference.clone().abs().max().into_scalar::<f32>();
        let diff = (fused.clone() - reference.clone())
            .abs()
            .max()
            .into_scalar::<f32>();
        let case = format!("{k}x{r}x{m} {dtype:?}");
        assert!(diff <= 1e-5 * size, "{case}: values differ by {diff}");
        let ga = (fused * dy.clone()).sum().backward();
        let gb = (reference * dy).sum().backward();
        assert!(
            w.grad(&ga).is_none(),
            "{case}: the frozen weight got a gradient"
        );
        for (name, found, expected) in [
            (
                "x",
                x.grad(&ga).unwrap().reshape([bt * t, k]),
                x.grad(&gb).unwrap().reshape([bt * t, k]),
            ),
            ("a", a.grad(&ga).unwrap(), a.grad(&gb).unwrap()),
            ("b", b.grad(&ga).unwrap(), b.grad(&gb).unwrap()),
        ] {
            let size = expected.clone().abs().max().into_scalar::<f32>();
            let diff = (found - expected).abs().max().into_scalar::<f32>();
            assert!(diff <= 1e-5 * size, "{case} d{name}: {diff} of {size}");
        }
    }
}

/// An untracked input (the first layer's, under frozen embeddings) gets no gradient and the
/// adapters still get theirs; at bf16 precision, with a tracked `w` and with an f32 `w` the
/// fused path is not taken (the composed products then follow the precision, train `w`, or
/// run an f32 base); plain Flex takes it.
#[test]
fn the_fused_path_takes_frozen_weights_at_f32_precision() {
    use crate::with_precision;
    let device = Device::flex().autodiff();
    let normal = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<2>::random([4, 8], normal, &device);
    let w32 = Tensor::<2>::random([8, 3], normal, &device);
    let w = w32.clone().cast(DType::BF16);
    let a = Tensor::<2>::random([8, 2], normal, &device).require_grad();
    let b = Tensor::<2>::random([2, 3], normal, &device).require_grad();
    let grads = lora_projection(&x, &w, &a, &b, 1.0)
        .expect("fused")
        .sum()
        .backward();
    assert!(x.grad(&grads).is_none());
    assert!(a.grad(&grads).is_some() && b.grad(&grads).is_some());
    assert!(with_precision(Precision::Bf16, || lora_projection(&x, &w, &a, &b, 1.0)).is_none());
    let tracked = w.clone().require_grad();
    assert!(lora_projection(&x, &tracked, &a, &b, 1.0).is_none());
    assert!(
        lora_projection(&x, &w32, &a, &b, 1.0).is_none(),
        "an f32 base"
    );
    let plain = Device::flex();
    let x = Tensor::<2>::random([4, 8], normal, &plain);
    let w = Tensor::<2>::random([8, 3], normal, &plain).cast(DType::BF16);
    let a = Tensor::<2>::random([8, 2], normal, &plain);
    let b = Tensor::<2>::random([2, 3], normal, &plain);
    assert!(lora_projection(&x, &w, &a, &b, 1.0).is_some());
}
