//! The attention at bf16 precision (issue 41), as PyTorch's flash attention computes it on
//! CPU for bf16 inputs: every product's operands rounded to bf16 (`q`, `k`, `v`, `dO`, and the
//! probabilities and score gradients where they enter a product), the products exact and
//! summed in f32; the softmax, its sums and the log-sum-exp stay in f32.
//!
//! - The score products (`Q K^T`, `dO V^T`) run on [`tiles::wide_words`] where the CPU has
//!   AVX512-BF16: the rows and the transposed keys or values as pairs of bf16 ([`words`],
//!   [`transposed_words`]). Elsewhere the f32 score tiles run on rounded copies
//!   ([`rounded`]): the same products, summed in another order.
//! - The products that write `hd` columns run on [`tiles::narrow_words`] there too, both
//!   operands rounded into pairs along the reduction per product ([`narrow`]); elsewhere
//!   through the bf16 products of [`crate::bf16`] on the task's thread (which round their
//!   operands as they pack them, and emulate the kernel where the CPU has none).

use super::tiles;
use crate::bf16::{Operand, mm_bf16, round_bits};
use crate::mm::Threads;

/// The bits of `x` rounded to bf16 (round to nearest even), in a word's low half.
#[inline(always)]
fn bits(x: f32) -> u32 {
    u32::from(round_bits(x))
}

/// `x` rounded to bf16, as f32 (exactly representable): [`crate::bf16::rounded`] of one row.
pub(super) fn rounded(x: &[f32]) -> Vec<f32> {
    crate::bf16::rounded(Operand::F32(x, x.len(), 1), 1, x.len())
}

/// Rows of even length as pairs of bf16: word `i` holds `x[2i]` (low half) and `x[2i + 1]`.
pub(super) fn words(x: &[f32]) -> Vec<u32> {
    assert!(x.len().is_multiple_of(2), "pairs of elements");
    let mut out = vec![0u32; x.len() / 2];
    pairs_across(x, 1, x.len(), x.len(), &mut out);
    out
}

/// `x: [s, hd]` (row-major, `hd` even) as `[hd / 2, ts]` words (`ts >= s`): word `(p, j)`
/// holds elements `2p` and `2p + 1` of row `j` rounded to bf16; zeros past `s`.
pub(super) fn transposed_words(x: &[f32], s: usize, hd: usize, ts: usize) -> Vec<u32> {
    assert!(hd.is_multiple_of(2) && ts >= s && x.len() >= s * hd);
    let mut out = vec![0u32; hd / 2 * ts];
    for (j, row) in x[..s * hd].chunks_exact(hd).enumerate() {
        for (p, pair) in row.chunks_exact(2).enumerate() {
            out[p * ts + j] = bits(pair[0]) | (bits(pair[1]) << 16);
        }
    }
    out
}

simd_dispatch! {
    /// `x: [rows, cols]` (row stride `rs`) into `out: [rows, cols.div_ceil(2)]` words of pairs
    /// along each row, rounded to bf16; a last odd element's high half 0.
    fn pairs_across(x: &[f32], rows: usize, cols: usize, rs: usize, out: &mut [u32]) = pairs_across_generic
}

#[inline(always)]
fn pairs_across_generic(x: &[f32], rows: usize, cols: usize, rs: usize, out: &mut [u32]) {
    let pairs = cols.div_ceil(2);
    for (i, o) in out[..rows * pairs].chunks_exact_mut(pairs).enumerate() {
        let mut it = x[i * rs..i * rs + cols].chunks_exact(2);
        for (w, p) in o.iter_mut().zip(&mut it) {
            *w = bits(p[0]) | (bits(p[1]) << 16);
        }
        if let [last] = it.remainder() {
            o[pairs - 1] = bits(*last);
        }
    }
}

simd_dispatch! {
    /// `x: [rows, cols]` (row stride `rs`) into `out: [rows.div_ceil(2), cols]` words of pairs
    /// of rows, rounded to bf16; a last odd row paired with zeros.
    fn pairs_down(x: &[f32], rows: usize, cols: usize, rs: usize, out: &mut [u32]) = pairs_down_generic
}

#[inline(always)]
fn pairs_down_generic(x: &[f32], rows: usize, cols: usize, rs: usize, out: &mut [u32]) {
    for (q, o) in out[..rows.div_ceil(2) * cols]
        .chunks_exact_mut(cols)
        .enumerate()
    {
        let lo = &x[2 * q * rs..2 * q * rs + cols];
        if 2 * q + 1 < rows {
            let hi = &x[(2 * q + 1) * rs..(2 * q + 1) * rs + cols];
            for ((w, &l), &h) in o.iter_mut().zip(lo).zip(hi) {
                *w = bits(l) | (bits(h) << 16);
            }
        } else {
            for (w, &l) in o.iter_mut().zip(lo) {
                *w = bits(l);
            }
        }
    }
}

/// `c = beta a b` (or `c += beta a b` when `accumulate`) at bf16 for `a: [m, k]` at strides
/// `(a_rs, a_cs)`, `b: [k, hd]` row-major, `c: [m, hd]` at row stride `c_rs`, on the calling
/// thread (the products of [`tiles::narrow`]): on the words tiles when `words`
/// ([`tiles::narrow_words`], both operands rounded into pairs here), else through the bf16
/// products of [`crate::bf16`], then scaled.
#[allow(clippy::too_many_arguments)]
pub(super) fn narrow(
    words: bool,
    m: usize,
    k: usize,
    hd: usize,
    (a, a_rs, a_cs): (&[f32], usize, usize),
    b: &[f32],
    (c, c_rs): (&mut [f32], usize),
    accumulate: bool,
    beta: f32,
) {
    if words {
        let pairs = k.div_ceil(2);
        // Buffers kept by the thread across calls (fresh ones are faulted in each time).
        let (mut aw, mut bw) = SCRATCH.take();
        aw.resize(m * pairs, 0);
        bw.resize(pairs * hd, 0);
        // `a` by rows (`[m, pairs]`) or, read down its columns, by pairs (`[pairs, m]`): each
        // built in memory order.
        let a_strides = if a_cs == 1 {
            pairs_across(a, m, k, a_rs, &mut aw);
            (pairs, 1)
        } else {
            assert_eq!(a_rs, 1, "one stride of `a` must be 1");
            pairs_down(a, k, m, a_cs, &mut aw);
            (1, m)
        };
        pairs_down(b, k, hd, hd, &mut bw);
        tiles::narrow_words(
            m,
            pairs,
            hd,
            (&aw, a_strides),
            &bw,
            (c, c_rs),
            accumulate,
            beta,
        );
        SCRATCH.set((aw, bw));
        return;
    }
    let (a, b) = (Operand::F32(a, a_rs, a_cs), Operand::F32(b, hd, 1));
    let rows = |c: &mut [f32]| {
        (0..m).for_each(|i| {
            c[i * c_rs..i * c_rs + hd]
                .iter_mut()
                .for_each(|x| *x *= beta)
        })
    };
    if !accumulate {
        mm_bf16(m, hd, k, a, b, (c, c_rs), false, Threads::One);
        if beta != 1.0 {
            rows(c);
        }
    } else if beta == 1.0 {
        mm_bf16(m, hd, k, a, b, (c, c_rs), true, Threads::One);
    } else {
        let mut t = vec![0.0f32; m * hd];
        mm_bf16(m, hd, k, a, b, (&mut t, hd), false, Threads::One);
        for (i, row) in t.chunks_exact(hd).enumerate() {
            let out = &mut c[i * c_rs..i * c_rs + hd];
            out.iter_mut().zip(row).for_each(|(o, x)| *o += beta * x);
        }
    }
}

thread_local! {
    /// [`narrow`]'s operands as words.
    static SCRATCH: std::cell::Cell<(Vec<u32>, Vec<u32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// Query-side rows or keys held for the score products at bf16: rounded f32 or words.
pub(super) enum Held {
    F32(Vec<f32>),
    Words(Vec<u32>),
}

impl Held {
    /// Rows `[n, hd]` for the left side of the score products.
    pub(super) fn rows(x: &[f32], words_tiles: bool) -> Self {
        if words_tiles {
            Held::Words(words(x))
        } else {
            Held::F32(rounded(x))
        }
    }

    /// The whole buffer as a side of the score products.
    pub(super) fn side(&self) -> Side<'_> {
        match self {
            Held::F32(x) => Side::F32(x),
            Held::Words(x) => Side::Words(x),
        }
    }
}

/// One side of a score product: f32 elements, or words of two bf16 along `hd`.
#[derive(Clone, Copy)]
pub(super) enum Side<'a> {
    F32(&'a [f32]),
    Words(&'a [u32]),
}

impl<'a> Side<'a> {
    /// `held`'s buffer, or `x` read in place where nothing is held (f32).
    pub(super) fn of(held: &'a Option<Held>, x: &'a [f32]) -> Side<'a> {
        held.as_ref().map_or(Side::F32(x), Held::side)
    }

    /// From row `r` of rows of `hd` elements.
    pub(super) fn at_row(self, r: usize, hd: usize) -> Side<'a> {
        match self {
            Side::F32(x) => Side::F32(&x[r * hd..]),
            Side::Words(x) => Side::Words(&x[r * hd / 2..]),
        }
    }

    /// From column `j` of a transposed side.
    pub(super) fn at_col(self, j: usize) -> Side<'a> {
        match self {
            Side::F32(x) => Side::F32(&x[j..]),
            Side::Words(x) => Side::Words(&x[j..]),
        }
    }
}

/// `c[.., ..n] = epilogue(a bt)` on the tiles of the sides' kind ([`tiles::wide`],
/// [`tiles::wide_words`]); `bt_rs` counts elements or words.
#[allow(clippy::too_many_arguments)]
pub(super) fn scores(
    m: usize,
    n: usize,
    hd: usize,
    a: Side<'_>,
    (bt, bt_rs): (Side<'_>, usize),
    c: (&mut [f32], usize),
    epilogue: tiles::Epilogue,
) {
    match (a, bt) {
        (Side::F32(a), Side::F32(bt)) => tiles::wide(m, n, hd, a, (bt, bt_rs), c, epilogue),
        (Side::Words(a), Side::Words(bt)) => {
            tiles::wide_words(m, n, hd, a, (bt, bt_rs), c, epilogue)
        }
        _ => unreachable!("both sides of a score product are of one kind"),
    }
}
