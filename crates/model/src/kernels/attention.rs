//! Causal grouped-query attention for training, flash-style: no `[b, h, t, s]` tensor.
//!
//! Burn 0.22.1's Autodiff runs every attention through `attention_fallback`: the score matrix is
//! materialised, masked, soft-maxed (glibc `expf`) and kept for the backward, and the KV heads are
//! first copied `hq / hkv` times (`repeat_kv`). Here each task owns one KV head of one batch row
//! and the query heads that read it (no copies, no races on `dk`, `dv`):
//!
//! - forward, per query row: scores against the visible keys (bottom-right causal alignment, as
//!   with a KV cache), max, `exp` (vectorised), the weighted sum of values; only the row's
//!   log-sum-exp is saved;
//! - backward, per query row: the probabilities recomputed from the saved log-sum-exp,
//!   `dP = dO V^T`, `dS = P (dP - rowsum(dO * O))`, then `dQ = s dS K`, `dK += s dS^T Q`,
//!   `dV += P^T dO`.
//!
//! Packed rows (several documents per row) pass each query's document start, like
//! flash-attention's varlen interface: query `i` then sees keys `start(i)..=i` only. Query blocks
//! are cut at document starts, so every row of a block shares its first key, and the products
//! cover only the block's own document: keys of other documents are never computed, and a row of
//! short documents costs less than one long causal row.
//!
//! The products run through the `gemm` crate (the kernel Flex's matmul uses) on `[t, s]` score
//! blocks of one head at a time, on the task's thread; the causal half above the diagonal is
//! computed and zeroed (simpler than triangular tiles; a bound to remove with query tiling when
//! sequences grow long, since the block is `t x s` floats per task).

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
use std::sync::Arc;

use super::exp::exp_f32;
use super::mm::{Threads, mm};
use super::{dense, flex_training};

/// Backends with the fused causal attention: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedAttention: Backend {
    /// `softmax(q k^T * scale + causal) v` per query head; query head `h` reads KV head
    /// `h / (hq / hkv)`. `q: [b, hq, t, hd]`, `k`, `v`: `[b, hkv, s, hd]`, `s >= t`, query `i`
    /// sees keys `0..=s - t + i`. With `starts` (`[b, t]`, only when `s == t`), query `i` of
    /// row `r` sees keys `starts[r t + i]..=i`: its own document in a packed row.
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        starts: Option<Arc<[u32]>>,
    ) -> FloatTensor<Self>;
}

impl FusedAttention for Flex {
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        starts: Option<Arc<[u32]>>,
    ) -> FloatTensor<Self> {
        forward(&q, &k, &v, scale, starts.as_deref()).0
    }
}

impl<C: CheckpointStrategy> FusedAttention for Autodiff<Flex, C> {
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        starts: Option<Arc<[u32]>>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct AttentionBackward;

        impl Backward<Flex, 3> for AttentionBackward {
            /// `q`, `k`, `v`, the output, the log-sum-exp per query row, the scale and the
            /// document starts.
            type State = (
                FlexTensor,
                FlexTensor,
                FlexTensor,
                FlexTensor,
                FlexTensor,
                f32,
                Option<Arc<[u32]>>,
            );

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_q, node_k, node_v] = ops.parents;
                let d_out = grads.consume::<Flex>(&ops.node);
                let (q, k, v, out, lse, scale, starts) = ops.state;
                let (dq, dk, dv) =
                    backward(&d_out, &q, &k, &v, &out, &lse, scale, starts.as_deref());
                if let Some(node) = node_q {
                    grads.register::<Flex>(node.id, dq);
                }
                if let Some(node) = node_k {
                    grads.register::<Flex>(node.id, dk);
                }
                if let Some(node) = node_v {
                    grads.register::<Flex>(node.id, dv);
                }
            }
        }

        match AttentionBackward
            .prepare::<C>([q.node(), k.node(), v.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (qp, kp, vp) = (
                    dense(q.primitive()),
                    dense(k.primitive()),
                    dense(v.primitive()),
                );
                let (out, lse) = forward(&qp, &kp, &vp, scale, starts.as_deref());
                prep.finish((qp, kp, vp, out.clone(), lse, scale, starts), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(
                forward(
                    q.primitive(),
                    k.primitive(),
                    v.primitive(),
                    scale,
                    starts.as_deref(),
                )
                .0,
            ),
        }
    }
}

/// The fused causal attention on Flex (autodiff or not) in f32; `None` elsewhere, for the
/// composed path. `starts` (`[b, t]`, see [`crate::documents::Documents::starts`]) keeps the
/// documents of packed rows apart; it requires `s == t` (no KV cache).
///
/// # Shapes
/// - `q`: `[b, hq, t, hd]`, `k`, `v`: `[b, hkv, s, hd]` -> `[b, hq, t, hd]`
pub fn causal_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    scale: f32,
    starts: Option<&Arc<[u32]>>,
) -> Option<Tensor<4>> {
    let [b, hq, t, hd] = q.dims();
    let [bk, hkv, s, hdk] = k.dims();
    let ok = flex_training(&q.device())
        && [q.dtype(), k.dtype(), v.dtype()]
            .iter()
            .all(|d| *d == DType::F32)
        && bk == b
        && hdk == hd
        && v.dims() == k.dims()
        && hkv > 0
        && hq % hkv == 0
        && s >= t
        && t > 0
        && starts.is_none_or(|st| s == t && st.len() == b * t && starts_are_valid(st, t));
    if !ok {
        return None;
    }
    Some(Tensor::from_dispatch(
        <Dispatch as FusedAttention>::causal_attention(
            q.clone().into_dispatch(),
            k.clone().into_dispatch(),
            v.clone().into_dispatch(),
            scale,
            starts.cloned(),
        ),
    ))
}

/// Each query's start is at most the query itself and never decreases along a row, so the
/// kernel's blocks and slices stay in range (what [`crate::documents::Documents`] guarantees).
fn starts_are_valid(starts: &[u32], t: usize) -> bool {
    starts.chunks(t).all(|row| {
        row.iter()
            .enumerate()
            .all(|(i, &st)| st as usize <= i && (i == 0 || st == row[i - 1] || st as usize == i))
    })
}

/// Shapes of one call.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    hq: usize,
    hkv: usize,
    t: usize,
    s: usize,
    hd: usize,
}

impl Dims {
    fn of(q: &FlexTensor, k: &FlexTensor) -> Self {
        let (qs, ks) = (q.layout().shape(), k.layout().shape());
        Dims {
            b: qs[0],
            hq: qs[1],
            t: qs[2],
            hd: qs[3],
            hkv: ks[1],
            s: ks[2],
        }
    }
    fn group(&self) -> usize {
        self.hq / self.hkv
    }
    /// Task `task`'s batch row, KV head, and the span of that head's keys (or values) in a
    /// `[b, hkv, s, hd]` buffer.
    fn kv_head(&self, task: usize) -> (usize, usize, std::ops::Range<usize>) {
        let (bi, kh) = (task / self.hkv, task % self.hkv);
        let off = (bi * self.hkv + kh) * self.s * self.hd;
        (bi, kh, off..off + self.s * self.hd)
    }

    /// Keys visible to query row `i`.
    fn visible(&self, i: usize) -> usize {
        self.s - self.t + i + 1
    }

    /// The span of query head `h` of batch row `bi` in a `[b, hq, t, hd]` buffer.
    fn query_head(&self, bi: usize, h: usize) -> std::ops::Range<usize> {
        let start = (bi * self.hq + h) * self.t * self.hd;
        start..start + self.t * self.hd
    }

    /// A score buffer for one query block: `QUERY_BLOCK` rows of `s`.
    fn block_buffer(&self) -> Vec<f32> {
        vec![0.0f32; QUERY_BLOCK.min(self.t) * self.s]
    }

    /// `out[.., ..keys] = a b^T` for a block of `rows` query-side rows `a` (`[rows, hd]`) against
    /// the first `keys` rows of a KV head `b` (`[s, hd]`); `out` has row stride `s`.
    fn block_scores(&self, a: &[f32], b: &[f32], rows: usize, keys: usize, out: &mut [f32]) {
        let (hd, s) = (self.hd, self.s);
        mm(
            rows,
            keys,
            hd,
            (a, hd, 1),
            (b, 1, hd),
            (out, s),
            false,
            Threads::One,
        );
    }

    /// The query rows in blocks of at most [`QUERY_BLOCK`]: `(first row, rows, first key, keys
    /// visible to the block's last row)`. Products stop at those keys, so the causal upper
    /// triangle costs only its part inside each block's diagonal tile. With document `starts`
    /// (this batch row's `t` values) a block never crosses a document start, so all its rows
    /// share the first key, and keys of earlier documents are skipped.
    fn query_blocks<'s>(
        &self,
        starts: Option<&'s [u32]>,
    ) -> impl Iterator<Item = (usize, usize, usize, usize)> + 's {
        let dm = *self;
        let mut r0 = 0;
        std::iter::from_fn(move || {
            if r0 >= dm.t {
                return None;
            }
            let mut rows = QUERY_BLOCK.min(dm.t - r0);
            let k0 = match starts {
                Some(st) => {
                    let first = st[r0];
                    rows = st[r0 + 1..r0 + rows]
                        .iter()
                        .position(|&x| x != first)
                        .map_or(rows, |p| p + 1);
                    first as usize
                }
                None => 0,
            };
            let block = (r0, rows, k0, dm.visible(r0 + rows - 1));
            r0 += rows;
            Some(block)
        })
    }
}

/// Query rows per block: one height of the `gemm` micro-kernel (4 AVX-512 registers of 16).
const QUERY_BLOCK: usize = 64;

fn forward(
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

/// Independent accumulators of the row reductions (one AVX-512 register), so they vectorise.
const LANES: usize = 16;

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
fn backward(
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::{Device, Distribution};

    fn composed(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f32) -> Tensor<4> {
        let [b, hq, t, hd] = q.dims();
        let [_, hkv, s, _] = k.dims();
        let rep = |x: Tensor<4>| {
            x.unsqueeze_dim::<5>(2)
                .expand([b, hkv, hq / hkv, s, hd])
                .reshape([b, hq, s, hd])
        };
        let _ = t;
        let options = AttentionModuleOptions {
            scale: Some(f64::from(scale)),
            softcap: None,
            is_causal: true,
        };
        attention(q, rep(k), rep(v), None, None, options)
    }

    /// Packed rows: the kernel with per-query document starts against Burn's attention with the
    /// equivalent block-diagonal causal mask, values and q/k/v gradients. Boundaries fall inside
    /// the first 64-row query block and a document crosses its end; a one-token document; one
    /// row is a single document.
    #[test]
    fn fused_attention_keeps_packed_documents_apart() {
        use crate::documents::Documents;
        let device = Device::flex().autodiff();
        let (b, hq, hkv, t, hd) = (3, 4, 2, 100, 8);
        let lens: [&[usize]; 3] = [&[30, 1, 45, 24], &[100], &[64, 36]];
        let mut positions = Vec::new();
        for row in lens {
            for &n in row {
                positions.extend(0..n as u32);
            }
        }
        let docs = Documents::new(b, t, positions).unwrap();
        let normal = Distribution::Normal(0.0, 1.0);
        let q = Tensor::<4>::random([b, hq, t, hd], normal, &device).require_grad();
        let k = Tensor::<4>::random([b, hkv, t, hd], normal, &device).require_grad();
        let v = Tensor::<4>::random([b, hkv, t, hd], normal, &device).require_grad();
        let d_out = Tensor::<4>::random([b, hq, t, hd], normal, &device);
        let scale = (hd as f32).powf(-0.5);
        let fused = causal_attention(&q, &k, &v, scale, Some(docs.starts()))
            .expect("flex autodiff takes the kernel");
        let rep = |x: Tensor<4>| {
            x.unsqueeze_dim::<5>(2)
                .expand([b, hkv, hq / hkv, t, hd])
                .reshape([b, hq, t, hd])
        };
        let options = AttentionModuleOptions {
            scale: Some(f64::from(scale)),
            softcap: None,
            is_causal: false,
        };
        let mask = docs.mask(&device).expand([b, hq, t, t]);
        let reference = attention(
            q.clone(),
            rep(k.clone()),
            rep(v.clone()),
            Some(mask),
            None,
            options,
        );
        let value = (fused.clone() - reference.clone())
            .abs()
            .max()
            .into_scalar::<f32>();
        assert!(value <= 2e-5, "outputs differ by {value}");
        let ga = (fused * d_out.clone()).sum().backward();
        let gb = (reference * d_out).sum().backward();
        for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
            let (a, c) = (x.grad(&ga).unwrap(), x.grad(&gb).unwrap());
            let diff = (a - c).abs().max().into_scalar::<f32>();
            assert!(diff <= 5e-5, "d{name} differs by {diff}");
        }
    }

    /// Values and the gradients of q, k and v against Burn's attention (GQA by repeating KV
    /// heads), on Flex with autodiff; `s > t` checks the bottom-right causal alignment.
    #[test]
    fn fused_attention_matches_the_composed_attention() {
        let device = Device::flex().autodiff();
        for (b, hq, hkv, t, s, hd) in [
            (2, 4, 2, 9, 9, 8),
            (1, 8, 4, 64, 64, 32),
            (2, 2, 1, 5, 12, 16),
            (1, 3, 3, 1, 1, 4),
        ] {
            let normal = Distribution::Normal(0.0, 1.0);
            let q = Tensor::<4>::random([b, hq, t, hd], normal, &device).require_grad();
            let k = Tensor::<4>::random([b, hkv, s, hd], normal, &device).require_grad();
            let v = Tensor::<4>::random([b, hkv, s, hd], normal, &device).require_grad();
            let d_out = Tensor::<4>::random([b, hq, t, hd], normal, &device);
            let scale = (hd as f32).powf(-0.5) * 1.5;
            let fused =
                causal_attention(&q, &k, &v, scale, None).expect("flex autodiff takes the kernel");
            let reference = composed(q.clone(), k.clone(), v.clone(), scale);
            let value = (fused.clone() - reference.clone())
                .abs()
                .max()
                .into_scalar::<f32>();
            assert!(
                value <= 2e-5,
                "{:?}: outputs differ by {value}",
                (b, hq, hkv, t, s, hd)
            );
            let ga = (fused * d_out.clone()).sum().backward();
            let gb = (reference * d_out).sum().backward();
            for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
                let (a, c) = (x.grad(&ga).unwrap(), x.grad(&gb).unwrap());
                let diff = (a - c).abs().max().into_scalar::<f32>();
                assert!(
                    diff <= 5e-5,
                    "{:?}: d{name} differs by {diff}",
                    (b, hq, hkv, t, s, hd)
                );
            }
        }
    }
}
