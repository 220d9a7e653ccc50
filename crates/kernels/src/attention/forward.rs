//! The attention forward: per query block, scores, softmax and the weighted sum of values;
//! each row keeps its log-sum-exp for the backward.

use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;
use rayon::prelude::*;

use super::{Dims, Mode, QUERY_BLOCK, bf16, tiles};
use crate::dense;

pub(super) fn forward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    scale: f32,
    starts: Option<&[u32]>,
    mode: Mode,
) -> (FlexTensor, FlexTensor) {
    let (q, k, v) = (dense(q), dense(k), dense(v));
    let dm = Dims::of(&q, &k);
    let Dims { b, hq, t, hd, .. } = dm;
    let (qs, ks, vs) = (q.storage::<f32>(), k.storage::<f32>(), v.storage::<f32>());
    let group = dm.group();
    let mut out = vec![0.0f32; b * hq * t * hd];
    let mut lse = vec![0.0f32; b * hq * t];
    // One task per (batch row, KV head): its query heads' outputs are contiguous.
    out.par_chunks_mut(group * t * hd)
        .zip(lse.par_chunks_mut(group * t))
        .enumerate()
        .for_each(|(task, (o, l))| {
            let args = ForwardTask {
                dm,
                task,
                qs,
                ks,
                vs,
                scale,
                mode,
                starts: starts.map(|st| &st[(task / dm.hkv) * t..(task / dm.hkv + 1) * t]),
            };
            args.run(o, l);
        });
    (
        FlexTensor::from_data(TensorData::new(out, [b, hq, t, hd])),
        FlexTensor::from_data(TensorData::new(lse, [b, hq, t])),
    )
}

/// One forward task: batch row and KV head `task`, all its query heads.
struct ForwardTask<'a> {
    dm: Dims,
    task: usize,
    qs: &'a [f32],
    ks: &'a [f32],
    vs: &'a [f32],
    scale: f32,
    mode: Mode,
    /// This batch row's document starts (`t` values), if packed.
    starts: Option<&'a [u32]>,
}

impl ForwardTask<'_> {
    #[inline(always)]
    fn run(&self, o: &mut [f32], l: &mut [f32]) {
        let Dims { t, hd, .. } = self.dm;
        let group = self.dm.group();
        let (bi, kh, span) = self.dm.kv_head(self.task);
        let (k, v) = (&self.ks[span.clone()], &self.vs[span]);
        let kt = self.dm.keys(k, self.mode);
        let ps = self.dm.stride();
        let mut p = self.dm.block_buffer();
        let mut inv = [0.0f32; QUERY_BLOCK];
        for g in 0..group {
            let q = &self.qs[self.dm.query_head(bi, kh * group + g)];
            let held = self.mode.rows(q);
            let q_side = bf16::Side::of(&held, q);
            for (r0, rows, k0, keys) in self.dm.query_blocks(self.starts) {
                // S = scale Q K^T over the block's visible keys `k0..keys` (column `j` of the
                // buffer is key `k0 + j`) with each row's max over its causal keys, then each
                // row's unnormalised softmax in place, keeping its log-sum-exp and the inverse
                // of its sum.
                let n = keys - k0;
                let lim = self.dm.limits(r0, rows, k0);
                let mut max = [f32::NEG_INFINITY; QUERY_BLOCK];
                let epilogue = tiles::Epilogue::Max {
                    scale: self.scale,
                    lim: &lim[..rows],
                    max: &mut max[..rows],
                };
                let (qb, ktb) = (q_side.at_row(r0, hd), kt.side().at_col(k0));
                self.dm.block_scores(qb, ktb, rows, n, epilogue, &mut p);
                for i in 0..rows {
                    let row = &mut p[i * ps..i * ps + n];
                    let sum = tiles::exp_row(row, lim[i] as usize, max[i]);
                    l[g * t + r0 + i] = max[i] + sum.ln();
                    inv[i] = 1.0 / sum;
                }
                // O = P V, each row then divided by its sum (a pass over `hd` values instead
                // of the row's keys).
                let ob = &mut o[(g * t + r0) * hd..(g * t + r0 + rows) * hd];
                let (pb, vb) = ((&p[..], ps, 1), &v[k0 * hd..]);
                self.mode.narrow(rows, n, hd, pb, vb, (ob, hd), false, 1.0);
                for (orow, w) in ob.chunks_exact_mut(hd).zip(&inv) {
                    orow.iter_mut().for_each(|x| *x *= w);
                }
            }
        }
    }
}
