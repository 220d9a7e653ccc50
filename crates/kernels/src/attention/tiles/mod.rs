//! The attention's products on register tiles, on AVX-512.
//!
//! At the usual head sizes every product of the attention has one small side: the score
//! products (`S = Q K^T`, `dP = dO V^T`) reduce over `hd` only, and the others (`O = P V`,
//! `dQ = dS K`, `dK = dS^T Q`, `dV = P^T dO`) write `hd` columns. Through `gemm` each call packs
//! both operands, and at `hd = 32` runs its edge micro-kernel two registers wide. The tiles here
//! read the operands where they lie and keep a whole output tile in registers:
//!
//! - [`wide`] (`hd` 32, 64 or 128): `c[m, n] = epilogue(a bt)`, `a: [m, hd]` row-major,
//!   `bt: [hd, n]` row-major (the keys or values transposed once per task): 8 rows times 3
//!   registers of 16 columns, and the softmax's row work on the tile while it is in registers
//!   (see [`Epilogue`]);
//! - [`narrow`] (`hd = 32` only): `c[m, 32] (+)= beta a b`, `a: [m, k]` at any strides,
//!   `b: [k, 32]` row-major: 12 output rows times 2 registers, one broadcast of `a` per row and
//!   step. At 64 and 128 `gemm`'s own kernels are faster than such tiles (measured in
//!   `benches/README.md`), so those sizes keep `gemm` for these products.
//!
//! Other head sizes and CPUs without AVX-512 take `gemm` (`mm_scaled`) on the same operands,
//! with the epilogues as passes over the rows.

use crate::exp::exp_f32;
use crate::mm::{Threads, extent, mm_scaled};

/// Floats in one AVX-512 register.
const W: usize = 16;

/// Whether the [`narrow`] tiles run here for this head size.
fn narrow_available(hd: usize) -> bool {
    hd == 32 && available(hd)
}

/// Whether the [`wide`] tiles run here for this head size.
pub(super) fn available(hd: usize) -> bool {
    matches!(hd, 32 | 64 | 128) && has_avx512()
}

/// Whether this CPU has AVX-512 (F).
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `c = beta a b` (or `c += beta a b` when `accumulate`) for `a: [m, k]` at strides
/// `(a_rs, a_cs)`, `b: [k, hd]` row-major, `c: [m, hd]` at row stride `c_rs`.
#[allow(clippy::too_many_arguments)]
pub(super) fn narrow(
    m: usize,
    k: usize,
    hd: usize,
    a: (&[f32], usize, usize),
    b: &[f32],
    c: (&mut [f32], usize),
    accumulate: bool,
    beta: f32,
) {
    narrow_on(narrow_available(hd), m, k, hd, a, b, c, accumulate, beta);
}

/// [`narrow`] on the tiles when `tiles` (which [`narrow_available`] must allow), else on
/// `gemm`.
#[allow(clippy::too_many_arguments)]
fn narrow_on(
    tiles: bool,
    m: usize,
    k: usize,
    hd: usize,
    (a, a_rs, a_cs): (&[f32], usize, usize),
    b: &[f32],
    (c, c_rs): (&mut [f32], usize),
    accumulate: bool,
    beta: f32,
) {
    assert!(a.len() >= extent(m, k, a_rs, a_cs), "lhs out of bounds");
    assert!(b.len() >= k * hd, "rhs out of bounds");
    assert!(c.len() >= extent(m, hd, c_rs, 1), "dst out of bounds");
    if m == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if tiles {
        assert_eq!(hd, 32, "the narrow tiles are two registers wide");
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        // SAFETY: AVX-512 was detected; the asserts keep every index the tiles touch inside
        // the slices (rows `< m`, steps `< k`, columns `< hd`), and `c` is a distinct `&mut`.
        unsafe { avx512::narrow::<2, 12>(m, k, (a, a_rs, a_cs), b, (c, c_rs), accumulate, beta) };
        return;
    }
    mm_scaled(
        m,
        hd,
        k,
        (a, a_rs, a_cs),
        (b, hd, 1),
        (c, c_rs),
        accumulate.then_some(1.0),
        beta,
        Threads::One,
    );
}

/// What [`wide`] does with each product `x = (a bt)[r, j]` before storing it. `lim[r]` is the
/// number of columns row `r` sees (its causal limit); the columns after it hold no score.
pub(super) enum Epilogue<'a> {
    /// Forward scores: `c = scale x`, and `max[r]` becomes the largest of what it held and
    /// `c[r, ..lim[r]]`.
    Max {
        scale: f32,
        lim: &'a [u32],
        max: &'a mut [f32],
    },
    /// Probabilities from the saved log-sum-exp: `c = exp(scale x - lse[r])` before `lim[r]`,
    /// 0 from there.
    Probs {
        scale: f32,
        lim: &'a [u32],
        lse: &'a [f32],
    },
    /// Score gradients from `x = dP`: `c = p (x - dd[r])`, with `p` the probabilities at the
    /// same place of another buffer of the same layout.
    ScoreGrad { p: &'a [f32], dd: &'a [f32] },
}

/// `c[.., ..n] = epilogue(a bt)` for `a: [m, hd]` row-major, `bt: [hd, n]` at row stride
/// `bt_rs`, `c: [m, n]` at row stride `c_rs`. The tiles compute whole registers of 16 columns:
/// `bt` and `c` must hold `n` rounded up to 16 columns (the extra columns of `c` get the
/// products of the extra columns of `bt`, or 0 past the rows' limits).
#[allow(clippy::too_many_arguments)]
pub(super) fn wide(
    m: usize,
    n: usize,
    hd: usize,
    a: &[f32],
    bt: (&[f32], usize),
    c: (&mut [f32], usize),
    epilogue: Epilogue,
) {
    wide_on(available(hd), m, n, hd, a, bt, c, epilogue);
}

/// [`wide`] on the tiles when `tiles` (which [`available`] must allow), else on `gemm`.
#[allow(clippy::too_many_arguments)]
fn wide_on(
    tiles: bool,
    m: usize,
    n: usize,
    hd: usize,
    a: &[f32],
    (bt, bt_rs): (&[f32], usize),
    (c, c_rs): (&mut [f32], usize),
    mut epilogue: Epilogue,
) {
    let cols = n.next_multiple_of(W);
    assert!(a.len() >= m * hd, "lhs out of bounds");
    assert!(bt.len() >= extent(hd, cols, bt_rs, 1), "rhs out of bounds");
    assert!(c.len() >= extent(m, cols, c_rs, 1), "dst out of bounds");
    epilogue.check(m, cols, c_rs);
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if tiles {
        // SAFETY: AVX-512 was detected; the asserts cover `m` rows of `cols` columns of `c`
        // (and of `p`), `hd` rows of `cols` columns of `bt`, and `m` rows of the epilogue's
        // per-row values, all the tiles touch.
        with_epi(m, epilogue, |epi| unsafe {
            let (a, bt, c) = (a.as_ptr(), (bt.as_ptr(), bt_rs), (c.as_mut_ptr(), c_rs));
            match hd {
                32 => avx512::wide::<32>(m, cols / W, a, bt, c, epi),
                64 => avx512::wide::<64>(m, cols / W, a, bt, c, epi),
                _ => avx512::wide::<128>(m, cols / W, a, bt, c, epi),
            }
        });
        return;
    }
    let beta = match epilogue {
        Epilogue::Max { scale, .. } | Epilogue::Probs { scale, .. } => scale,
        Epilogue::ScoreGrad { .. } => 1.0,
    };
    mm_scaled(
        m,
        n,
        hd,
        (a, hd, 1),
        (bt, bt_rs, 1),
        (c, c_rs),
        None,
        beta,
        Threads::One,
    );
    for r in 0..m {
        let row = &mut c[r * c_rs..r * c_rs + n];
        match &mut epilogue {
            Epilogue::Max { lim, max, .. } => max[r] = max[r].max(row_max(&row[..lim[r] as usize])),
            Epilogue::Probs { lim, lse, .. } => probs_row(row, lim[r] as usize, lse[r]),
            Epilogue::ScoreGrad { p, dd } => grad_row(row, &p[r * c_rs..r * c_rs + n], dd[r]),
        }
    }
}

impl Epilogue<'_> {
    /// The per-row values cover `m` rows (and `p` the block's `m` rows of `cols`).
    fn check(&self, m: usize, cols: usize, c_rs: usize) {
        match self {
            Epilogue::Max { lim, max, .. } => assert!(lim.len() >= m && max.len() >= m),
            Epilogue::Probs { lim, lse, .. } => assert!(lim.len() >= m && lse.len() >= m),
            Epilogue::ScoreGrad { p, dd } => {
                assert!(p.len() >= extent(m, cols, c_rs, 1) && dd.len() >= m)
            }
        }
    }
}

/// Run `tiles` with the epilogue as the tiles take it (raw pointers; the forward's row
/// maxima as 16 lanes per row over the column tiles, folded into `max` after).
#[cfg(target_arch = "x86_64")]
fn with_epi(m: usize, epilogue: Epilogue, tiles: impl FnOnce(avx512::Epi)) {
    let mut lanes = match epilogue {
        Epilogue::Max { .. } => vec![f32::NEG_INFINITY; m * W],
        _ => Vec::new(),
    };
    let epi = match &epilogue {
        Epilogue::Max { scale, lim, .. } => avx512::Epi::Max {
            scale: *scale,
            lim: lim.as_ptr(),
            lanes: lanes.as_mut_ptr(),
        },
        Epilogue::Probs { scale, lim, lse } => avx512::Epi::Probs {
            scale: *scale,
            lim: lim.as_ptr(),
            lse: lse.as_ptr(),
        },
        Epilogue::ScoreGrad { p, dd } => avx512::Epi::ScoreGrad {
            p: p.as_ptr(),
            dd: dd.as_ptr(),
        },
    };
    tiles(epi);
    if let Epilogue::Max { max, .. } = epilogue {
        for (mx, row) in max.iter_mut().zip(lanes.chunks_exact(W)) {
            *mx = row.iter().copied().fold(*mx, f32::max);
        }
    }
}

/// Whether [`wide_words`] runs here for this head size: the f32 tiles' head sizes, on a CPU
/// with AVX512-BF16 whose bf16 products are not capped to the emulation
/// ([`crate::bf16_path`]).
pub(super) fn words_available(hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        available(hd)
            && crate::bf16_path().has_kernel()
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hd;
        false
    }
}

/// [`wide`] with both operands as pairs of bf16 ([`words`]): `a: [m, hd / 2]` words, row
/// `i`'s word `p` holding its elements `2p` (low half) and `2p + 1`; `bt: [hd / 2, n]` words
/// at row stride `bt_rs`, word `(p, j)` holding elements `2p` and `2p + 1` of column `j`.
/// The products are exact in f32 and summed in f32; the epilogue is [`wide`]'s. Only where
/// [`words_available`] (panics elsewhere).
#[allow(clippy::too_many_arguments)]
pub(super) fn wide_words(
    m: usize,
    n: usize,
    hd: usize,
    a: &[u32],
    (bt, bt_rs): (&[u32], usize),
    (c, c_rs): (&mut [f32], usize),
    epilogue: Epilogue,
) {
    assert!(words_available(hd), "no bf16 score tiles for hd {hd} here");
    let cols = n.next_multiple_of(W);
    assert!(a.len() >= m * hd / 2, "lhs out of bounds");
    assert!(
        bt.len() >= extent(hd / 2, cols, bt_rs, 1),
        "rhs out of bounds"
    );
    assert!(c.len() >= extent(m, cols, c_rs, 1), "dst out of bounds");
    epilogue.check(m, cols, c_rs);
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX512-BF16 was detected (asserted); the asserts cover every word and float the
    // tiles touch, as in [`wide`].
    with_epi(m, epilogue, |epi| unsafe {
        let (a, bt, c) = (a.as_ptr(), (bt.as_ptr(), bt_rs), (c.as_mut_ptr(), c_rs));
        match hd {
            32 => words::wide_words::<32>(m, cols / W, a, bt, c, epi),
            64 => words::wide_words::<64>(m, cols / W, a, bt, c, epi),
            _ => words::wide_words::<128>(m, cols / W, a, bt, c, epi),
        }
    });
}

/// `c = beta a b` (or `c += beta a b` when `accumulate`) with both operands as pairs of bf16
/// along the reduction: `a: [m, pairs]` words, word `(i, p)` at `i a_rs + p a_ps`,
/// `b: [pairs, hd]` words (row-major), `c: [m, hd]` at row stride `c_rs`; the products exact
/// in f32, summed in f32. Only where [`words_available`] (panics elsewhere).
#[allow(clippy::too_many_arguments)]
pub(super) fn narrow_words(
    m: usize,
    pairs: usize,
    hd: usize,
    (a, (a_rs, a_ps)): (&[u32], (usize, usize)),
    b: &[u32],
    (c, c_rs): (&mut [f32], usize),
    accumulate: bool,
    beta: f32,
) {
    assert!(words_available(hd), "no bf16 tiles for hd {hd} here");
    assert!(a.len() >= extent(m, pairs, a_rs, a_ps), "lhs out of bounds");
    assert!(b.len() >= pairs * hd, "rhs out of bounds");
    assert!(c.len() >= extent(m, hd, c_rs, 1), "dst out of bounds");
    if m == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX512-BF16 was detected (asserted); the asserts cover the rows, pairs and
    // columns the tiles touch, and `c` is a distinct `&mut`.
    unsafe {
        let (a, b, c) = ((a.as_ptr(), a_rs, a_ps), b.as_ptr(), (c.as_mut_ptr(), c_rs));
        match hd {
            32 => words::narrow_words::<2, 12>(m, pairs, a, b, c, accumulate, beta),
            64 => words::narrow_words::<4, 6>(m, pairs, a, b, c, accumulate, beta),
            _ => words::narrow_words::<8, 3>(m, pairs, a, b, c, accumulate, beta),
        }
    }
}

/// `row[..n] = exp(row[..n] - max)` in place, `row[n..] = 0`; returns the sum of the
/// exponentials (the forward's softmax numerators).
pub(super) fn exp_row(row: &mut [f32], n: usize, max: f32) -> f32 {
    exp_row_on(has_avx512(), row, n, max)
}

/// [`exp_row`] in AVX-512 when `tiles` (which [`has_avx512`] must allow).
fn exp_row_on(tiles: bool, row: &mut [f32], n: usize, max: f32) -> f32 {
    assert!(n <= row.len(), "row limit out of bounds");
    #[cfg(target_arch = "x86_64")]
    if tiles {
        // SAFETY: AVX-512 was detected.
        return unsafe { avx512::exp_row(row, n, max) };
    }
    exp_row_dispatch(row, n, max)
}

simd_dispatch! {
    /// [`exp_row`] for other CPUs.
    fn exp_row_dispatch(row: &mut [f32], n: usize, max: f32) -> f32 = exp_row_generic
}

#[inline(always)]
fn exp_row_generic(row: &mut [f32], n: usize, max: f32) -> f32 {
    let (live, dead) = row.split_at_mut(n);
    let mut sums = [0.0f32; W];
    let mut chunks = live.chunks_exact_mut(W);
    for ch in &mut chunks {
        for l in 0..W {
            let e = exp_f32(ch[l] - max);
            ch[l] = e;
            sums[l] += e;
        }
    }
    // The last partial chunk runs as one more full chunk in a padded copy (a scalar tail loop
    // would cost as much as the rest of a short row), masked out of the sum.
    let rest = chunks.into_remainder();
    let mut tail = [0.0f32; W];
    tail[..rest.len()].copy_from_slice(rest);
    for l in 0..W {
        let e = exp_f32(tail[l] - max);
        tail[l] = e;
        sums[l] += if l < rest.len() { e } else { 0.0 };
    }
    rest.copy_from_slice(&tail[..rest.len()]);
    dead.fill(0.0);
    sums.iter().sum()
}

simd_dispatch! {
    /// The largest element (`-inf` for none).
    fn row_max(row: &[f32]) -> f32 = row_max_generic
}

#[inline(always)]
fn row_max_generic(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; W];
    let mut chunks = row.chunks_exact(W);
    for ch in &mut chunks {
        for l in 0..W {
            lanes[l] = if ch[l] > lanes[l] { ch[l] } else { lanes[l] };
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

simd_dispatch! {
    /// `row[j] = exp(row[j] - lse)` for `j < lim`, 0 after.
    fn probs_row(row: &mut [f32], lim: usize, lse: f32) = probs_row_generic
}

#[inline(always)]
fn probs_row_generic(row: &mut [f32], lim: usize, lse: f32) {
    let (live, dead) = row.split_at_mut(lim);
    live.iter_mut().for_each(|x| *x = exp_f32(*x - lse));
    dead.fill(0.0);
}

simd_dispatch! {
    /// `ds[j] = p[j] (ds[j] - dd)`.
    fn grad_row(ds: &mut [f32], p: &[f32], dd: f32) = grad_row_generic
}

#[inline(always)]
fn grad_row_generic(ds: &mut [f32], p: &[f32], dd: f32) {
    ds.iter_mut().zip(p).for_each(|(d, &p)| *d = p * (*d - dd));
}

/// The tiles of a score block of `$m` rows by `$regs` registers of 16 columns: 8 rows by 3
/// registers, then the edges with fewer (4 or 1 rows, 2 or 1 registers), column tiles outside;
/// `$tile::<$hd, R, J>($args(r, j))` for each, `r` its first row and `j` its first register.
/// The caller vouches for every tile's operands.
#[cfg(target_arch = "x86_64")]
macro_rules! score_tiles {
    ($m:expr, $regs:expr, $tile:ident::<$hd:ident>, $args:expr) => {{
        let (m, regs, args_of) = ($m, $regs, $args);
        let mut j = 0;
        while j < regs {
            let mut r = 0;
            while r < m {
                let rows = (m - r).min(8);
                let args = args_of(r, j);
                match (rows, regs - j) {
                    (8, 3..) => unsafe { $tile::<$hd, 8, 3>(args) },
                    (8, 2) => unsafe { $tile::<$hd, 8, 2>(args) },
                    (8, _) => unsafe { $tile::<$hd, 8, 1>(args) },
                    (4..8, 3..) => unsafe { $tile::<$hd, 4, 3>(args) },
                    (4..8, 2) => unsafe { $tile::<$hd, 4, 2>(args) },
                    (4..8, _) => unsafe { $tile::<$hd, 4, 1>(args) },
                    (_, 3..) => unsafe { $tile::<$hd, 1, 3>(args) },
                    (_, 2) => unsafe { $tile::<$hd, 1, 2>(args) },
                    _ => unsafe { $tile::<$hd, 1, 1>(args) },
                }
                r += match rows {
                    8 => 8,
                    4..8 => 4,
                    _ => 1,
                };
            }
            j += (regs - j).min(3);
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod words;

#[cfg(test)]
mod tests;
