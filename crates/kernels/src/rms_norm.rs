//! RMSNorm with a hand-written backward: `y = x * r * w`, `r = 1 / sqrt(mean(x^2) + eps)` per row.
//!
//! The composed version runs square, mean, add, sqrt, reciprocal and two multiplications as
//! separate passes (and about twice as many in its backward); Qwen3 applies it four times per
//! layer (input, post-attention, and per head to queries and keys). Here: one pass forward (rows
//! over the threads), saving `r`; one pass backward for `dx` and one for `dw`:
//! `dx = r (g - xhat mean(g xhat))`, `g = dy w`, `xhat = x r`; `dw = sum_rows dy xhat`.

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

/// Backends with a fused RMSNorm: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedRmsNorm: Backend {
    /// `x * rsqrt(mean(x^2, last axis) + eps) * w`, `x: [..., d]`, `w: [d]`.
    fn rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self>;
}

impl FusedRmsNorm for Flex {
    fn rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        forward(&x, &w, eps).0
    }
}

impl<C: CheckpointStrategy> FusedRmsNorm for Autodiff<Flex, C> {
    fn rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct RmsNormBackward;

        impl Backward<Flex, 2> for RmsNormBackward {
            /// `x`, `w` and the per-row `r` of the forward.
            type State = (FlexTensor, FlexTensor, FlexTensor);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_w] = ops.parents;
                let dy = grads.consume::<Flex>(&ops.node);
                let (x, w, r) = ops.state;
                if let Some(node) = node_x {
                    grads.register::<Flex>(node.id, backward_x(&dy, &x, &w, &r));
                }
                if let Some(node) = node_w {
                    grads.register::<Flex>(
                        node.id,
                        backward_w(&dy, &x, &r, w.layout().num_elements()),
                    );
                }
            }
        }

        match RmsNormBackward
            .prepare::<C>([x.node(), w.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), w.primitive().clone());
                let (y, r) = forward(&xp, &wp, eps);
                prep.finish((xp, wp, r), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive(), w.primitive(), eps).0),
        }
    }
}

/// The fused RMSNorm on Flex (autodiff or not) in f32; `None` elsewhere, for the composed path.
///
/// # Shapes
/// - `x`: `[..., d]`, `w`: `[d]` -> `[..., d]`
pub fn rms_norm<const D: usize>(x: &Tensor<D>, w: &Tensor<1>, eps: f64) -> Option<Tensor<D>> {
    if !flex_training(&x.device()) || x.dtype() != DType::F32 || w.dtype() != DType::F32 {
        return None;
    }
    Some(Tensor::from_dispatch(<Dispatch as FusedRmsNorm>::rms_norm(
        x.clone().into_dispatch(),
        w.clone().into_dispatch(),
        eps,
    )))
}

/// Rows per rayon task: at least this many elements each.
fn min_rows(d: usize) -> usize {
    (16_384 / d.max(1)).max(1)
}

fn forward(x: &FlexTensor, w: &FlexTensor, eps: f64) -> (FlexTensor, FlexTensor) {
    let (x, w) = (dense(x), dense(w));
    let shape = x.layout().shape().clone();
    let d = w.layout().num_elements();
    let rows = x.layout().num_elements() / d.max(1);
    let (xs, ws) = (x.storage::<f32>(), w.storage::<f32>());
    let mut y = vec![0.0f32; rows * d];
    let mut r = vec![0.0f32; rows];
    y.par_chunks_mut(d)
        .zip(r.par_iter_mut())
        .enumerate()
        .with_min_len(min_rows(d))
        .for_each(|(i, (yr, ri))| {
            *ri = forward_row(&xs[i * d..(i + 1) * d], ws, yr, eps as f32);
        });
    (
        FlexTensor::from_data(TensorData::new(y, shape)),
        FlexTensor::from_data(TensorData::new(r, [rows])),
    )
}

fn backward_x(dy: &FlexTensor, x: &FlexTensor, w: &FlexTensor, r: &FlexTensor) -> FlexTensor {
    let (dy, x, w) = (dense(dy), dense(x), dense(w));
    let shape = x.layout().shape().clone();
    let d = w.layout().num_elements();
    let rows = x.layout().num_elements() / d.max(1);
    let (dys, xs, ws, rs) = (
        dy.storage::<f32>(),
        x.storage::<f32>(),
        w.storage::<f32>(),
        r.storage::<f32>(),
    );
    let mut dx = vec![0.0f32; rows * d];
    dx.par_chunks_mut(d)
        .enumerate()
        .with_min_len(min_rows(d))
        .for_each(|(i, out)| {
            let (xr, gr) = (&xs[i * d..(i + 1) * d], &dys[i * d..(i + 1) * d]);
            backward_row(xr, gr, ws, rs[i], out);
        });
    FlexTensor::from_data(TensorData::new(dx, shape))
}

/// Independent sums a row's reductions keep, so that they run on vectors: a sum in element
/// order is one chain of dependent additions, which held the forward and the backward to
/// scalar speed. Always this many and added in one order ([`lane_sum`]): the same bits with or
/// without AVX-512, and on every thread count.
const LANES: usize = 16;

/// `sum_j f(j)` for `j < n`: term `j` into lane `j % LANES`, then the lanes added pairwise.
#[inline(always)]
fn lane_sum(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let whole = n / LANES * LANES;
    for j0 in (0..whole).step_by(LANES) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += f(j0 + l);
        }
    }
    for (l, a) in acc.iter_mut().enumerate().take(n - whole) {
        *a += f(whole + l);
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

simd_dispatch! {
    /// One row of the forward: `y = x r w`; returns `r`.
    fn forward_row(x: &[f32], w: &[f32], y: &mut [f32], eps: f32) -> f32 = forward_row_generic
}

#[inline(always)]
fn forward_row_generic(x: &[f32], w: &[f32], y: &mut [f32], eps: f32) -> f32 {
    let d = x.len();
    let (w, y) = (&w[..d], &mut y[..d]);
    let ms = lane_sum(d, |j| x[j] * x[j]) / d as f32;
    let r = 1.0 / (ms + eps).sqrt();
    for ((o, &v), &g) in y.iter_mut().zip(x).zip(w) {
        *o = v * r * g;
    }
    r
}

simd_dispatch! {
    /// One row of the input's gradient: `dx = r (g - xhat mean(g xhat))`, `g = dy w`.
    fn backward_row(x: &[f32], dy: &[f32], w: &[f32], r: f32, dx: &mut [f32]) = backward_row_generic
}

#[inline(always)]
fn backward_row_generic(x: &[f32], dy: &[f32], w: &[f32], r: f32, dx: &mut [f32]) {
    let d = x.len();
    let (dy, w, dx) = (&dy[..d], &w[..d], &mut dx[..d]);
    let m = lane_sum(d, |j| dy[j] * w[j] * x[j] * r) / d as f32;
    for j in 0..d {
        dx[j] = r * (dy[j] * w[j] - x[j] * r * m);
    }
}

fn backward_w(dy: &FlexTensor, x: &FlexTensor, r: &FlexTensor, d: usize) -> FlexTensor {
    let (dy, x) = (dense(dy), dense(x));
    let rows = x.layout().num_elements() / d.max(1);
    let (dys, xs, rs) = (dy.storage::<f32>(), x.storage::<f32>(), r.storage::<f32>());
    let chunk = min_rows(d);
    // Partial sums over fixed row ranges, added in range order: the same bits on every run
    // (rayon's `reduce` pairs partial results in whatever order its work stealing gives, and
    // float addition is not associative; bit-exact resume needs the same gradient every time).
    let partials: Vec<Vec<f32>> = (0..rows.div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            let mut acc = vec![0.0f32; d];
            for i in c * chunk..((c + 1) * chunk).min(rows) {
                let (xr, gr, rr) = (&xs[i * d..(i + 1) * d], &dys[i * d..(i + 1) * d], rs[i]);
                for j in 0..d {
                    acc[j] += gr[j] * xr[j] * rr;
                }
            }
            acc
        })
        .collect();
    let mut dw = vec![0.0f32; d];
    for part in &partials {
        dw.iter_mut().zip(part).for_each(|(x, y)| *x += y);
    }
    FlexTensor::from_data(TensorData::new(dw, [d]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    fn composed<const D: usize>(x: Tensor<D>, w: Tensor<1>, eps: f64) -> Tensor<D> {
        let variance = x.clone().square().mean_dim(D - 1);
        x * (variance + eps).sqrt().recip() * w.unsqueeze()
    }

    /// The weight gradient sums many row chunks across the threads: the same bits every run.
    #[test]
    fn the_weight_gradient_is_the_same_on_every_run() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<2>::random([4096, 64], normal, &device);
        let w = Tensor::<1>::random([64], normal, &device);
        let dy = Tensor::<2>::random([4096, 64], normal, &device);
        let run = || {
            let w = w.clone().require_grad();
            let grads = (rms_norm(&x, &w, 1e-6).unwrap() * dy.clone())
                .sum()
                .backward();
            let g: Vec<u32> = w
                .grad(&grads)
                .unwrap()
                .into_data()
                .iter::<f32>()
                .map(f32::to_bits)
                .collect();
            g
        };
        let first = run();
        for _ in 0..5 {
            assert_eq!(run(), first);
        }
    }

    /// The rows on this CPU's vectors give the bits of the generic code (so a run's numbers do
    /// not depend on the CPU having AVX-512), and the lane sums stay within float rounding of
    /// the sums in f64.
    #[test]
    fn the_rows_on_vectors_give_the_generic_bits() {
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
        };
        for d in [1, 7, 16, 32, 33, 256, 1000] {
            let [x, dy, w]: [Vec<f32>; 3] =
                std::array::from_fn(|_| (0..d).map(|_| next()).collect());
            let (mut y, mut y_generic) = (vec![0.0; d], vec![0.0; d]);
            let r = forward_row(&x, &w, &mut y, 1e-6);
            let r_generic = forward_row_generic(&x, &w, &mut y_generic, 1e-6);
            assert_eq!(r.to_bits(), r_generic.to_bits(), "d {d}: r");
            assert_eq!(y, y_generic, "d {d}: y");
            let ms: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / d as f64;
            let r64 = 1.0 / (ms + 1e-6).sqrt();
            assert!(
                ((f64::from(r) - r64) / r64).abs() < 1e-6,
                "d {d}: r {r} against {r64}"
            );
            let (mut dx, mut dx_generic) = (vec![0.0; d], vec![0.0; d]);
            backward_row(&x, &dy, &w, r, &mut dx);
            backward_row_generic(&x, &dy, &w, r, &mut dx_generic);
            assert_eq!(dx, dx_generic, "d {d}: dx");
        }
    }

    /// Values and gradients (input and weight) against the composed ops, on Flex with autodiff.
    #[test]
    fn fused_rms_norm_matches_the_composed_ops() {
        let device = Device::flex().autodiff();
        for (shape, eps) in [([2, 3, 64], 1e-6), ([4, 16, 8], 1e-5), ([1, 1, 1000], 1e-6)] {
            let d = shape[2];
            let normal = Distribution::Normal(0.0, 1.5);
            let x = Tensor::<3>::random(shape, normal, &device).require_grad();
            let w = (Tensor::<1>::random([d], normal, &device) * 0.2 + 1.0).require_grad();
            let dy = Tensor::<3>::random(shape, normal, &device);
            let fused = rms_norm(&x, &w, eps).expect("flex autodiff takes the kernel");
            let reference = composed(x.clone(), w.clone(), eps);
            let value = (fused.clone() - reference.clone())
                .abs()
                .max()
                .into_scalar::<f32>();
            assert!(value <= 1e-5, "{shape:?}: values differ by {value}");
            let ga = (fused * dy.clone()).sum().backward();
            let gb = (reference * dy).sum().backward();
            let dx = (x.grad(&ga).unwrap() - x.grad(&gb).unwrap())
                .abs()
                .max()
                .into_scalar::<f32>();
            let dw = (w.grad(&ga).unwrap() - w.grad(&gb).unwrap())
                .abs()
                .max()
                .into_scalar::<f32>();
            let dw_scale = w.grad(&gb).unwrap().abs().max().into_scalar::<f32>();
            assert!(dx <= 1e-5, "{shape:?}: input gradients differ by {dx}");
            assert!(
                dw <= 1e-5 * dw_scale.max(1.0),
                "{shape:?}: weight gradients differ by {dw}"
            );
        }
    }
}
