//! The experts' backward: the SwiGLU products' input and weight gradients per expert, the
//! routing weights' gradient, and the scatter of the input gradient back to token order.

use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;
use rayon::prelude::*;

use super::{Dims, Saved, split_rows};
use crate::Elements;
use crate::mm::Threads;
use crate::products::mm_in;
use crate::swiglu::kernel_backward;

/// Gradients for `x`, `gate`, `up`, `down` and `w`.
pub(super) fn backward(
    dy: &FlexTensor,
    gate: &FlexTensor,
    up: &FlexTensor,
    down: &FlexTensor,
    w: &FlexTensor,
    s: &Saved,
) -> [FlexTensor; 5] {
    let Dims { n, k, h, i, e } = s.dims;
    let precision = s.precision;
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
            mm_in(
                precision,
                c,
                i,
                h,
                (dyc, h, 1),
                (wd, 1, h),
                (&mut da, i),
                false,
                Threads::One,
            );
            mm_in(
                precision,
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
            mm_in(
                precision,
                h,
                i,
                c,
                (xc, 1, h),
                (&dg, i, 1),
                (dgc, i),
                false,
                Threads::One,
            );
            mm_in(
                precision,
                h,
                i,
                c,
                (xc, 1, h),
                (&du, i, 1),
                (duc, i),
                false,
                Threads::One,
            );
            mm_in(
                precision,
                c,
                h,
                i,
                (&dg, i, 1),
                (wg, 1, i),
                (dxc, h),
                false,
                Threads::One,
            );
            mm_in(
                precision,
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
