//! Causal grouped-query attention for training, flash-style: no `[b, h, t, s]` tensor.
//!
//! Burn 0.22.1's Autodiff runs every attention through `attention_fallback`: the score matrix is
//! materialised, masked, soft-maxed (glibc `expf`) and kept for the backward, and the KV heads are
//! first copied `hq / hkv` times (`repeat_kv`). Here each task owns one KV head of one batch row
//! and the query heads that read it (no copies, no races on `dk`, `dv`):
//!
//! - forward, per query row: scores against the visible keys (bottom-right causal alignment, as
//!   with a KV cache), max, `exp` (vectorised), the weighted sum of values divided by the sum of
//!   the exponentials; only the row's log-sum-exp is saved;
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
//! The products work on blocks of 64 query rows against the keys visible to the block's last
//! row, one head at a time, on the task's thread: the causal triangle costs only its part inside
//! each block's diagonal tile, and a block's score buffer is `64 x s` floats (1 MB at 4096
//! keys). At `head_dim` 32, 64 and 128 on AVX-512 they run on register tiles ([`tiles`]) that
//! read the operands in place; the row passes ride on the score tiles (the forward's row max,
//! the backward's probabilities and score gradients), and the softmax's division is applied to
//! the output rows instead of the probabilities. Elsewhere the same products run through
//! `gemm` with the same epilogues as separate row passes.
//!
//! At bf16 precision (a bf16 model or LoRA base, mixed-precision training) every product takes
//! bf16 operands with f32 sums, the softmax staying f32, as PyTorch's flash attention for bf16
//! on CPU ([`bf16`]).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor};
use std::sync::Arc;

use super::dense;
use super::flex_training;
use crate::products::Precision;

mod backward;
mod bf16;
#[cfg(test)]
mod bf16_tests;
mod forward;
#[cfg(test)]
mod tests;
mod tiles;

use backward::backward;
use forward::forward;

/// Backends with the fused causal attention: Flex, and Autodiff over Flex (with its backward).
#[backend_extension(Flex, Autodiff)]
pub trait FusedAttention: Backend {
    /// `softmax(q k^T * scale + causal) v` per query head; query head `h` reads KV head
    /// `h / (hq / hkv)`. `q: [b, hq, t, hd]`, `k`, `v`: `[b, hkv, s, hd]`, `s >= t`, query `i`
    /// sees keys `0..=s - t + i`. With `starts` (`[b, t]`, only when `s == t`), query `i` of
    /// row `r` sees keys `starts[r t + i]..=i`: its own document in a packed row. The products
    /// (and the backward's) at `precision` ([`bf16`]).
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        starts: Option<Arc<[u32]>>,
        precision: Precision,
    ) -> FloatTensor<Self>;
}

impl FusedAttention for Flex {
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        starts: Option<Arc<[u32]>>,
        precision: Precision,
    ) -> FloatTensor<Self> {
        let mode = Mode::of(precision, q.layout().shape()[3]);
        forward(&q, &k, &v, scale, starts.as_deref(), mode).0
    }
}

impl<C: CheckpointStrategy> FusedAttention for Autodiff<Flex, C> {
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        starts: Option<Arc<[u32]>>,
        precision: Precision,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct AttentionBackward;

        impl Backward<Flex, 3> for AttentionBackward {
            /// `q`, `k`, `v`, the output, the log-sum-exp per query row, the scale, the
            /// document starts and the forward's products.
            type State = (
                FlexTensor,
                FlexTensor,
                FlexTensor,
                FlexTensor,
                FlexTensor,
                f32,
                Option<Arc<[u32]>>,
                Mode,
            );

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_q, node_k, node_v] = ops.parents;
                let d_out = grads.consume::<Flex>(&ops.node);
                let (q, k, v, out, lse, scale, starts, mode) = ops.state;
                let (dq, dk, dv) = backward(
                    &d_out,
                    &q,
                    &k,
                    &v,
                    &out,
                    &lse,
                    scale,
                    starts.as_deref(),
                    mode,
                );
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

        let mode = Mode::of(precision, q.primitive().layout().shape()[3]);
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
                let (out, lse) = forward(&qp, &kp, &vp, scale, starts.as_deref(), mode);
                prep.finish((qp, kp, vp, out.clone(), lse, scale, starts, mode), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(
                forward(
                    q.primitive(),
                    k.primitive(),
                    v.primitive(),
                    scale,
                    starts.as_deref(),
                    mode,
                )
                .0,
            ),
        }
    }
}

/// The fused causal attention on Flex (autodiff or not) on f32 tensors, its products at
/// `precision`; `None` elsewhere, for the composed path. `starts` (`[b, t]`, as
/// `qwen_burn_model::Documents::starts` builds it) keeps the documents of packed rows apart; it
/// requires `s == t` (no KV cache).
///
/// # Shapes
/// - `q`: `[b, hq, t, hd]`, `k`, `v`: `[b, hkv, s, hd]` -> `[b, hq, t, hd]`
pub fn causal_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    scale: f32,
    starts: Option<&Arc<[u32]>>,
    precision: Precision,
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
            precision,
        ),
    ))
}

/// Each query's start is at most the query itself and never decreases along a row, so the
/// kernel's blocks and slices stay in range (what `qwen_burn_model::Documents` guarantees).
fn starts_are_valid(starts: &[u32], t: usize) -> bool {
    starts.chunks(t).all(|row| {
        row.iter()
            .enumerate()
            .all(|(i, &st)| st as usize <= i && (i == 0 || st == row[i - 1] || st as usize == i))
    })
}

/// How one call's products run: in f32, or at bf16 with the score products on the words
/// tiles (`words`) or on rounded copies ([`bf16`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    F32,
    Bf16 { words: bool },
}

impl Mode {
    fn of(precision: Precision, hd: usize) -> Self {
        match precision {
            Precision::F32 => Mode::F32,
            Precision::Bf16 => Mode::Bf16 {
                words: tiles::words_available(hd),
            },
        }
    }

    /// Query-side rows `[n, hd]` as the score products read them at this mode: held at bf16
    /// ([`bf16::Held::rows`]), read in place at f32 ([`bf16::Side::of`]).
    fn rows(self, x: &[f32]) -> Option<bf16::Held> {
        match self {
            Mode::F32 => None,
            Mode::Bf16 { words } => Some(bf16::Held::rows(x, words)),
        }
    }

    /// `c = beta a b` (or `c += beta a b` when `accumulate`), the products that write `hd`
    /// columns, at this mode: [`tiles::narrow`] or [`bf16::narrow`].
    #[allow(clippy::too_many_arguments)]
    fn narrow(
        self,
        m: usize,
        k: usize,
        hd: usize,
        a: (&[f32], usize, usize),
        b: &[f32],
        c: (&mut [f32], usize),
        accumulate: bool,
        beta: f32,
    ) {
        match self {
            Mode::F32 => tiles::narrow(m, k, hd, a, b, c, accumulate, beta),
            Mode::Bf16 { words } => bf16::narrow(words, m, k, hd, a, b, c, accumulate, beta),
        }
    }
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

    /// Row stride of the score buffers: `s` rounded up to whole registers of 16, which the
    /// score tiles write (see [`tiles::wide`]).
    fn stride(&self) -> usize {
        self.s.next_multiple_of(LANES)
    }

    /// A score buffer for one query block: `QUERY_BLOCK` rows of [`Dims::stride`].
    fn block_buffer(&self) -> Vec<f32> {
        vec![0.0f32; QUERY_BLOCK.min(self.t) * self.stride()]
    }

    /// A KV head's keys or values (`[s, hd]`) transposed to `[hd, s]`, at the row stride
    /// [`Dims::kt_stride`], zeros past `s`: the right-hand side of the score tiles, which read
    /// up to 15 columns past a block's last key.
    fn transposed(&self, x: &[f32]) -> Vec<f32> {
        let (hd, ts) = (self.hd, self.kt_stride());
        let mut out = vec![0.0f32; hd * ts];
        for (j, row) in x[..self.s * hd].chunks_exact(hd).enumerate() {
            for (d, &e) in row.iter().enumerate() {
                out[d * ts + j] = e;
            }
        }
        out
    }

    /// A KV head's keys or values as the score products' right side at `mode`: as
    /// [`Dims::transposed`], of the values rounded to bf16 or as words ([`bf16`]).
    fn keys(&self, x: &[f32], mode: Mode) -> bf16::Held {
        match mode {
            Mode::F32 => bf16::Held::F32(self.transposed(x)),
            Mode::Bf16 { words: false } => {
                bf16::Held::F32(self.transposed(&bf16::rounded(&x[..self.s * self.hd])))
            }
            Mode::Bf16 { words: true } => {
                bf16::Held::Words(bf16::transposed_words(x, self.s, self.hd, self.kt_stride()))
            }
        }
    }

    /// Row stride of [`Dims::transposed`].
    fn kt_stride(&self) -> usize {
        self.stride() + LANES
    }

    /// `out[.., ..keys] = epilogue(a b^T)` for a block of `rows` query-side rows `a`
    /// (`[rows, hd]`) against the keys (or values) `bt`, transposed (from
    /// [`Dims::transposed`], offset to the block's first key); `out` has row stride
    /// [`Dims::stride`] and gets `keys` rounded up to 16 columns.
    fn block_scores(
        &self,
        a: bf16::Side<'_>,
        bt: bf16::Side<'_>,
        rows: usize,
        keys: usize,
        epilogue: tiles::Epilogue,
        out: &mut [f32],
    ) {
        bf16::scores(
            rows,
            keys,
            self.hd,
            a,
            (bt, self.kt_stride()),
            (out, self.stride()),
            epilogue,
        );
    }

    /// Each row's causal limit in a block: the keys from `k0` that row `r0 + i` sees.
    fn limits(&self, r0: usize, rows: usize, k0: usize) -> [u32; QUERY_BLOCK] {
        let mut lim = [0u32; QUERY_BLOCK];
        for (i, l) in lim[..rows].iter_mut().enumerate() {
            *l = (self.visible(r0 + i) - k0) as u32;
        }
        lim
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

/// Independent accumulators of the row reductions (one AVX-512 register), so they vectorise.
const LANES: usize = 16;
