//! `x @ W` of the projections, with a hand-written backward.
//!
//! Inputs are read in place when contiguous at any offset: the row groups the MoE layer narrows
//! out of its gathered tokens cost no copy.
//!
//! Burn's `linear` on a `[b, t, d_in]` input runs a batched matmul against the broadcast weight,
//! and its backward forms the weight gradient per batch row before summing them; Flex allocates
//! each product's output zeroed and then copies it into aligned storage. Here the rows are
//! flattened into one product each way, every product goes straight into its output (not
//! zeroed first), and the transposed operands of the backward are read through strides:
//! `dx = dy W^T` and `dW = x^T dy`, the latter only when `W` is trainable (a frozen base weight
//! under LoRA costs no `dW` product).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor, TensorData};

use super::mm::Threads;
use super::products::{Precision, mm_matrix_new, mm_new_in};
use super::{Elements, flex_training, precision};

/// Backends with the fused projection: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedLinear: Backend {
    /// `x @ w` for `x: [n, k]`, `w: [k, m]` -> `[n, m]`.
    fn linear_rows(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl FusedLinear for Flex {
    fn linear_rows(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        product(&x, &w)
    }
}

impl<C: CheckpointStrategy> FusedLinear for Autodiff<Flex, C> {
    fn linear_rows(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct LinearBackward;

        impl Backward<Flex, 2> for LinearBackward {
            /// `x` when `w` needs its gradient, `w` when `x` does; the forward's precision,
            /// which the backward's products keep.
            type State = (Option<FlexTensor>, Option<FlexTensor>, Precision);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_w] = ops.parents;
                let dy = grads.consume::<Flex>(&ops.node);
                let (x, w, precision) = ops.state;
                if let (Some(node), Some(w)) = (node_x, w) {
                    grads.register::<Flex>(node.id, input_gradient(&dy, &w, precision));
                }
                if let (Some(node), Some(x)) = (node_w, x) {
                    grads.register::<Flex>(node.id, weight_gradient(&x, &dy, precision));
                }
            }
        }

        let (keep_x, keep_w) = (w.is_tracked(), x.is_tracked());
        match LinearBackward
            .prepare::<C>([x.node(), w.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), w.primitive().clone());
                let y = product(&xp, &wp);
                let state = (keep_x.then_some(xp), keep_w.then_some(wp), precision());
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(product(x.primitive(), w.primitive())),
        }
    }
}

/// `x @ w` over the last axis of `x` through the fused projection on Flex (autodiff or not),
/// computed in f32; `None` elsewhere, for Burn's `linear`. `x` is f32; `w` f32, or bf16 when it
/// is frozen (LoRA's base weights): kept in bf16 for the backward too, and widened a block at a
/// time inside each product.
///
/// # Shapes
/// - `x`: `[..., k]`, `w`: `[k, m]` -> `[..., m]`
pub fn linear_rows<const D: usize>(x: &Tensor<D>, w: &Tensor<2>) -> Option<Tensor<D>> {
    let dims = x.dims();
    let [k, m] = w.dims();
    if !flex_training(&x.device())
        || x.dtype() != DType::F32
        || !(w.dtype() == DType::F32 || (w.dtype() == DType::BF16 && !w.is_tracked()))
        || dims[D - 1] != k
    {
        return None;
    }
    let n: usize = dims[..D - 1].iter().product();
    let y = Tensor::<2>::from_dispatch(<Dispatch as FusedLinear>::linear_rows(
        x.clone().reshape([n, k]).into_dispatch(),
        w.clone().into_dispatch(),
    ));
    let mut out = dims;
    out[D - 1] = m;
    Some(y.reshape(out))
}

/// `x @ w^T` over the last axis of `x` for a row-major `w: [m, k]` read in place (the tied LM
/// head, `embed_tokens`), f32 or bf16 (a bf16 product, [`mm_matrix_new`]), on plain Flex without
/// autodiff (inference); `None` elsewhere, for the composed product.
///
/// # Shapes
/// - `x`: `[..., k]`, `w`: `[m, k]` -> `[..., m]`
pub fn linear_rows_transposed<const D: usize>(x: &Tensor<D>, w: &Tensor<2>) -> Option<Tensor<D>> {
    let dims = x.dims();
    let [m, k] = w.dims();
    if !super::flex_inference(&x.device())
        || x.dtype() != DType::F32
        || !matches!(w.dtype(), DType::F32 | DType::BF16)
        || dims[D - 1] != k
    {
        return None;
    }
    let n: usize = dims[..D - 1].iter().product();
    let y = Tensor::<2>::from_dispatch(<Dispatch as TransposedLinear>::linear_rows_transposed(
        x.clone().reshape([n, k]).into_dispatch(),
        w.clone().into_dispatch(),
    ));
    let mut out = dims;
    out[D - 1] = m;
    Some(y.reshape(out))
}

/// Backends with [`linear_rows_transposed`]: Flex; the function sends no other device here.
#[backend_extension(Flex)]
pub trait TransposedLinear: Backend {
    /// `x @ w^T` for `x: [n, k]`, `w: [m, k]` -> `[n, m]`.
    fn linear_rows_transposed(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(x, Self::float_transpose(w))
    }
}

impl TransposedLinear for Flex {
    fn linear_rows_transposed(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let (n, k, m) = (
            x.layout().shape()[0],
            x.layout().shape()[1],
            w.layout().shape()[0],
        );
        let (x, w) = (Elements::of(&x), Elements::of(&w));
        let a = (x.f32(), k, 1);
        let y = mm_matrix_new(precision(), n, a, w.matrix(), [m, k], true, Threads::All);
        FlexTensor::from_data(TensorData::new(y, [n, m]))
    }
}

/// `[n, k] @ [k, m]`; `w` f32 or bf16 ([`mm_matrix_new`]).
pub(crate) fn product(x: &FlexTensor, w: &FlexTensor) -> FlexTensor {
    let (n, k, m) = (
        x.layout().shape()[0],
        w.layout().shape()[0],
        w.layout().shape()[1],
    );
    let (x, w) = (Elements::of(x), Elements::of(w));
    let a = (x.f32(), k, 1);
    let y = mm_matrix_new(precision(), n, a, w.matrix(), [k, m], false, Threads::All);
    FlexTensor::from_data(TensorData::new(y, [n, m]))
}

/// `dx = dy @ w^T`: `[n, m] @ [m, k]`, `w^T` read through strides (f32 or bf16, [`mm_matrix_new`]).
pub(crate) fn input_gradient(dy: &FlexTensor, w: &FlexTensor, precision: Precision) -> FlexTensor {
    let (n, m) = (dy.layout().shape()[0], dy.layout().shape()[1]);
    let k = w.layout().shape()[0];
    let (dy, w) = (Elements::of(dy), Elements::of(w));
    let a = (dy.f32(), m, 1);
    let dx = mm_matrix_new(precision, n, a, w.matrix(), [k, m], true, Threads::All);
    FlexTensor::from_data(TensorData::new(dx, [n, k]))
}

/// `dw = x^T @ dy`: `[k, n] @ [n, m]`, `x^T` read through strides.
pub(crate) fn weight_gradient(x: &FlexTensor, dy: &FlexTensor, precision: Precision) -> FlexTensor {
    let (n, k) = (x.layout().shape()[0], x.layout().shape()[1]);
    let m = dy.layout().shape()[1];
    let (x, dy) = (Elements::of(x), Elements::of(dy));
    let (a, b) = ((x.f32(), 1, k), (dy.f32(), m, 1));
    let dw = mm_new_in(precision, k, m, n, a, b, Threads::All);
    FlexTensor::from_data(TensorData::new(dw, [k, m]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    /// Values and both gradients against Burn's `linear`, 2-D and 3-D inputs.
    #[test]
    fn fused_linear_matches_burn_linear() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        for (b, t, k, m) in [(2, 5, 7, 3), (8, 64, 96, 40), (1, 300, 33, 65)] {
            let x = Tensor::<3>::random([b, t, k], normal, &device).require_grad();
            let w = Tensor::<2>::random([k, m], normal, &device).require_grad();
            let dy = Tensor::<3>::random([b, t, m], normal, &device);
            let fused = linear_rows(&x, &w).expect("flex autodiff takes the kernel");
            let reference = burn::tensor::module::linear(x.clone(), w.clone(), None);
            let value = (fused.clone() - reference.clone())
                .abs()
                .max()
                .into_scalar::<f32>();
            assert!(
                value <= 1e-5 * (k as f32).sqrt(),
                "{b}x{t}x{k}x{m}: values differ by {value}"
            );
            let ga = (fused * dy.clone()).sum().backward();
            let gb = (reference * dy).sum().backward();
            for (name, grad_a, grad_b) in [
                (
                    "x",
                    x.grad(&ga).unwrap().reshape([b * t, k]),
                    x.grad(&gb).unwrap().reshape([b * t, k]),
                ),
                ("w", w.grad(&ga).unwrap(), w.grad(&gb).unwrap()),
            ] {
                let scale = grad_b.clone().abs().max().into_scalar::<f32>();
                let diff = (grad_a - grad_b).abs().max().into_scalar::<f32>();
                assert!(
                    diff <= 1e-5 * scale.max(1.0),
                    "{b}x{t}x{k}x{m} d{name}: {diff}"
                );
            }
        }
    }

    /// At bf16 precision, the value and both gradients equal the f32 products of the
    /// bf16-rounded operands (on this CPU's path, printed), and differ from the f32 ones; the
    /// backward keeps the forward's precision wherever it runs.
    #[test]
    fn bf16_products_equal_the_f32_products_of_rounded_operands() {
        use crate::{Precision, bf16_path, with_precision};
        println!("bf16 path: {:?}", bf16_path());
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        let round = |t: Tensor<2>| t.cast(DType::BF16).cast(DType::F32);
        let (n, k, m) = (70, 300, 45);
        let x = Tensor::<2>::random([n, k], normal, &device).require_grad();
        let w = Tensor::<2>::random([k, m], normal, &device).require_grad();
        let dy = round(Tensor::<2>::random([n, m], normal, &device));
        let y = with_precision(Precision::Bf16, || linear_rows(&x, &w)).unwrap();
        // The backward runs outside the setting: it keeps the forward's precision.
        let grads = (y.clone() * dy.clone()).sum().backward();
        let (xr, wr) = (round(x.clone().detach()), round(w.clone().detach()));
        let expected = [
            ("y", y.detach(), xr.clone().matmul(wr.clone())),
            (
                "dx",
                x.grad(&grads).unwrap(),
                dy.clone().matmul(wr.transpose()),
            ),
            (
                "dw",
                w.grad(&grads).unwrap(),
                xr.transpose().matmul(dy.clone()),
            ),
        ];
        let y32 = linear_rows(&x, &w).unwrap();
        let grads32 = (y32.clone() * dy).sum().backward();
        let f32s = [
            y32.detach(),
            x.grad(&grads32).unwrap(),
            w.grad(&grads32).unwrap(),
        ];
        for ((name, found, reference), f32) in expected.into_iter().zip(f32s) {
            let diff = (found.clone() - reference).abs().max().into_scalar::<f32>();
            assert!(diff <= 2e-5 * (k as f32).sqrt(), "{name}: off by {diff}");
            let from_f32 = (found - f32).abs().max().into_scalar::<f32>();
            assert!(from_f32 > 1e-3, "{name}: the f32 product ran ({from_f32})");
        }
    }

    /// Under a [`crate::keep_packed_weights`] guard a frozen bf16 weight is packed once and
    /// kept: its products (as is, and transposed as the tied LM head reads it) give the bits of
    /// the products that pack it every call, and the kept copies go with the guard. Where the
    /// CPU lacks the kernel nothing is kept.
    #[test]
    fn kept_packed_weights_give_the_bits_of_packing_every_call() {
        use crate::bf16::{bf16_path, kept_packed_forms};
        let device = Device::flex();
        let normal = Distribution::Normal(0.0, 1.0);
        let (n, k, m) = (37, 600, 90);
        let x = Tensor::<2>::random([n, k], normal, &device);
        let xt = Tensor::<2>::random([n, m], normal, &device);
        let w = Tensor::<2>::random([k, m], normal, &device).cast(DType::BF16);
        let bits = |t: Tensor<2>| -> Vec<u32> {
            let v = t.into_data().try_to_vec::<f32>().unwrap();
            v.into_iter().map(f32::to_bits).collect()
        };
        let products = || {
            let y = bits(linear_rows(&x, &w).unwrap());
            let yt = bits(linear_rows_transposed(&xt, &w).unwrap());
            (y, yt)
        };
        let each_call = products();
        let guard = crate::keep_packed_weights();
        let first = products();
        let kept = kept_packed_forms();
        let second = products();
        drop(guard);
        assert_eq!(first, each_call, "the products that packed the weight");
        assert_eq!(second, each_call, "the products that read the kept packing");
        let expected = if bf16_path().has_kernel() { 2 } else { 0 };
        println!("bf16 path {:?}: {kept} packed forms kept", bf16_path());
        assert!(
            kept >= expected && (expected > 0 || kept == 0),
            "{kept} packed forms kept"
        );
        assert_eq!(kept_packed_forms(), 0, "kept past the guard");
    }

    /// A frozen weight gets no gradient; the input's is still formed.
    #[test]
    fn a_frozen_weight_gets_no_gradient() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<2>::random([4, 6], normal, &device).require_grad();
        let w = Tensor::<2>::random([6, 5], normal, &device);
        let grads = linear_rows(&x, &w).unwrap().sum().backward();
        assert!(w.grad(&grads).is_none());
        let expected = w.clone().sum_dim(1).reshape([1, 6]).expand([4, 6]);
        let diff = (x.grad(&grads).unwrap() - expected)
            .abs()
            .max()
            .into_scalar::<f32>();
        assert!(diff <= 1e-5, "input gradient differs by {diff}");
    }
}
