//! The attention forward: per query block, scores, softmax and the weighted sum of values;
//! each row keeps its log-sum-exp for the backward.

use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;
use rayon::prelude::*;

use super::{Dims, LANES};
use crate::dense;
use crate::exp::exp_f32;
use crate::mm::{Threads, mm};

pub(super) fn forward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    scale: f32,
    starts: Option<&[u32]>,
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
    /// This batch row's document starts (`t` values), if packed.
    starts: Option<&'a [u32]>,
}

impl ForwardTask<'_> {
    #[inline(always)]
    fn run(&self, o: &mut [f32], l: &mut [f32]) {
        let Dims { t, s, hd, .. } = self.dm;
        let group = self.dm.group();
        let (bi, kh, span) = self.dm.kv_head(self.task);
        let (k, v) = (&self.ks[span.clone()], &self.vs[span]);
        let mut p = self.dm.block_buffer();
        for g in 0..group {
            let q = &self.qs[self.dm.query_head(bi, kh * group + g)];
            for (r0, rows, k0, keys) in self.dm.query_blocks(self.starts) {
                // S = Q K^T over the block's visible keys `k0..keys` (column `j` of the buffer
                // is key `k0 + j`), then each row's causal softmax in place (P), keeping its
                // log-sum-exp.
                let n = keys - k0;
                let qb = &q[r0 * hd..(r0 + rows) * hd];
                self.dm.block_scores(qb, &k[k0 * hd..], rows, n, &mut p);
                for i in 0..rows {
                    let row = &mut p[i * s..i * s + n];
                    l[g * t + r0 + i] = softmax_row(row, self.dm.visible(r0 + i) - k0, self.scale);
                }
                // O = P V.
                let ob = &mut o[(g * t + r0) * hd..(g * t + r0 + rows) * hd];
                mm(
                    rows,
                    hd,
                    n,
                    (&p, s, 1),
                    (&v[k0 * hd..], hd, 1),
                    (ob, hd),
                    false,
                    Threads::One,
                );
            }
        }
    }
}

simd_dispatch! {
    /// `row[..n] = softmax(row[..n] * scale)` in place, `row[n..] = 0`; returns the row's
    /// log-sum-exp of the scaled scores.
    fn softmax_row(row: &mut [f32], n: usize, scale: f32) -> f32 = softmax_row_generic
}

#[inline(always)]
fn softmax_row_generic(row: &mut [f32], n: usize, scale: f32) -> f32 {
    let (live, dead) = row.split_at_mut(n);
    let body = n - n % LANES;
    // The last partial chunk runs as one more full chunk in a padded copy (a scalar tail loop
    // would cost as much as the rest of a short row): -inf scores, masked out of the sum.
    let mut tail = [f32::NEG_INFINITY; LANES];
    let valid = live.len() - body;
    tail[..valid].copy_from_slice(&live[body..]);
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for ch in live[..body].chunks_exact_mut(LANES) {
        for l in 0..LANES {
            ch[l] *= scale;
            lanes[l] = lanes[l].max(ch[l]);
        }
    }
    for l in 0..LANES {
        tail[l] *= scale;
        lanes[l] = lanes[l].max(tail[l]);
    }
    let max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sums = [0.0f32; LANES];
    for ch in live[..body].chunks_exact_mut(LANES) {
        for l in 0..LANES {
            let e = exp_f32(ch[l] - max);
            ch[l] = e;
            sums[l] += e;
        }
    }
    for l in 0..LANES {
        let e = if l < valid {
            exp_f32(tail[l] - max)
        } else {
            0.0
        };
        tail[l] = e;
        sums[l] += e;
    }
    let sum: f32 = sums.iter().sum();
    let inv = 1.0 / sum;
    live[body..].copy_from_slice(&tail[..valid]);
    live.iter_mut().for_each(|x| *x *= inv);
    dead.fill(0.0);
    max + sum.ln()
}
