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
//! The keys and values of the task's head are transposed once into `[hd, s]` scratch buffers so
//! that every inner loop is an axpy over a contiguous row (no horizontal sums).

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

/// Backends with the fused causal attention: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedAttention: Backend {
    /// `softmax(q k^T * scale + causal) v` per query head; query head `h` reads KV head
    /// `h / (hq / hkv)`. `q: [b, hq, t, hd]`, `k`, `v`: `[b, hkv, s, hd]`, `s >= t`, query `i`
    /// sees keys `0..=s - t + i`.
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self>;
}

impl FusedAttention for Flex {
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        forward(&q, &k, &v, scale).0
    }
}

impl<C: CheckpointStrategy> FusedAttention for Autodiff<Flex, C> {
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct AttentionBackward;

        impl Backward<Flex, 3> for AttentionBackward {
            /// `q`, `k`, `v`, the output, the log-sum-exp per query row, and the scale.
            type State = (
                FlexTensor,
                FlexTensor,
                FlexTensor,
                FlexTensor,
                FlexTensor,
                f32,
            );

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_q, node_k, node_v] = ops.parents;
                let d_out = grads.consume::<Flex>(&ops.node);
                let (q, k, v, out, lse, scale) = ops.state;
                let (dq, dk, dv) = backward(&d_out, &q, &k, &v, &out, &lse, scale);
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
                let (out, lse) = forward(&qp, &kp, &vp, scale);
                prep.finish((qp, kp, vp, out.clone(), lse, scale), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(forward(q.primitive(), k.primitive(), v.primitive(), scale).0)
            }
        }
    }
}

/// The fused causal attention on Flex (autodiff or not) in f32; `None` elsewhere, for the
/// composed path.
///
/// # Shapes
/// - `q`: `[b, hq, t, hd]`, `k`, `v`: `[b, hkv, s, hd]` -> `[b, hq, t, hd]`
pub fn causal_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    scale: f32,
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
        && t > 0;
    if !ok {
        return None;
    }
    Some(Tensor::from_dispatch(
        <Dispatch as FusedAttention>::causal_attention(
            q.clone().into_dispatch(),
            k.clone().into_dispatch(),
            v.clone().into_dispatch(),
            scale,
        ),
    ))
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
    /// Keys visible to query row `i`.
    fn visible(&self, i: usize) -> usize {
        self.s - self.t + i + 1
    }
}

/// `[s, hd]` row-major -> `[hd, s]`.
fn transpose_into(src: &[f32], s: usize, hd: usize, dst: &mut [f32]) {
    for j in 0..s {
        for d in 0..hd {
            dst[d * s + j] = src[j * hd + d];
        }
    }
}

/// `scores[..n] = sum_d q[d] * kt[d, ..n]` (kt is `[hd, s]`).
#[inline(always)]
fn scores_row(q: &[f32], kt: &[f32], s: usize, n: usize, scores: &mut [f32]) {
    scores[..n].iter_mut().for_each(|x| *x = 0.0);
    for (d, &qd) in q.iter().enumerate() {
        let row = &kt[d * s..d * s + n];
        for (x, &kv) in scores[..n].iter_mut().zip(row) {
            *x += qd * kv;
        }
    }
}

fn forward(q: &FlexTensor, k: &FlexTensor, v: &FlexTensor, scale: f32) -> (FlexTensor, FlexTensor) {
    let (q, k, v) = (dense(q), dense(k), dense(v));
    let dm = Dims::of(&q, &k);
    let Dims {
        b,
        hq,
        hkv,
        t,
        s,
        hd,
    } = dm;
    let (qs, ks, vs) = (q.storage::<f32>(), k.storage::<f32>(), v.storage::<f32>());
    let group = dm.group();
    let mut out = vec![0.0f32; b * hq * t * hd];
    let mut lse = vec![0.0f32; b * hq * t];
    // One task per (batch row, KV head): its query heads' outputs are contiguous.
    out.par_chunks_mut(group * t * hd)
        .zip(lse.par_chunks_mut(group * t))
        .enumerate()
        .for_each(|(task, (o, l))| {
            let (bi, kh) = (task / hkv, task % hkv);
            let kv_off = (bi * hkv + kh) * s * hd;
            let mut kt = vec![0.0f32; hd * s];
            transpose_into(&ks[kv_off..kv_off + s * hd], s, hd, &mut kt);
            let vh = &vs[kv_off..kv_off + s * hd];
            let mut scores = vec![0.0f32; s];
            for g in 0..group {
                let h = kh * group + g;
                let q_off = (bi * hq + h) * t * hd;
                for i in 0..t {
                    let n = dm.visible(i);
                    let qi = &qs[q_off + i * hd..q_off + (i + 1) * hd];
                    row_forward(
                        qi,
                        &kt,
                        vh,
                        s,
                        hd,
                        n,
                        scale,
                        &mut scores,
                        &mut o[(g * t + i) * hd..(g * t + i + 1) * hd],
                        &mut l[g * t + i],
                    );
                }
            }
        });
    (
        FlexTensor::from_data(TensorData::new(out, [b, hq, t, hd])),
        FlexTensor::from_data(TensorData::new(lse, [b, hq, t])),
    )
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn row_forward(
    qi: &[f32],
    kt: &[f32],
    vh: &[f32],
    s: usize,
    hd: usize,
    n: usize,
    scale: f32,
    scores: &mut [f32],
    o: &mut [f32],
    lse: &mut f32,
) {
    scores_row(qi, kt, s, n, scores);
    let mut max = f32::NEG_INFINITY;
    for x in scores[..n].iter_mut() {
        *x *= scale;
        max = max.max(*x);
    }
    let mut sum = 0.0f32;
    for x in scores[..n].iter_mut() {
        *x = exp_f32(*x - max);
        sum += *x;
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|x| *x = 0.0);
    for (j, &p) in scores[..n].iter().enumerate() {
        let w = p * inv;
        for (x, &vv) in o.iter_mut().zip(&vh[j * hd..(j + 1) * hd]) {
            *x += w * vv;
        }
    }
    *lse = max + sum.ln();
}

#[allow(clippy::type_complexity)]
fn backward(
    d_out: &FlexTensor,
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    out: &FlexTensor,
    lse: &FlexTensor,
    scale: f32,
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
            let (bi, kh) = (task / hkv, task % hkv);
            let kv_off = (bi * hkv + kh) * s * hd;
            let (kh_rows, vh_rows) = (&ks[kv_off..kv_off + s * hd], &vs[kv_off..kv_off + s * hd]);
            let mut kt = vec![0.0f32; hd * s];
            let mut vt = vec![0.0f32; hd * s];
            transpose_into(kh_rows, s, hd, &mut kt);
            transpose_into(vh_rows, s, hd, &mut vt);
            let mut p = vec![0.0f32; s];
            let mut dp = vec![0.0f32; s];
            for g in 0..group {
                let h = kh * group + g;
                let q_off = (bi * hq + h) * t * hd;
                for i in 0..t {
                    let n = dm.visible(i);
                    let r = q_off + i * hd;
                    let (qi, oi, doi) = (&qs[r..r + hd], &os[r..r + hd], &dos[r..r + hd]);
                    // P recomputed from the log-sum-exp.
                    scores_row(qi, &kt, s, n, &mut p);
                    let l = ls[(bi * hq + h) * t + i];
                    for x in p[..n].iter_mut() {
                        *x = exp_f32(*x * scale - l);
                    }
                    // dP = dO V^T; D = rowsum(dO * O).
                    scores_row(doi, &vt, s, n, &mut dp);
                    let dd: f32 = doi.iter().zip(oi).map(|(a, c)| a * c).sum();
                    let dqi = &mut dqc[(g * t + i) * hd..(g * t + i + 1) * hd];
                    for j in 0..n {
                        let ds = p[j] * (dp[j] - dd) * scale;
                        let kj = &kh_rows[j * hd..(j + 1) * hd];
                        let dkj = &mut dkc[j * hd..(j + 1) * hd];
                        let dvj = &mut dvc[j * hd..(j + 1) * hd];
                        let pj = p[j];
                        for d in 0..hd {
                            dqi[d] += ds * kj[d];
                            dkj[d] += ds * qi[d];
                            dvj[d] += pj * doi[d];
                        }
                    }
                }
            }
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
                causal_attention(&q, &k, &v, scale).expect("flex autodiff takes the kernel");
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
