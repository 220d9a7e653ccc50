//! Rotary position embedding with a hand-written backward: `y = x cos + rotate_half(x) sin`.
//!
//! Composed, the rotation slices the two halves, negates one, concatenates them and runs two
//! multiplications and an addition, each a pass that writes a new `[b, heads, t, head_dim]`
//! tensor, and about as many again in the backward; the input is usually the strided
//! `swap_dims` view of the projection, which the first op copies. Here one pass reads the input
//! through its strides and writes the contiguous rotated tensor (what the attention kernel reads),
//! and one pass forms the gradient: the rotation is orthogonal per pair `(j, j + half)`, so
//! `dx = dy cos + rotate_half^T(dy sin)` with `rotate_half^T(z) = cat(z[half..], -z[..half])`.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use super::{dense, flex_training};

/// Backends with the fused rotary embedding: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedRope: Backend {
    /// `x cos + rotate_half(x) sin` for `x: [b, heads, t, d]` (any strides, unit stride on the
    /// last axis or not) and tables `cos`, `sin`: `[rows, t, d]` with `rows` 1 (shared by the
    /// batch rows) or `b` (one table per row: packed documents); the output is contiguous.
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

impl FusedRope for Flex {
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        rotate(&x, &cos, &sin, Direction::Forward)
    }
}

impl<C: CheckpointStrategy> FusedRope for Autodiff<Flex, C> {
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct RopeBackward;

        impl Backward<Flex, 1> for RopeBackward {
            /// The tables.
            type State = (FlexTensor, FlexTensor);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_x] = ops.parents;
                let dy = grads.consume::<Flex>(&ops.node);
                let (cos, sin) = ops.state;
                if let Some(node) = node_x {
                    grads.register::<Flex>(node.id, rotate(&dy, &cos, &sin, Direction::Backward));
                }
            }
        }

        // The tables are constants (no gradient), as in the composed path.
        let (cos, sin) = (cos.primitive().clone(), sin.primitive().clone());
        match RopeBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let y = rotate(x.primitive(), &cos, &sin, Direction::Forward);
                prep.finish((cos, sin), y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(rotate(x.primitive(), &cos, &sin, Direction::Forward))
            }
        }
    }
}

/// The fused rotary embedding on Flex (autodiff or not) in f32; `None` elsewhere, for the
/// composed path.
///
/// # Shapes
/// - `x`: `[b, heads, t, d]`, `cos`, `sin`: `[1 or b, t, d]` -> `[b, heads, t, d]`
pub fn rope(x: &Tensor<4>, cos: &Tensor<3>, sin: &Tensor<3>) -> Option<Tensor<4>> {
    let [b, _, t, d] = x.dims();
    let rows = cos.dims()[0];
    let ok = flex_training(&x.device())
        && [x.dtype(), cos.dtype(), sin.dtype()]
            .iter()
            .all(|dt| *dt == DType::F32)
        && d % 2 == 0
        && (rows == 1 || rows == b)
        && cos.dims() == [rows, t, d]
        && sin.dims() == [rows, t, d];
    if !ok {
        return None;
    }
    Some(Tensor::from_dispatch(<Dispatch as FusedRope>::rope(
        x.clone().into_dispatch(),
        cos.clone().inner().into_dispatch(),
        sin.clone().inner().into_dispatch(),
    )))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// `x cos + rotate_half(x) sin`.
    Forward,
    /// The transpose: `x cos + rotate_half^T(x sin)`.
    Backward,
}

fn rotate(x: &FlexTensor, cos: &FlexTensor, sin: &FlexTensor, direction: Direction) -> FlexTensor {
    let (cos, sin) = (dense(cos), dense(sin));
    let shape = x.layout().shape().clone();
    let (b, h, t, d) = (shape[0], shape[1], shape[2], shape[3]);
    let strides = x.layout().strides().to_vec();
    let offset = x.layout().start_offset() as isize;
    let xs = x.storage::<f32>();
    let (cs, ss) = (cos.storage::<f32>(), sin.storage::<f32>());
    // One table for all rows, or one per row (packed documents).
    let per_row = cos.layout().shape()[0] > 1;
    let mut out = vec![0.0f32; b * h * t * d];
    // One task per (batch row, head): `t` rows of `d`, read through the input's strides.
    out.par_chunks_mut(t * d)
        .enumerate()
        .with_min_len((4096 / (t * d).max(1)).max(1))
        .for_each(|(bh, o)| {
            let (bi, hi) = (bh / h, bh % h);
            // A row strided along its own axis is gathered here first (not the attention's
            // layout: there the heads split from the projection leave each row contiguous).
            let mut gathered = Vec::new();
            for ti in 0..t {
                let base = offset
                    + bi as isize * strides[0]
                    + hi as isize * strides[1]
                    + ti as isize * strides[2];
                let tr = if per_row { bi * t + ti } else { ti };
                let (c, s) = (&cs[tr * d..(tr + 1) * d], &ss[tr * d..(tr + 1) * d]);
                let x = if strides[3] == 1 {
                    &xs[base as usize..base as usize + d]
                } else {
                    gathered.clear();
                    gathered.extend((0..d).map(|j| xs[(base + j as isize * strides[3]) as usize]));
                    &gathered[..]
                };
                rotate_row(x, c, s, &mut o[ti * d..(ti + 1) * d], direction);
            }
        });
    FlexTensor::from_data(TensorData::new(out, [b, h, t, d]))
}

/// One row of `d` values rotated into `row` with the tables `c`, `s` of its position: the
/// halves `(lo, hi)` become `(lo c - hi s, hi c + lo s)` (backward: by the transposed rotation).
#[inline(always)]
fn rotate_row(x: &[f32], c: &[f32], s: &[f32], row: &mut [f32], direction: Direction) {
    let half = row.len() / 2;
    let (x_lo, x_hi) = x.split_at(half);
    let (c_lo, c_hi) = c.split_at(half);
    let (s_lo, s_hi) = s.split_at(half);
    let (r_lo, r_hi) = row.split_at_mut(half);
    let x_hi = &x_hi[..half];
    match direction {
        Direction::Forward => {
            for j in 0..half {
                r_lo[j] = x_lo[j] * c_lo[j] - x_hi[j] * s_lo[j];
                r_hi[j] = x_hi[j] * c_hi[j] + x_lo[j] * s_hi[j];
            }
        }
        Direction::Backward => {
            for j in 0..half {
                r_lo[j] = x_lo[j] * c_lo[j] + x_hi[j] * s_hi[j];
                r_hi[j] = x_hi[j] * c_hi[j] - x_lo[j] * s_lo[j];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    fn composed(x: Tensor<4>, cos: Tensor<3>, sin: Tensor<3>) -> Tensor<4> {
        let [_, _, _, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * cos.unsqueeze_dim::<4>(1) + rotated * sin.unsqueeze_dim::<4>(1)
    }

    /// Values and input gradients against the composed rotation, on a strided (`swap_dims`)
    /// input like the attention's, with tables whose halves differ (as scaled RoPE's may not,
    /// but the kernel must not assume they match).
    #[test]
    fn fused_rope_matches_the_composed_rotation() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        // The last two shapes have one table per batch row (packed documents' positions).
        for (b, t, h, d, rows) in [
            (2, 5, 3, 8, 1),
            (1, 17, 4, 32, 1),
            (3, 1, 2, 64, 1),
            (3, 7, 2, 8, 3),
            (2, 17, 4, 32, 2),
        ] {
            let x = Tensor::<4>::random([b, t, h, d], normal, &device).require_grad();
            let cos = Tensor::<3>::random([rows, t, d], normal, &device);
            let sin = Tensor::<3>::random([rows, t, d], normal, &device);
            // [b, h, t, d], strided; one view per graph (each backward consumes its own).
            let view = || x.clone().swap_dims(1, 2);
            let dy = Tensor::<4>::random([b, h, t, d], normal, &device);
            let fused = rope(&view(), &cos, &sin).expect("flex autodiff takes the kernel");
            let reference = composed(view(), cos, sin);
            let value = (fused.clone() - reference.clone())
                .abs()
                .max()
                .into_scalar::<f32>();
            assert!(value <= 1e-6, "{b}x{t}x{h}x{d}: values differ by {value}");
            let ga = (fused * dy.clone()).sum().backward();
            let gb = (reference * dy).sum().backward();
            let diff = (x.grad(&ga).unwrap() - x.grad(&gb).unwrap())
                .abs()
                .max()
                .into_scalar::<f32>();
            assert!(diff <= 1e-6, "{b}x{t}x{h}x{d}: gradients differ by {diff}");
        }
    }

    /// A row strided along its own axis (not the attention's layout) takes the general path:
    /// the same values as the composed rotation.
    #[test]
    fn rows_strided_along_the_head_axis_match_the_composed_rotation() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        let (b, h, t, d) = (2, 3, 5, 8);
        let cos = Tensor::<3>::random([1, t, d], normal, &device);
        let sin = Tensor::<3>::random([1, t, d], normal, &device);
        let x = Tensor::<4>::random([b, h, d, t], normal, &device).swap_dims(2, 3);
        let fused = rope(&x, &cos, &sin).expect("flex autodiff takes the kernel");
        let diff = (fused - composed(x, cos, sin))
            .abs()
            .max()
            .into_scalar::<f32>();
        assert!(diff <= 1e-6, "values differ by {diff}");
    }
}
