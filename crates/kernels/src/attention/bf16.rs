//! The attention at bf16 precision (issue 41), as PyTorch's flash attention computes it on
//! CPU for bf16 inputs: every product's operands rounded to bf16 (`q`, `k`, `v`, `dO`, and the
//! probabilities and score gradients where they enter a product), the products exact and
//! summed in f32; the softmax, its sums and the log-sum-exp stay in f32.
//!
//! - The score products (`Q K^T`, `dO V^T`) run on [`tiles::wide_words`] where the CPU has
//!   AVX512-BF16: the rows and the transposed keys or values as pairs of bf16 ([`words`],
//!   [`transposed_words`]). Elsewhere the f32 score tiles run on rounded copies
//!   ([`rounded`]): the same products, summed in another order.
//! - The products that write `hd` columns go through the bf16 products of [`crate::bf16`] on
//!   the task's thread (which round their operands as they pack them, and emulate the kernel
//!   where the CPU has none).

use super::tiles;
use crate::bf16::{Operand, mm_bf16, round_bits};
use crate::mm::Threads;

/// The bits of `x` rounded to bf16 (round to nearest even), in a word's low half.
#[inline(always)]
fn bits(x: f32) -> u32 {
    u32::from(round_bits(x))
}

/// `x` rounded to bf16, as f32 (exactly representable).
pub(super) fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f32::from_bits(bits(v) << 16)).collect()
}

/// Rows of even length as pairs of bf16: word `i` holds `x[2i]` (low half) and `x[2i + 1]`.
pub(super) fn words(x: &[f32]) -> Vec<u32> {
    assert!(x.len().is_multiple_of(2), "pairs of elements");
    x.chunks_exact(2)
        .map(|p| bits(p[0]) | (bits(p[1]) << 16))
        .collect()
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

/// `c (+)= a @ b` at bf16 for `a: [m, k]` at strides `(a_rs, a_cs)`, `b: [k, hd]` row-major,
/// `c: [m, hd]` at row stride `c_rs`, on the calling thread (the products of
/// [`tiles::narrow`], unscaled).
pub(super) fn narrow(
    m: usize,
    k: usize,
    hd: usize,
    (a, a_rs, a_cs): (&[f32], usize, usize),
    b: &[f32],
    c: (&mut [f32], usize),
    accumulate: bool,
) {
    let (a, b) = (Operand::F32(a, a_rs, a_cs), Operand::F32(b, hd, 1));
    mm_bf16(m, hd, k, a, b, c, accumulate, Threads::One);
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
