//! The attention backward: per query block, the probabilities recomputed from the saved
//! log-sum-exp, then `dQ`, and `dK`, `dV` summed over the query heads of the task's KV head.

use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;
use rayon::prelude::*;

use super::{Dims, LANES};
use crate::dense;
use crate::exp::exp_f32;
use crate::mm::{Threads, mm};

/// One backward task: batch row and KV head `task`, all its query heads; it owns that head's
/// `dk` and `dv`.
struct BackwardTask<'a> {
    dm: Dims,
    task: usize,
    qs: &'a [f32],
    ks: &'a [f32],
    vs: &'a [f32],
    os: &'a [f32],
    dos: &'a [f32],
    ls: &'a [f32],
    scale: f32,
    /// This batch row's document starts (`t` values), if packed.
    starts: Option<&'a [u32]>,
}

impl BackwardTask<'_> {
    #[inline(always)]
    fn run(&self, dqc: &mut [f32], dkc: &mut [f32], dvc: &mut [f32]) {
        let Dims { hq, t, s, hd, .. } = self.dm;
        let group = self.dm.group();
        let scale = self.scale;
        let (bi, kh, span) = self.dm.kv_head(self.task);
        let (k, v) = (&self.ks[span.clone()], &self.vs[span]);
        let (mut p, mut ds) = (self.dm.block_buffer(), self.dm.block_buffer());
        for g in 0..group {
            let h = kh * group + g;
            let span = self.dm.query_head(bi, h);
            let (q, o, d_o) = (
                &self.qs[span.clone()],
                &self.os[span.clone()],
                &self.dos[span],
            );
            for (r0, rows, k0, keys) in self.dm.query_blocks(self.starts) {
                let block = r0 * hd..(r0 + rows) * hd;
                let (qb, ob, dob) = (&q[block.clone()], &o[block.clone()], &d_o[block]);
                // Keys `k0..keys` (buffer column `j` is key `k0 + j`).
                let (kb, vb) = (&k[k0 * hd..], &v[k0 * hd..]);
                let nk = keys - k0;
                // P recomputed from the log-sum-exp; dP = dO V^T; dS = P (dP - rowsum(dO O)) s.
                self.dm.block_scores(qb, kb, rows, nk, &mut p);
                self.dm.block_scores(dob, vb, rows, nk, &mut ds);
                for i in 0..rows {
                    let n = self.dm.visible(r0 + i) - k0;
                    let lse = self.ls[(bi * hq + h) * t + r0 + i];
                    let dd: f32 = dob[i * hd..(i + 1) * hd]
                        .iter()
                        .zip(&ob[i * hd..(i + 1) * hd])
                        .map(|(a, c)| a * c)
                        .sum();
                    let (pr, dr) = (&mut p[i * s..i * s + nk], &mut ds[i * s..i * s + nk]);
                    score_gradient_row(pr, dr, n, scale, lse, dd);
                }
                // dQ = dS K; dK += dS^T Q; dV += P^T dO (over the block's visible keys).
                mm(
                    rows,
                    hd,
                    nk,
                    (&ds, s, 1),
                    (kb, hd, 1),
                    (&mut dqc[(g * t + r0) * hd..(g * t + r0 + rows) * hd], hd),
                    false,
                    Threads::One,
                );
                mm(
                    nk,
                    hd,
                    rows,
                    (&ds, 1, s),
                    (qb, hd, 1),
                    (&mut dkc[k0 * hd..], hd),
                    true,
                    Threads::One,
                );
                mm(
                    nk,
                    hd,
                    rows,
                    (&p, 1, s),
                    (dob, hd, 1),
                    (&mut dvc[k0 * hd..], hd),
                    true,
                    Threads::One,
                );
            }
        }
    }
}

simd_dispatch! {
    /// One row of the backward: `p = exp(s * scale - lse)` from the raw scores in `p`, and
    /// `ds = p (dp - dd) scale` from `dp` in `ds`, over the `n` visible keys; zeros past them.
    fn score_gradient_row(
        p: &mut [f32],
        ds: &mut [f32],
        n: usize,
        scale: f32,
        lse: f32,
        dd: f32,
    ) = score_gradient_row_generic
}

#[inline(always)]
fn score_gradient_row_generic(
    p: &mut [f32],
    ds: &mut [f32],
    n: usize,
    scale: f32,
    lse: f32,
    dd: f32,
) {
    let (p_live, p_dead) = p.split_at_mut(n);
    let (d_live, d_dead) = ds.split_at_mut(n);
    let body = n - n % LANES;
    let step = |pj: &mut f32, dj: &mut f32| {
        let e = exp_f32(*pj * scale - lse);
        *pj = e;
        *dj = e * (*dj - dd) * scale;
    };
    for (pc, dc) in p_live[..body]
        .chunks_exact_mut(LANES)
        .zip(d_live[..body].chunks_exact_mut(LANES))
    {
        for l in 0..LANES {
            step(&mut pc[l], &mut dc[l]);
        }
    }
    // The partial chunk as one full chunk in padded copies (see `softmax_row_generic`).
    let valid = n - body;
    let (mut pt, mut dt) = ([0.0f32; LANES], [0.0f32; LANES]);
    pt[..valid].copy_from_slice(&p_live[body..]);
    dt[..valid].copy_from_slice(&d_live[body..]);
    for l in 0..LANES {
        step(&mut pt[l], &mut dt[l]);
    }
    p_live[body..].copy_from_slice(&pt[..valid]);
    d_live[body..].copy_from_slice(&dt[..valid]);
    p_dead.fill(0.0);
    d_dead.fill(0.0);
}

#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub(super) fn backward(
    d_out: &FlexTensor,
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    out: &FlexTensor,
    lse: &FlexTensor,
    scale: f32,
    starts: Option<&[u32]>,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let d_out = dense(d_out);
    let dm = Dims::of(q, k);
    let Dims {
        b,
        hq,
        hkv,
        t,
        s,
        hd,
    } = dm;
    let group = dm.group();
    let (qs, ks, vs) = (q.storage::<f32>(), k.storage::<f32>(), v.storage::<f32>());
    let (os, dos, ls) = (
        out.storage::<f32>(),
        d_out.storage::<f32>(),
        lse.storage::<f32>(),
    );
    let mut dq = vec![0.0f32; b * hq * t * hd];
    let mut dk = vec![0.0f32; b * hkv * s * hd];
    let mut dv = vec![0.0f32; b * hkv * s * hd];
    dq.par_chunks_mut(group * t * hd)
        .zip(dk.par_chunks_mut(s * hd))
        .zip(dv.par_chunks_mut(s * hd))
        .enumerate()
        .for_each(|(task, ((dqc, dkc), dvc))| {
            let args = BackwardTask {
                dm,
                task,
                qs,
                ks,
                vs,
                os,
                dos,
                ls,
                scale,
                starts: starts.map(|st| &st[(task / hkv) * t..(task / hkv + 1) * t]),
            };
            args.run(dqc, dkc, dvc);
        });
    (
        FlexTensor::from_data(TensorData::new(dq, [b, hq, t, hd])),
        FlexTensor::from_data(TensorData::new(dk, [b, hkv, s, hd])),
        FlexTensor::from_data(TensorData::new(dv, [b, hkv, s, hd])),
    )
}
