//! The experts of a sparse MoE layer in one operation: gather, the experts' SwiGLU products
//! and the weighted scatter, with a hand-written backward.
//!
//! Composed (`SparseMoe::forward` on other backends), every expert is a chain of graph
//! operations on its `narrow`ed row group: three projections, the gate, then a `cat` of all
//! outputs, a weighting and a scatter. Each `narrow` backward writes a zero-filled gradient of
//! the whole gathered buffer that the next expert's then adds, so a layer of `E` experts moves
//! `E` full-size buffers in its backward for work on `1/E` of the rows each. Here the layer
//! is one node of the graph:
//!
//! - forward: the `(token, slot)` pairs are sorted by expert (counting sort), the tokens
//!   gathered into one buffer, and each expert runs `silu(x Wg) * (x Wu) Wd` on its contiguous
//!   rows, experts spread over the threads (one `gemm` per product on the task's thread); the
//!   output of token `t` is `sum_j w[t, j] y[slot (t, j)]`, formed per token (no write races);
//! - backward: `dw[t, j] = dy[t] . y[slot]`, `dy_slot = w dy[t]`, then per expert
//!   `dA = dy_slot Wd^T`, `dWd = A^T dy_slot`, the gate's backward, `dWg = x^T dG`,
//!   `dWu = x^T dU`, `dx_slot = dG Wg^T + dU Wu^T`, and `dx[t] = sum_j dx_slot`.
//!
//! The expert weights come stacked, `[E, hidden, inner]` and `[E, inner, hidden]` (the caller
//! stacks the per-expert parameters; the stack's backward hands each its slice).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Int, Tensor};

use super::flex_training;

mod backward;
mod forward;
#[cfg(test)]
mod tests;

use backward::backward;
use forward::forward;

/// Backends with the fused MoE experts: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedMoeExperts: Backend {
    /// `y[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])` with the SwiGLU expert
    /// `silu(x Wg[e]) * (x Wu[e]) @ Wd[e]`. `x: [n, h]`, `gate`, `up`: `[E, h, i]`,
    /// `down`: `[E, i, h]`, `w`, `ids`: `[n, k]` -> `[n, h]`.
    fn moe_experts(
        x: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        down: FloatTensor<Self>,
        w: FloatTensor<Self>,
        ids: IntTensor<Self>,
    ) -> FloatTensor<Self>;
}

impl FusedMoeExperts for Flex {
    fn moe_experts(
        x: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        down: FloatTensor<Self>,
        w: FloatTensor<Self>,
        ids: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        forward(&x, &gate, &up, &down, &w, &ids).0
    }
}

impl<C: CheckpointStrategy> FusedMoeExperts for Autodiff<Flex, C> {
    fn moe_experts(
        x: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        down: FloatTensor<Self>,
        w: FloatTensor<Self>,
        ids: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct MoeBackward;

        impl Backward<Flex, 5> for MoeBackward {
            /// The weights and what the forward kept.
            type State = (FlexTensor, FlexTensor, FlexTensor, FlexTensor, Saved);

            fn backward(
                self,
                ops: Ops<Self::State, 5>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let dy = grads.consume::<Flex>(&ops.node);
                let (gate, up, down, w, saved) = ops.state;
                let [dx, dgate, dup, ddown, dw] = backward(&dy, &gate, &up, &down, &w, &saved);
                for (node, grad) in ops.parents.into_iter().zip([dx, dgate, dup, ddown, dw]) {
                    if let Some(node) = node {
                        grads.register::<Flex>(node.id, grad);
                    }
                }
            }
        }

        match MoeBackward
            .prepare::<C>([x.node(), gate.node(), up.node(), down.node(), w.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (gp, upp, dp, wp) = (
                    gate.primitive().clone(),
                    up.primitive().clone(),
                    down.primitive().clone(),
                    w.primitive().clone(),
                );
                let (y, saved) = forward(x.primitive(), &gp, &upp, &dp, &wp, &ids);
                prep.finish((gp, upp, dp, wp, saved), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(
                forward(
                    x.primitive(),
                    gate.primitive(),
                    up.primitive(),
                    down.primitive(),
                    w.primitive(),
                    &ids,
                )
                .0,
            ),
        }
    }
}

/// The fused experts on Flex (autodiff or not) in f32; `None` elsewhere, for the composed path.
///
/// # Shapes
/// - `x`: `[n, h]`, `gate`, `up`: `[E, h, i]`, `down`: `[E, i, h]`, `w`, `ids`: `[n, k]`
///   -> `[n, h]`
pub fn moe_experts(
    x: &Tensor<2>,
    gate: &Tensor<3>,
    up: &Tensor<3>,
    down: &Tensor<3>,
    w: &Tensor<2>,
    ids: &Tensor<2, Int>,
) -> Option<Tensor<2>> {
    let [n, h] = x.dims();
    let [e, hg, i] = gate.dims();
    let ok = flex_training(&x.device())
        && [x.dtype(), gate.dtype(), up.dtype(), down.dtype(), w.dtype()]
            .iter()
            .all(|d| *d == DType::F32)
        && hg == h
        && up.dims() == [e, h, i]
        && down.dims() == [e, i, h]
        && w.dims()[0] == n
        && ids.dims() == w.dims();
    if !ok {
        return None;
    }
    Some(Tensor::from_dispatch(
        <Dispatch as FusedMoeExperts>::moe_experts(
            x.clone().into_dispatch(),
            gate.clone().into_dispatch(),
            up.clone().into_dispatch(),
            down.clone().into_dispatch(),
            w.clone().into_dispatch(),
            ids.clone().inner().into_dispatch(),
        ),
    ))
}

/// What the forward keeps for the backward.
#[derive(Clone, Debug)]
struct Saved {
    dims: Dims,
    /// The forward's product precision, which its backward keeps.
    precision: crate::Precision,
    /// Sorted position -> slot (`token * k + j`).
    order: Vec<usize>,
    /// Slot -> sorted position.
    inverse: Vec<usize>,
    /// Rows per expert.
    counts: Vec<usize>,
    /// The gathered tokens `[N, h]` (`N = n k`), the gate and up products `[N, i]`, the gate
    /// outputs `[N, i]` and the expert outputs `[N, h]`, in sorted order.
    xs: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    a: Vec<f32>,
    y: Vec<f32>,
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    n: usize,
    k: usize,
    h: usize,
    i: usize,
    e: usize,
}

/// `buf` (rows of `width`) cut into consecutive parts of `counts[e]` rows.
fn split_rows<'a>(mut buf: &'a mut [f32], counts: &[usize], width: usize) -> Vec<&'a mut [f32]> {
    let mut parts = Vec::with_capacity(counts.len());
    for &c in counts {
        let (head, rest) = buf.split_at_mut(c * width);
        parts.push(head);
        buf = rest;
    }
    parts
}
