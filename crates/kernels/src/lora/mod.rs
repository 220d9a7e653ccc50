//! A LoRA projection `x @ w + s (x @ a) @ b` as one op, with a hand-written backward.
//!
//! Composed, the projection is three products, a scale and an add, each a node of the autodiff
//! graph with its own output buffer, and the backward adds the input's two gradients: the adds
//! read two `[n, m]` (or `[n, k]`) tensors to write a third, and the scale makes one more
//! `[n, r]` pass each way. Here the adapter's share `s (x @ a) @ b` is added to the frozen
//! weight's product as the bf16 kernel stores each tile ([`crate::bf16::LowRank`]; on other
//! paths `gemm` accumulates it onto the product's buffer), and the input's gradient
//! `s dlow @ a^T` onto `dy @ w^T` the same way; every other product is the composed path's own
//! ([`crate::linear`]'s `product`, `input_gradient`, `weight_gradient`: `gemm` for the
//! adapters', the bf16 kernel for the bf16 `w`), so the numbers are its numbers.
//!
//! Hand-written products for the rank-`r` side (each wide row against `r` columns, in place)
//! were slower than `gemm` on the 1.7B shapes (`benches/README.md`, twentieth session).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor, TensorData};

use crate::bf16::LowRank;
use crate::linear::{input_gradient, product, weight_gradient};
use crate::mm::Threads;
use crate::products::{Precision, mm_matrix_new_low};
use crate::{Elements, dense, flex_training, precision};

#[cfg(test)]
mod tests;

/// Backends with the fused LoRA projection: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedLoraProjection: Backend {
    /// `x @ w + scale (x @ a) @ b` for `x: [n, k]`, a frozen `w: [k, m]`, `a: [k, r]`,
    /// `b: [r, m]` -> `[n, m]`.
    fn lora_projection(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self>;
}

impl FusedLoraProjection for Flex {
    fn lora_projection(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        forward(&x, &w, &a, &b, scale).1
    }
}

/// What the backward keeps: `x`, `w`, `a`, `b`, the scaled rank-`r` intermediate
/// `s (x @ a)`, the scale and the forward's precision.
#[derive(Clone, Debug)]
struct Saved {
    x: FlexTensor,
    w: FlexTensor,
    a: FlexTensor,
    b: FlexTensor,
    low: FlexTensor,
    scale: f32,
    precision: Precision,
}

impl<C: CheckpointStrategy> FusedLoraProjection for Autodiff<Flex, C> {
    fn lora_projection(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct LoraProjectionBackward;

        impl Backward<Flex, 3> for LoraProjectionBackward {
            type State = Saved;

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_a, node_b] = ops.parents;
                let dy = dense(&grads.consume::<Flex>(&ops.node));
                let want = [node_x.is_some(), node_a.is_some(), node_b.is_some()];
                let [dx, da, db] = gradients(&dy, &ops.state, want);
                for (node, grad) in [(node_x, dx), (node_a, da), (node_b, db)] {
                    if let (Some(node), Some(grad)) = (node, grad) {
                        grads.register::<Flex>(node.id, grad);
                    }
                }
            }
        }

        let wp = w.primitive().clone();
        match LoraProjectionBackward
            .prepare::<C>([x.node(), a.node(), b.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (xp, ap, bp) = (
                    dense(x.primitive()),
                    dense(a.primitive()),
                    dense(b.primitive()),
                );
                let (low, y) = forward(&xp, &wp, &ap, &bp, scale);
                let saved = Saved {
                    x: xp,
                    w: wp,
                    a: ap,
                    b: bp,
                    low,
                    scale,
                    precision: precision(),
                };
                prep.finish(saved, y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(forward(x.primitive(), &wp, a.primitive(), b.primitive(), scale).1)
            }
        }
    }
}

/// `(s (x @ a), x @ w + s (x @ a) @ b)` at the current precision.
fn forward(
    x: &FlexTensor,
    w: &FlexTensor,
    a: &FlexTensor,
    b: &FlexTensor,
    scale: f32,
) -> (FlexTensor, FlexTensor) {
    let ((n, k), (r, m)) = (dims(x), dims(b));
    let mut low = product(x, a);
    low.storage_mut::<f32>()
        .iter_mut()
        .for_each(|v| *v *= scale);
    let (xe, we, be) = (Elements::of(x), Elements::of(w), Elements::of(b));
    let share = LowRank {
        l: low.storage::<f32>(),
        r: be.f32(),
        rank: r,
    };
    let y = mm_matrix_new_low(
        precision(),
        n,
        (xe.f32(), k, 1),
        we.matrix(),
        [k, m],
        false,
        share,
        Threads::All,
    );
    (low, FlexTensor::from_data(TensorData::new(y, [n, m])))
}

/// The gradients of `x`, `a` and `b` where `want`ed, at the forward's precision. With
/// `low = s (x @ a)`: `dlow = dy @ b^T`, `db = low^T dy`, `da = s x^T dlow`,
/// `dx = dy @ w^T + s dlow @ a^T`.
fn gradients(dy: &FlexTensor, saved: &Saved, want: [bool; 3]) -> [Option<FlexTensor>; 3] {
    let Saved {
        x,
        w,
        a,
        b,
        low,
        scale,
        precision,
    } = saved;
    let db = want[2].then(|| weight_gradient(low, dy, *precision));
    if !want[0] && !want[1] {
        return [None, None, db];
    }
    let mut dlow = input_gradient(dy, b, *precision);
    dlow.storage_mut::<f32>()
        .iter_mut()
        .for_each(|v| *v *= scale);
    let da = want[1].then(|| weight_gradient(x, &dlow, *precision));
    let dx = want[0].then(|| {
        let ((n, k), (r, m)) = (dims(x), dims(b));
        // `a^T` row-major, the share's right operand.
        let a = a.storage::<f32>();
        let at: Vec<f32> = (0..r * k).map(|i| a[(i % k) * r + i / k]).collect();
        let share = LowRank {
            l: dlow.storage::<f32>(),
            r: &at,
            rank: r,
        };
        let (dy, w) = (Elements::of(dy), Elements::of(w));
        let a = (dy.f32(), m, 1);
        let dx = mm_matrix_new_low(
            *precision,
            n,
            a,
            w.matrix(),
            [k, m],
            true,
            share,
            Threads::All,
        );
        FlexTensor::from_data(TensorData::new(dx, [n, k]))
    });
    [dx, da, db]
}

/// The two dimensions of a 2-D tensor.
fn dims(t: &FlexTensor) -> (usize, usize) {
    let s = t.layout().shape();
    (s[0], s[1])
}

/// `x @ w + scale (x @ a) @ b` over the last axis of `x` through the fused LoRA projection on
/// Flex (autodiff or not) at f32 precision; `None` elsewhere, for the composed products. `x`,
/// `a` and `b` are f32; `w` is frozen (not tracked) and bf16. An f32 `w` takes the composed
/// products: on the 0.6B LoRA shape with an f32 base the fused op measured 3% slower a step
/// (`benches/README.md`, twentieth session), where with a bf16 base it is as fast or faster.
///
/// # Shapes
/// - `x`: `[..., k]`, `w`: `[k, m]`, `a`: `[k, r]`, `b`: `[r, m]` -> `[..., m]`
pub fn lora_projection<const D: usize>(
    x: &Tensor<D>,
    w: &Tensor<2>,
    a: &Tensor<2>,
    b: &Tensor<2>,
    scale: f32,
) -> Option<Tensor<D>> {
    let dims = x.dims();
    let ([k, r], [r2, m]) = (a.dims(), b.dims());
    if !flex_training(&x.device())
        || precision() != Precision::F32
        || [x.dtype(), a.dtype(), b.dtype()] != [DType::F32; 3]
        || w.dtype() != DType::BF16
        || w.is_tracked()
        || w.dims() != [k, m]
        || dims[D - 1] != k
        || r != r2
    {
        return None;
    }
    let n: usize = dims[..D - 1].iter().product();
    let y = Tensor::<2>::from_dispatch(<Dispatch as FusedLoraProjection>::lora_projection(
        x.clone().reshape([n, k]).into_dispatch(),
        w.clone().into_dispatch(),
        a.clone().into_dispatch(),
        b.clone().into_dispatch(),
        scale,
    ));
    let mut out = dims;
    out[D - 1] = m;
    Some(y.reshape(out))
}
