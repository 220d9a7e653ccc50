//! LoRA's adapter path `s (x @ a) @ b` as one op, with a hand-written backward.
//!
//! Composed, the path is two projections and a scale: four of its six products
//! (`x @ a`, `dy @ b^T`, `b`'s and `a`'s gradients) have the rank `r` on one side and went
//! through `gemm`, which packed the wide operand each time. Here those four read the wide
//! operand in place ([`skinny`]), and the two products that expand `r` columns to a wide output
//! (`low @ b` forward, `dlow @ a^T` backward) stay on `gemm`, which writes each output once.
//!
//! The numbers are f32 throughout (the adapters are f32 parameters); the frozen base weight's
//! product is not part of this op.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor, TensorData};

use crate::mm::{Threads, mm_new};
use crate::products::Precision;
use crate::{dense, flex_training, precision};

mod skinny;
#[cfg(test)]
mod tests;

use skinny::{rows_dot, rows_outer};

/// Backends with the fused adapter path: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedLoraDelta: Backend {
    /// `scale (x @ a) @ b` for `x: [n, k]`, `a: [k, r]`, `b: [r, m]` -> `[n, m]`.
    fn lora_delta(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self>;
}

impl FusedLoraDelta for Flex {
    fn lora_delta(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        forward(&x, &a, &b, scale).1
    }
}

impl<C: CheckpointStrategy> FusedLoraDelta for Autodiff<Flex, C> {
    fn lora_delta(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct LoraDeltaBackward;

        impl Backward<Flex, 3> for LoraDeltaBackward {
            /// `x`, `a`, `b`, the scaled rank-`r` intermediate `s (x @ a)` and the scale.
            type State = (FlexTensor, FlexTensor, FlexTensor, FlexTensor, f32);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_a, node_b] = ops.parents;
                let dy = dense(&grads.consume::<Flex>(&ops.node));
                let (x, a, b, low, scale) = ops.state;
                let g = gradients(&dy, &x, &a, &b, &low, scale);
                for (node, grad) in [(node_x, g.x), (node_a, g.a), (node_b, g.b)] {
                    if let Some(node) = node {
                        grads.register::<Flex>(node.id, grad);
                    }
                }
            }
        }

        match LoraDeltaBackward
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
                let (low, y) = forward(&xp, &ap, &bp, scale);
                prep.finish((xp, ap, bp, low, scale), y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(forward(x.primitive(), a.primitive(), b.primitive(), scale).1)
            }
        }
    }
}

/// `(s (x @ a), s (x @ a) @ b)`.
fn forward(x: &FlexTensor, a: &FlexTensor, b: &FlexTensor, scale: f32) -> (FlexTensor, FlexTensor) {
    let (x, a, b) = (dense(x), dense(a), dense(b));
    let (n, k) = dims(&x);
    let (r, m) = dims(&b);
    // `x @ a` as rows of `x` against the rows of `a^T` (`[r, k]`, a copy of `r k` floats).
    let at = transposed(a.storage::<f32>(), k, r);
    let mut low = rows_dot(x.storage::<f32>(), n, k, &at, r);
    low.iter_mut().for_each(|v| *v *= scale);
    let y = mm_new(
        n,
        m,
        r,
        (&low, r, 1),
        (b.storage::<f32>(), m, 1),
        Threads::All,
    );
    (
        FlexTensor::from_data(TensorData::new(low, [n, r])),
        FlexTensor::from_data(TensorData::new(y, [n, m])),
    )
}

/// The gradients of `x`, `a` and `b`.
struct Grads {
    x: FlexTensor,
    a: FlexTensor,
    b: FlexTensor,
}

/// With `low = s (x @ a)`: `dlow = dy @ b^T`, `db = low^T dy`, `da = s x^T dlow`,
/// `dx = s dlow @ a^T`.
fn gradients(
    dy: &FlexTensor,
    x: &FlexTensor,
    a: &FlexTensor,
    b: &FlexTensor,
    low: &FlexTensor,
    scale: f32,
) -> Grads {
    let (n, k) = dims(x);
    let (r, m) = dims(b);
    let dys = dy.storage::<f32>();
    let db = rows_outer(low.storage::<f32>(), n, r, dys, m);
    let mut dlow = rows_dot(dys, n, m, b.storage::<f32>(), r);
    dlow.iter_mut().for_each(|v| *v *= scale);
    let dat = rows_outer(&dlow, n, r, x.storage::<f32>(), k);
    let da = transposed(&dat, r, k);
    let dx = mm_new(
        n,
        k,
        r,
        (&dlow, r, 1),
        (a.storage::<f32>(), 1, r),
        Threads::All,
    );
    Grads {
        x: FlexTensor::from_data(TensorData::new(dx, [n, k])),
        a: FlexTensor::from_data(TensorData::new(da, [k, r])),
        b: FlexTensor::from_data(TensorData::new(db, [r, m])),
    }
}

/// The two dimensions of a 2-D tensor.
fn dims(t: &FlexTensor) -> (usize, usize) {
    let s = t.layout().shape();
    (s[0], s[1])
}

/// `x: [rows, cols]` row-major, transposed into a new `[cols, rows]`.
fn transposed(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = x[i * cols + j];
        }
    }
    t
}

/// `scale (x @ a) @ b` over the last axis of `x` through the fused adapter path on Flex
/// (autodiff or not) at f32 precision; `None` elsewhere, for the composed products. All three
/// are f32.
///
/// # Shapes
/// - `x`: `[..., k]`, `a`: `[k, r]`, `b`: `[r, m]` -> `[..., m]`
pub fn lora_delta<const D: usize>(
    x: &Tensor<D>,
    a: &Tensor<2>,
    b: &Tensor<2>,
    scale: f32,
) -> Option<Tensor<D>> {
    let dims = x.dims();
    let ([k, r], [r2, m]) = (a.dims(), b.dims());
    if !flex_training(&x.device())
        || precision() != Precision::F32
        || [x.dtype(), a.dtype(), b.dtype()] != [DType::F32; 3]
        || dims[D - 1] != k
        || r != r2
    {
        return None;
    }
    let n: usize = dims[..D - 1].iter().product();
    let y = Tensor::<2>::from_dispatch(<Dispatch as FusedLoraDelta>::lora_delta(
        x.clone().reshape([n, k]).into_dispatch(),
        a.clone().into_dispatch(),
        b.clone().into_dispatch(),
        scale,
    ));
    let mut out = dims;
    out[D - 1] = m;
    Some(y.reshape(out))
}
