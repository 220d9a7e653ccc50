//! SwiGLU's gate, `silu(g) * u`, with a hand-written backward.
//!
//! Composed, the forward is a sigmoid (glibc `expf` per element), two multiplications and their
//! temporaries; the backward several more passes. Here one pass each way, chunks over the
//! threads, with the vectorised [`exp_f32`](super::exp::exp_f32):
//! `dg = dy u s (1 + g (1 - s))`, `du = dy g s`, `s = sigmoid(g)`.

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

use super::exp::exp_f32;
use super::{dense, flex_training};

/// Backends with a fused SwiGLU gate: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedSwiglu: Backend {
    /// `silu(g) * u`, elementwise, same shapes.
    fn swiglu(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl FusedSwiglu for Flex {
    fn swiglu(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self> {
        forward(&g, &u)
    }
}

impl<C: CheckpointStrategy> FusedSwiglu for Autodiff<Flex, C> {
    fn swiglu(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct SwigluBackward;

        impl Backward<Flex, 2> for SwigluBackward {
            /// The inputs `g` and `u`.
            type State = (FlexTensor, FlexTensor);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_g, node_u] = ops.parents;
                let dy = grads.consume::<Flex>(&ops.node);
                let (g, u) = ops.state;
                let (dg, du) = backward(&dy, &g, &u);
                if let Some(node) = node_g {
                    grads.register::<Flex>(node.id, dg);
                }
                if let Some(node) = node_u {
                    grads.register::<Flex>(node.id, du);
                }
            }
        }

        match SwigluBackward
            .prepare::<C>([g.node(), u.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (gp, up) = (g.primitive().clone(), u.primitive().clone());
                let y = forward(&gp, &up);
                prep.finish((gp, up), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(g.primitive(), u.primitive())),
        }
    }
}

/// The fused `silu(g) * u` on Flex (autodiff or not) in f32 with equal shapes; `None`
/// elsewhere, for the composed path.
pub fn swiglu<const D: usize>(g: &Tensor<D>, u: &Tensor<D>) -> Option<Tensor<D>> {
    if !flex_training(&g.device())
        || g.dtype() != DType::F32
        || u.dtype() != DType::F32
        || g.dims() != u.dims()
    {
        return None;
    }
    Some(Tensor::from_dispatch(<Dispatch as FusedSwiglu>::swiglu(
        g.clone().into_dispatch(),
        u.clone().into_dispatch(),
    )))
}

const CHUNK: usize = 16_384;

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

fn forward(g: &FlexTensor, u: &FlexTensor) -> FlexTensor {
    let (g, u) = (dense(g), dense(u));
    let shape = g.layout().shape().clone();
    let (gs, us) = (g.storage::<f32>(), u.storage::<f32>());
    let mut y = vec![0.0f32; gs.len()];
    y.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let o = c * CHUNK;
        kernel_forward(&gs[o..o + out.len()], &us[o..o + out.len()], out);
    });
    FlexTensor::from_data(TensorData::new(y, shape))
}

fn backward(dy: &FlexTensor, g: &FlexTensor, u: &FlexTensor) -> (FlexTensor, FlexTensor) {
    let (dy, g, u) = (dense(dy), dense(g), dense(u));
    let shape = g.layout().shape().clone();
    let (dys, gs, us) = (dy.storage::<f32>(), g.storage::<f32>(), u.storage::<f32>());
    let mut dg = vec![0.0f32; gs.len()];
    let mut du = vec![0.0f32; gs.len()];
    dg.par_chunks_mut(CHUNK)
        .zip(du.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(c, (dgc, duc))| {
            let o = c * CHUNK;
            let n = dgc.len();
            kernel_backward(&dys[o..o + n], &gs[o..o + n], &us[o..o + n], dgc, duc);
        });
    (
        FlexTensor::from_data(TensorData::new(dg, shape.clone())),
        FlexTensor::from_data(TensorData::new(du, shape)),
    )
}

simd_dispatch! {
    /// `y = silu(g) * u` over a chunk.
    pub(super) fn kernel_forward(g: &[f32], u: &[f32], y: &mut [f32]) = forward_generic
}

#[inline(always)]
fn forward_generic(g: &[f32], u: &[f32], y: &mut [f32]) {
    for ((o, &gv), &uv) in y.iter_mut().zip(g).zip(u) {
        *o = gv * sigmoid(gv) * uv;
    }
}

simd_dispatch! {
    /// `dg`, `du` of a chunk from `dy`, `g` and `u`.
    pub(super) fn kernel_backward(
        dy: &[f32],
        g: &[f32],
        u: &[f32],
        dg: &mut [f32],
        du: &mut [f32],
    ) = backward_generic
}

#[inline(always)]
fn backward_generic(dy: &[f32], g: &[f32], u: &[f32], dg: &mut [f32], du: &mut [f32]) {
    for i in 0..dy.len() {
        let s = sigmoid(g[i]);
        let silu = g[i] * s;
        du[i] = dy[i] * silu;
        dg[i] = dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::silu;
    use burn::tensor::{Device, Distribution};

    /// Values and gradients of both inputs against `silu(g) * u`, on Flex with autodiff,
    /// including large |g| where the sigmoid saturates.
    #[test]
    fn fused_swiglu_matches_the_composed_ops() {
        let device = Device::flex().autodiff();
        for (shape, std) in [([2, 3, 5], 1.0), ([8, 64, 96], 3.0), ([1, 7, 40_000], 30.0)] {
            let normal = Distribution::Normal(0.0, std);
            let g = Tensor::<3>::random(shape, normal, &device).require_grad();
            let u =
                Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device).require_grad();
            let dy = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
            let fused = swiglu(&g, &u).expect("flex autodiff takes the kernel");
            let reference = silu(g.clone()) * u.clone();
            let scale = reference.clone().abs().max().into_scalar::<f32>().max(1.0);
            let value = (fused.clone() - reference.clone())
                .abs()
                .max()
                .into_scalar::<f32>();
            assert!(value <= 2e-6 * scale, "{shape:?}: values differ by {value}");
            let ga = (fused * dy.clone()).sum().backward();
            let gb = (reference * dy).sum().backward();
            for (name, t) in [("g", &g), ("u", &u)] {
                let (a, b) = (t.grad(&ga).unwrap(), t.grad(&gb).unwrap());
                let s = b.clone().abs().max().into_scalar::<f32>().max(1.0);
                let diff = (a - b).abs().max().into_scalar::<f32>();
                assert!(diff <= 2e-6 * s, "{shape:?}: d{name} differs by {diff}");
            }
        }
    }
}
