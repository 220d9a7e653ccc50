//! The attention backward: per query block, the probabilities recomputed from the saved
//! log-sum-exp, then `dQ`, and `dK`, `dV` summed over the query heads of the task's KV head.

use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;
use rayon::prelude::*;

use super::{Dims, Mode, QUERY_BLOCK, bf16, tiles};
use crate::dense;

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
    mode: Mode,
    /// This batch row's document starts (`t` values), if packed.
    starts: Option<&'a [u32]>,
}

impl BackwardTask<'_> {
    #[inline(always)]
    fn run(&self, dqc: &mut [f32], dkc: &mut [f32], dvc: &mut [f32]) {
        let Dims { hq, t, hd, .. } = self.dm;
        let group = self.dm.group();
        let scale = self.scale;
        let (bi, kh, span) = self.dm.kv_head(self.task);
        let (k, v) = (&self.ks[span.clone()], &self.vs[span]);
        let (kt, vt) = (self.dm.keys(k, self.mode), self.dm.keys(v, self.mode));
        let ps = self.dm.stride();
        let (mut p, mut ds) = (self.dm.block_buffer(), self.dm.block_buffer());
        for g in 0..group {
            let h = kh * group + g;
            let span = self.dm.query_head(bi, h);
            let (q, o, d_o) = (
                &self.qs[span.clone()],
                &self.os[span.clone()],
                &self.dos[span],
            );
            let (q_held, do_held) = (self.mode.rows(q), self.mode.rows(d_o));
            let (q_side, do_side) = (bf16::Side::of(&q_held, q), bf16::Side::of(&do_held, d_o));
            for (r0, rows, k0, keys) in self.dm.query_blocks(self.starts) {
                let block = r0 * hd..(r0 + rows) * hd;
                let (qb, ob, dob) = (&q[block.clone()], &o[block.clone()], &d_o[block]);
                // Keys `k0..keys` (buffer column `j` is key `k0 + j`).
                let kb = &k[k0 * hd..];
                let nk = keys - k0;
                // P recomputed from the log-sum-exp; dS / s = P (dO V^T - rowsum(dO O)) (the
                // scale `s` goes into the products that read dS).
                let lim = self.dm.limits(r0, rows, k0);
                let lse = &self.ls[(bi * hq + h) * t + r0..][..rows];
                let mut dd = [0.0f32; QUERY_BLOCK];
                for (i, d) in dd[..rows].iter_mut().enumerate() {
                    let (a, c) = (&dob[i * hd..(i + 1) * hd], &ob[i * hd..(i + 1) * hd]);
                    *d = a.iter().zip(c).map(|(a, c)| a * c).sum();
                }
                let probs = tiles::Epilogue::Probs {
                    scale,
                    lim: &lim[..rows],
                    lse,
                };
                let (qs, kts) = (q_side.at_row(r0, hd), kt.side().at_col(k0));
                self.dm.block_scores(qs, kts, rows, nk, probs, &mut p);
                let grad = tiles::Epilogue::ScoreGrad {
                    p: &p,
                    dd: &dd[..rows],
                };
                let (dos, vts) = (do_side.at_row(r0, hd), vt.side().at_col(k0));
                self.dm.block_scores(dos, vts, rows, nk, grad, &mut ds);
                // dQ = dS K; dK += dS^T Q; dV += P^T dO (over the block's visible keys).
                let dqb = &mut dqc[(g * t + r0) * hd..(g * t + r0 + rows) * hd];
                let (dkb, dvb) = (&mut dkc[k0 * hd..], &mut dvc[k0 * hd..]);
                let (ds_rows, ds_cols, p_cols) =
                    ((&ds[..], ps, 1), (&ds[..], 1, ps), (&p[..], 1, ps));
                let mode = self.mode;
                mode.narrow(rows, nk, hd, ds_rows, kb, (dqb, hd), false, scale);
                mode.narrow(nk, rows, hd, ds_cols, qb, (dkb, hd), true, scale);
                mode.narrow(nk, rows, hd, p_cols, dob, (dvb, hd), true, 1.0);
            }
        }
    }
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
    mode: Mode,
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
                mode,
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
