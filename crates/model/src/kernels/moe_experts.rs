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
use burn::tensor::{DType, Int, Tensor, TensorData};
use rayon::prelude::*;

use super::mm::{Threads, mm};
use super::swiglu::{kernel_backward, kernel_forward};
use super::{Elements, flex_training, int_values};

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

fn forward(
    x: &FlexTensor,
    gate: &FlexTensor,
    up: &FlexTensor,
    down: &FlexTensor,
    w: &FlexTensor,
    ids: &FlexTensor,
) -> (FlexTensor, Saved) {
    let (n, h) = (x.layout().shape()[0], x.layout().shape()[1]);
    let (e, i) = (gate.layout().shape()[0], gate.layout().shape()[2]);
    let k = w.layout().shape()[1];
    let dims = Dims { n, k, h, i, e };
    let (xe, ge, ue, de, we) = (
        Elements::of(x),
        Elements::of(gate),
        Elements::of(up),
        Elements::of(down),
        Elements::of(w),
    );
    let (xv, gv, uv, dv, wv) = (xe.f32(), ge.f32(), ue.f32(), de.f32(), we.f32());

    // 1. Counting sort of the slots by expert.
    let expert: Vec<usize> = int_values(ids)
        .into_iter()
        .map(|id| {
            usize::try_from(id)
                .ok()
                .filter(|&v| v < e)
                .expect("expert id in 0..E")
        })
        .collect();
    let mut counts = vec![0usize; e];
    expert.iter().for_each(|&x| counts[x] += 1);
    let mut next: Vec<usize> = counts
        .iter()
        .scan(0, |acc, &c| {
            let start = *acc;
            *acc += c;
            Some(start)
        })
        .collect();
    let slots = n * k;
    let mut order = vec![0usize; slots];
    let mut inverse = vec![0usize; slots];
    for (slot, &x) in expert.iter().enumerate() {
        order[next[x]] = slot;
        inverse[slot] = next[x];
        next[x] += 1;
    }

    // 2. Gather the tokens in expert order.
    let mut xs = vec![0.0f32; slots * h];
    xs.par_chunks_mut(h)
        .zip(order.par_iter())
        .with_min_len(64)
        .for_each(|(row, &slot)| {
            let t = slot / k;
            row.copy_from_slice(&xv[t * h..(t + 1) * h]);
        });

    // 3. The experts, each on its rows, spread over the threads.
    let mut g = vec![0.0f32; slots * i];
    let mut u = vec![0.0f32; slots * i];
    let mut a = vec![0.0f32; slots * i];
    let mut y = vec![0.0f32; slots * h];
    let xs_parts: Vec<&[f32]> = {
        let mut start = 0;
        counts
            .iter()
            .map(|&c| {
                let part = &xs[start * h..(start + c) * h];
                start += c;
                part
            })
            .collect()
    };
    split_rows(&mut g, &counts, i)
        .into_par_iter()
        .zip(split_rows(&mut u, &counts, i))
        .zip(split_rows(&mut a, &counts, i))
        .zip(split_rows(&mut y, &counts, h))
        .enumerate()
        .with_max_len(1)
        .for_each(|(ex, (((gc, uc), ac), yc))| {
            let c = counts[ex];
            if c == 0 {
                return;
            }
            let xc = xs_parts[ex];
            let (wg, wu, wd) = (
                &gv[ex * h * i..(ex + 1) * h * i],
                &uv[ex * h * i..(ex + 1) * h * i],
                &dv[ex * i * h..(ex + 1) * i * h],
            );
            mm(
                c,
                i,
                h,
                (xc, h, 1),
                (wg, i, 1),
                (gc, i),
                false,
                Threads::One,
            );
            mm(
                c,
                i,
                h,
                (xc, h, 1),
                (wu, i, 1),
                (uc, i),
                false,
                Threads::One,
            );
            kernel_forward(gc, uc, ac);
            mm(
                c,
                h,
                i,
                (ac, i, 1),
                (wd, h, 1),
                (yc, h),
                false,
                Threads::One,
            );
        });

    // 4. Weighted sum of each token's k slots.
    let mut out = vec![0.0f32; n * h];
    out.par_chunks_mut(h)
        .enumerate()
        .with_min_len(64)
        .for_each(|(t, row)| {
            for j in 0..k {
                let (weight, pos) = (wv[t * k + j], inverse[t * k + j]);
                for (o, &v) in row.iter_mut().zip(&y[pos * h..(pos + 1) * h]) {
                    *o += weight * v;
                }
            }
        });
    let saved = Saved {
        dims,
        order,
        inverse,
        counts,
        xs,
        g,
        u,
        a,
        y,
    };
    (FlexTensor::from_data(TensorData::new(out, [n, h])), saved)
}

/// Gradients for `x`, `gate`, `up`, `down` and `w`.
fn backward(
    dy: &FlexTensor,
    gate: &FlexTensor,
    up: &FlexTensor,
    down: &FlexTensor,
    w: &FlexTensor,
    s: &Saved,
) -> [FlexTensor; 5] {
    let Dims { n, k, h, i, e } = s.dims;
    let slots = n * k;
    let (dye, ge, ue, de, we) = (
        Elements::of(dy),
        Elements::of(gate),
        Elements::of(up),
        Elements::of(down),
        Elements::of(w),
    );
    let (dyv, gv, uv, dv, wv) = (dye.f32(), ge.f32(), ue.f32(), de.f32(), we.f32());

    // 1. Routing weights: dw[t, j] = dy[t] . y[slot]; each slot's output gradient w dy[t].
    let mut dw = vec![0.0f32; slots];
    dw.par_chunks_mut(k)
        .enumerate()
        .with_min_len(64)
        .for_each(|(t, row)| {
            let d = &dyv[t * h..(t + 1) * h];
            for (j, out) in row.iter_mut().enumerate() {
                let pos = s.inverse[t * k + j];
                *out = d
                    .iter()
                    .zip(&s.y[pos * h..(pos + 1) * h])
                    .map(|(a, b)| a * b)
                    .sum();
            }
        });
    let mut dys = vec![0.0f32; slots * h];
    dys.par_chunks_mut(h)
        .zip(s.order.par_iter())
        .with_min_len(64)
        .for_each(|(row, &slot)| {
            let (t, weight) = (slot / k, wv[slot]);
            for (o, &d) in row.iter_mut().zip(&dyv[t * h..(t + 1) * h]) {
                *o = weight * d;
            }
        });

    // 2. Per expert: the down projection, the gate, the gate and up projections.
    let mut dgate = vec![0.0f32; e * h * i];
    let mut dup = vec![0.0f32; e * h * i];
    let mut ddown = vec![0.0f32; e * i * h];
    let mut dxs = vec![0.0f32; slots * h];
    let starts: Vec<usize> = s
        .counts
        .iter()
        .scan(0, |acc, &c| {
            let start = *acc;
            *acc += c;
            Some(start)
        })
        .collect();
    dgate
        .par_chunks_mut(h * i)
        .zip(dup.par_chunks_mut(h * i))
        .zip(ddown.par_chunks_mut(i * h))
        .zip(split_rows(&mut dxs, &s.counts, h))
        .enumerate()
        .with_max_len(1)
        .for_each(|(ex, (((dgc, duc), ddc), dxc))| {
            let (c, r) = (s.counts[ex], starts[ex]);
            if c == 0 {
                return; // no rows: zero gradients
            }
            let rows = |width: usize| r * width..(r + c) * width;
            let (xc, gc, uc, ac) = (&s.xs[rows(h)], &s.g[rows(i)], &s.u[rows(i)], &s.a[rows(i)]);
            let dyc = &dys[rows(h)];
            let (wg, wu, wd) = (
                &gv[ex * h * i..(ex + 1) * h * i],
                &uv[ex * h * i..(ex + 1) * h * i],
                &dv[ex * i * h..(ex + 1) * i * h],
            );
            // dA = dY Wd^T [c, i]; dWd = A^T dY [i, h].
            let mut da = vec![0.0f32; c * i];
            mm(
                c,
                i,
                h,
                (dyc, h, 1),
                (wd, 1, h),
                (&mut da, i),
                false,
                Threads::One,
            );
            mm(
                i,
                h,
                c,
                (ac, 1, i),
                (dyc, h, 1),
                (ddc, h),
                false,
                Threads::One,
            );
            // The gate's backward.
            let (mut dg, mut du) = (vec![0.0f32; c * i], vec![0.0f32; c * i]);
            kernel_backward(&da, gc, uc, &mut dg, &mut du);
            // dWg = X^T dG, dWu = X^T dU [h, i]; dX = dG Wg^T + dU Wu^T [c, h].
            mm(
                h,
                i,
                c,
                (xc, 1, h),
                (&dg, i, 1),
                (dgc, i),
                false,
                Threads::One,
            );
            mm(
                h,
                i,
                c,
                (xc, 1, h),
                (&du, i, 1),
                (duc, i),
                false,
                Threads::One,
            );
            mm(
                c,
                h,
                i,
                (&dg, i, 1),
                (wg, 1, i),
                (dxc, h),
                false,
                Threads::One,
            );
            mm(
                c,
                h,
                i,
                (&du, i, 1),
                (wu, 1, i),
                (dxc, h),
                true,
                Threads::One,
            );
        });

    // 3. Each token's input gradient: the sum over its slots.
    let mut dx = vec![0.0f32; n * h];
    dx.par_chunks_mut(h)
        .enumerate()
        .with_min_len(64)
        .for_each(|(t, row)| {
            for j in 0..k {
                let pos = s.inverse[t * k + j];
                for (o, &v) in row.iter_mut().zip(&dxs[pos * h..(pos + 1) * h]) {
                    *o += v;
                }
            }
        });
    [
        FlexTensor::from_data(TensorData::new(dx, [n, h])),
        FlexTensor::from_data(TensorData::new(dgate, [e, h, i])),
        FlexTensor::from_data(TensorData::new(dup, [e, h, i])),
        FlexTensor::from_data(TensorData::new(ddown, [e, i, h])),
        FlexTensor::from_data(TensorData::new(dw, [n, k])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::silu;
    use burn::tensor::{Device, Distribution, IndexingUpdateOp};

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
        let routing =
            Tensor::<2>::zeros([n, e], &x.device()).scatter(1, ids, w, IndexingUpdateOp::Add);
        let mut y = Tensor::<2>::zeros([n, h], &x.device());
        for ex in 0..e {
            let pick =
                |m: &Tensor<3>, r: usize, c: usize| m.clone().narrow(0, ex, 1).reshape([r, c]);
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
        let w =
            Tensor::<2>::random([n, k], Distribution::Uniform(0.1, 1.0), &device).require_grad();
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
}
