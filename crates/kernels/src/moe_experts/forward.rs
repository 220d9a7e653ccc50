//! The experts' forward: tokens gathered by expert, each expert's SwiGLU products on one
//! thread's share, the weighted scatter back; what the backward needs is kept.

use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;
use rayon::prelude::*;

use super::{Dims, Saved, split_rows};
use crate::mm::Threads;
use crate::products::mm_in;
use crate::swiglu::kernel_forward;
use crate::{Elements, int_values};

pub(super) fn forward(
    x: &FlexTensor,
    gate: &FlexTensor,
    up: &FlexTensor,
    down: &FlexTensor,
    w: &FlexTensor,
    ids: &FlexTensor,
) -> (FlexTensor, Saved) {
    let (n, h) = (x.layout().shape()[0], x.layout().shape()[1]);
    let precision = crate::precision();
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
            mm_in(
                precision,
                c,
                i,
                h,
                (xc, h, 1),
                (wg, i, 1),
                (gc, i),
                false,
                Threads::One,
            );
            mm_in(
                precision,
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
            mm_in(
                precision,
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
        precision,
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
