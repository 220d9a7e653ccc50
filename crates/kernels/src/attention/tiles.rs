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
    match &epilogue {
        Epilogue::Max { lim, max, .. } => assert!(lim.len() >= m && max.len() >= m),
        Epilogue::Probs { lim, lse, .. } => assert!(lim.len() >= m && lse.len() >= m),
        Epilogue::ScoreGrad { p, dd } => {
            assert!(p.len() >= extent(m, cols, c_rs, 1) && dd.len() >= m)
        }
    }
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if tiles {
        // The forward's row maxima run as 16 lanes per row over the column tiles.
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
        // SAFETY: AVX-512 was detected; the asserts cover `m` rows of `cols` columns of `c`
        // (and of `p`), `hd` rows of `cols` columns of `bt`, and `m` rows of the epilogue's
        // per-row values, all the tiles touch; `lanes` holds `m x 16`.
        unsafe {
            let (a, bt, c) = (a.as_ptr(), (bt.as_ptr(), bt_rs), (c.as_mut_ptr(), c_rs));
            match hd {
                32 => avx512::wide::<32>(m, cols / W, a, bt, c, epi),
                64 => avx512::wide::<64>(m, cols / W, a, bt, c, epi),
                _ => avx512::wide::<128>(m, cols / W, a, bt, c, epi),
            }
        }
        if let Epilogue::Max { max, .. } = epilogue {
            for (mx, row) in max.iter_mut().zip(lanes.chunks_exact(W)) {
                *mx = row.iter().copied().fold(*mx, f32::max);
            }
        }
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::W;

    /// [`super::narrow`] on tiles of `R` rows (then single rows for the remainder), `NV`
    /// registers (`hd = 16 NV`) per row. `a` is read either along its rows (`a_cs == 1`: one
    /// pointer per row) or down its columns (`a_rs == 1`: one pointer per step, the rows at
    /// fixed offsets), so that no address is computed from the strides in the inner loop.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn narrow<const NV: usize, const R: usize>(
        m: usize,
        k: usize,
        (a, a_rs, a_cs): (*const f32, usize, usize),
        b: *const f32,
        (c, c_rs): (*mut f32, usize),
        accumulate: bool,
        beta: f32,
    ) {
        // Steps in slices of `KC`, each slice of `b` (at most 32 KB) read from L1 by every row
        // tile; the slices after the first add to `c`.
        for k0 in (0..k).step_by(KC) {
            let (kn, acc) = ((k - k0).min(KC), accumulate || k0 > 0);
            // SAFETY (all tiles): rows `r..r + R <= m` of `a` and `c`, steps `k0..k0 + kn <= k`,
            // as the caller vouches.
            let (a, b) = unsafe { (a.add(k0 * a_cs), b.add(k0 * NV * W)) };
            let mut r = 0;
            macro_rules! tile {
                ($rows:expr) => {
                    unsafe {
                        let (ar, cr) = (a.add(r * a_rs), (c.add(r * c_rs), c_rs));
                        if a_rs == 1 {
                            narrow_tile::<NV, $rows, true>(kn, (ar, a_cs), b, cr, acc, beta)
                        } else {
                            assert!(a_cs == 1, "one stride of `a` must be 1");
                            narrow_tile::<NV, $rows, false>(kn, (ar, a_rs), b, cr, acc, beta)
                        }
                    }
                };
            }
            while r + R <= m {
                tile!(R);
                r += R;
            }
            while r + 4 <= m {
                tile!(4);
                r += 4;
            }
            while r < m {
                tile!(1);
                r += 1;
            }
        }
    }

    /// Steps of [`narrow`] per slice: 256 rows of `b` are 32 KB at `hd = 32`.
    const KC: usize = 256;

    /// `R` rows of [`super::narrow`]: the `R x NV` accumulators stay in registers over `k`.
    /// With `COLS`, `a`'s element `(r, kk)` is at `kk stride + r`, else at `r stride + kk`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn narrow_tile<const NV: usize, const R: usize, const COLS: bool>(
        k: usize,
        (a, stride): (*const f32, usize),
        b: *const f32,
        (c, c_rs): (*mut f32, usize),
        accumulate: bool,
        beta: f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        // SAFETY: row starts of `a`, inside it as the caller vouches.
        let rows: [*const f32; R] = std::array::from_fn(|r| {
            if COLS {
                a
            } else {
                unsafe { a.add(r * stride) }
            }
        });
        for kk in 0..k {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                // SAFETY: row `kk < k` of `b`, columns `< 16 NV = hd`.
                *x = unsafe { _mm512_loadu_ps(b.add(kk * NV * W + v * W)) };
            }
            // SAFETY: step `kk`'s column of `a`.
            let step = if COLS {
                unsafe { a.add(kk * stride) }
            } else {
                a
            };
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: element `(r, kk)` of `a`.
                let w = unsafe { if COLS { *step.add(r) } else { *rows[r].add(kk) } };
                let w = _mm512_set1_ps(w);
                for (x, bx) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(w, *bx, *x);
                }
            }
        }
        let scale = _mm512_set1_ps(beta);
        for (r, row) in acc.iter().enumerate() {
            for (v, x) in row.iter().enumerate() {
                // SAFETY: element `(r, 16 v)` of `c` and the 15 after it, inside row `r`.
                unsafe {
                    let p = c.add(r * c_rs + v * W);
                    let y = if accumulate {
                        _mm512_fmadd_ps(*x, scale, _mm512_loadu_ps(p))
                    } else {
                        _mm512_mul_ps(*x, scale)
                    };
                    _mm512_storeu_ps(p, y);
                }
            }
        }
    }

    /// [`super::Epilogue`] with raw pointers at the block's first row (and column).
    #[derive(Clone, Copy)]
    pub(super) enum Epi {
        /// `lanes`: 16 running maxima per row.
        Max {
            scale: f32,
            lim: *const u32,
            lanes: *mut f32,
        },
        Probs {
            scale: f32,
            lim: *const u32,
            lse: *const f32,
        },
        ScoreGrad {
            p: *const f32,
            dd: *const f32,
        },
    }

    /// A score tile's operands: `a`, `bt` and its row stride, the block's `c` and its row
    /// stride, the tile's first row and column in the block, the epilogue.
    type TileArgs = (
        *const f32,
        (*const f32, usize),
        (*mut f32, usize),
        (usize, usize),
        Epi,
    );

    /// [`super::wide`] over `regs` registers of 16 columns: tiles of 8 rows by 3 registers,
    /// then the edges with fewer. `HD` is the reduction length (the head size).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn wide<const HD: usize>(
        m: usize,
        regs: usize,
        a: *const f32,
        (bt, bt_rs): (*const f32, usize),
        (c, c_rs): (*mut f32, usize),
        epi: Epi,
    ) {
        // Column tiles outside, row tiles inside: a tile's `HD x 48` slice of `bt` (6 KB at
        // `HD = 32`) stays in L1 for all the rows, as `a` does.
        let mut j = 0;
        while j < regs {
            let mut r = 0;
            while r < m {
                let rows = (m - r).min(8);
                let args = (a, (bt, bt_rs), (c, c_rs), (r, j * W), epi);
                // SAFETY (all tiles): rows `r..r + R <= m` of `a`, `c` and the epilogue's
                // values, registers `j..j + J <= regs` of `bt` and `c`, as the caller vouches.
                match (rows, regs - j) {
                    (8, 3..) => unsafe { wide_tile::<HD, 8, 3>(args) },
                    (8, 2) => unsafe { wide_tile::<HD, 8, 2>(args) },
                    (8, _) => unsafe { wide_tile::<HD, 8, 1>(args) },
                    (4..8, 3..) => unsafe { wide_tile::<HD, 4, 3>(args) },
                    (4..8, 2) => unsafe { wide_tile::<HD, 4, 2>(args) },
                    (4..8, _) => unsafe { wide_tile::<HD, 4, 1>(args) },
                    (_, 3..) => unsafe { wide_tile::<HD, 1, 3>(args) },
                    (_, 2) => unsafe { wide_tile::<HD, 1, 2>(args) },
                    _ => unsafe { wide_tile::<HD, 1, 1>(args) },
                }
                r += match rows {
                    8 => 8,
                    4..8 => 4,
                    _ => 1,
                };
            }
            j += (regs - j).min(3);
        }
    }

    /// `R` rows by `J` registers of [`super::wide`] at row `r0` and column `j0` of the block,
    /// accumulated in registers over `HD`, then through the epilogue.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn wide_tile<const HD: usize, const R: usize, const J: usize>(
        (a, (bt, bt_rs), (c, c_rs), (r0, j0), epi): TileArgs,
    ) {
        // SAFETY (all pointer offsets): inside the tile, as the caller vouches.
        let (a, bt) = unsafe { (a.add(r0 * HD), bt.add(j0)) };
        let mut acc = [[_mm512_setzero_ps(); J]; R];
        // Two steps per iteration (`HD` is even).
        for d2 in 0..HD / 2 {
            for d in [2 * d2, 2 * d2 + 1] {
                let btd = unsafe { bt.add(d * bt_rs) };
                let mut bv = [_mm512_setzero_ps(); J];
                for (j, x) in bv.iter_mut().enumerate() {
                    *x = unsafe { _mm512_loadu_ps(btd.add(j * W)) };
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(unsafe { *a.add(r * HD + d) });
                    for (x, bx) in row.iter_mut().zip(&bv) {
                        *x = _mm512_fmadd_ps(w, *bx, *x);
                    }
                }
            }
        }
        // Lanes of register `j` before row limit `l`: all 16 but near the diagonal.
        let seen = |j: usize, l: usize| -> __mmask16 {
            let valid = l.saturating_sub(j0 + j * W).min(W);
            ((1u32 << valid) - 1) as __mmask16
        };
        // One loop per epilogue, so that each unrolls with the accumulators in registers.
        match epi {
            Epi::Max { scale, lim, lanes } => {
                let scale = _mm512_set1_ps(scale);
                for (r, row) in acc.iter().enumerate() {
                    let at = (r0 + r) * c_rs + j0;
                    let l = unsafe { *lim.add(r0 + r) } as usize;
                    let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
                    for (j, x) in row.iter().enumerate() {
                        let y = _mm512_mul_ps(*x, scale);
                        unsafe { _mm512_storeu_ps(c.add(at + j * W), y) };
                        max = _mm512_mask_max_ps(max, seen(j, l), max, y);
                    }
                    unsafe {
                        let lane = lanes.add((r0 + r) * W);
                        _mm512_storeu_ps(lane, _mm512_max_ps(_mm512_loadu_ps(lane), max));
                    }
                }
            }
            Epi::Probs { scale, lim, lse } => {
                let scale = _mm512_set1_ps(scale);
                for (r, row) in acc.iter().enumerate() {
                    let at = (r0 + r) * c_rs + j0;
                    let (l, lse) = unsafe { (*lim.add(r0 + r) as usize, *lse.add(r0 + r)) };
                    let lse = _mm512_set1_ps(lse);
                    for (j, x) in row.iter().enumerate() {
                        let e = exp(_mm512_fmsub_ps(*x, scale, lse));
                        let e = _mm512_maskz_mov_ps(seen(j, l), e);
                        unsafe { _mm512_storeu_ps(c.add(at + j * W), e) };
                    }
                }
            }
            Epi::ScoreGrad { p, dd } => {
                for (r, row) in acc.iter().enumerate() {
                    let at = (r0 + r) * c_rs + j0;
                    let dd = _mm512_set1_ps(unsafe { *dd.add(r0 + r) });
                    for (j, x) in row.iter().enumerate() {
                        unsafe {
                            let p = _mm512_loadu_ps(p.add(at + j * W));
                            let y = _mm512_mul_ps(p, _mm512_sub_ps(*x, dd));
                            _mm512_storeu_ps(c.add(at + j * W), y);
                        }
                    }
                }
            }
        }
    }

    /// [`super::exp_row`]: whole registers, the last one masked.
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp_row(row: &mut [f32], n: usize, max: f32) -> f32 {
        let (live, dead) = row.split_at_mut(n);
        let max = _mm512_set1_ps(max);
        let mut sum = _mm512_setzero_ps();
        let mut chunks = live.chunks_exact_mut(W);
        for ch in &mut chunks {
            // SAFETY: 16 floats of `ch`.
            unsafe {
                let e = exp(_mm512_sub_ps(_mm512_loadu_ps(ch.as_ptr()), max));
                _mm512_storeu_ps(ch.as_mut_ptr(), e);
                sum = _mm512_add_ps(sum, e);
            }
        }
        let rest = chunks.into_remainder();
        let mask: __mmask16 = (1u32 << rest.len()).wrapping_sub(1) as __mmask16;
        // SAFETY: the mask covers the `rest.len() < 16` floats of `rest` only.
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask, rest.as_ptr());
            let e = _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(x, max)));
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), mask, e);
            sum = _mm512_add_ps(sum, e);
        }
        dead.fill(0.0);
        _mm512_reduce_add_ps(sum)
    }

    /// [`crate::exp::exp_f32`] on 16 lanes, with fused multiply-adds.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp(x: __m512) -> __m512 {
        use crate::exp::{LN2_HI, LN2_LO, POLY, SHIFTER, X_MAX, X_MIN};
        let splat = _mm512_set1_ps;
        let x = _mm512_min_ps(_mm512_max_ps(x, splat(X_MIN)), splat(X_MAX));
        let shifted = _mm512_fmadd_ps(x, splat(std::f32::consts::LOG2_E), splat(SHIFTER));
        let n = _mm512_sub_ps(shifted, splat(SHIFTER));
        let r = _mm512_fnmadd_ps(n, splat(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, splat(LN2_LO), r);
        let mut p = splat(POLY[0]);
        for c in &POLY[1..] {
            p = _mm512_fmadd_ps(p, r, splat(*c));
        }
        let e = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, splat(1.0)));
        let n_int = _mm512_sub_epi32(
            _mm512_castps_si512(shifted),
            _mm512_set1_epi32(SHIFTER.to_bits() as i32),
        );
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(n_int, _mm512_set1_epi32(127)));
        _mm512_mul_ps(e, _mm512_castsi512_ps(bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// `sum_kk a[r, kk] b[kk, j]` in f64, `a` at strides `(a_rs, a_cs)`, `b` at row stride
    /// `b_rs`.
    fn product(
        k: usize,
        (a, a_rs, a_cs): (&[f32], usize, usize),
        (b, b_rs): (&[f32], usize),
        r: usize,
        j: usize,
    ) -> f64 {
        (0..k)
            .map(|kk| f64::from(a[r * a_rs + kk * a_cs]) * f64::from(b[kk * b_rs + j]))
            .sum()
    }

    /// The paths to test on this machine: `gemm`, and the tiles where they run.
    fn paths(tiles: bool) -> Vec<bool> {
        if tiles {
            vec![false, true]
        } else {
            vec![false]
        }
    }

    /// `narrow` against the f64 product on its paths (the tiles at `hd = 32`, `gemm` at every
    /// size), with row counts that leave each remainder of the row tiles: `a` row-major (as `P`, `dS`) and
    /// transposed (as `dS^T`, accumulating), into a strided `c`; steps past one slice.
    #[test]
    fn narrow_products_match_the_reference() {
        for hd in [32, 64, 128] {
            for (m, k) in [
                (1, 1),
                (3, 16),
                (4, 37),
                (7, 300),
                (13, 64),
                (64, 100),
                (29, 513),
            ] {
                let (a, b) = (filled(m * k, 1), filled(k * hd, 2));
                for (a_rs, a_cs, accumulate) in [(k, 1, false), (1, m, true)] {
                    let c_rs = hd + 5;
                    let start = filled(m * c_rs, 3);
                    for tiles in paths(narrow_available(hd)) {
                        let mut got = start.clone();
                        let c = (&mut got[..], c_rs);
                        narrow_on(tiles, m, k, hd, (&a, a_rs, a_cs), &b, c, accumulate, 0.7);
                        for r in 0..m {
                            for j in 0..hd {
                                let base = if accumulate { start[r * c_rs + j] } else { 0.0 };
                                let p = product(k, (&a, a_rs, a_cs), (&b, hd), r, j);
                                let want = f64::from(base) + 0.7 * p;
                                let diff = (f64::from(got[r * c_rs + j]) - want).abs();
                                assert!(diff <= 1e-5 * k as f64, "{tiles} {hd} {m} {k} {a_rs}");
                            }
                            assert_eq!(
                                got[r * c_rs + hd..(r + 1) * c_rs],
                                start[r * c_rs + hd..(r + 1) * c_rs]
                            );
                        }
                    }
                }
            }
        }
    }

    /// `wide` with each epilogue against f64 on both paths: the forward's scaled scores and row
    /// maxima over the causal limit, the probabilities (0 past the limit), the score gradients.
    #[test]
    fn wide_epilogues_match_the_reference() {
        for hd in [32, 64, 128] {
            for (m, n) in [(1usize, 1usize), (3, 17), (8, 48), (13, 100), (64, 130)] {
                let cols = n.next_multiple_of(W);
                let bt_rs = cols + 3;
                let (a, bt) = (filled(m * hd, 4), filled(hd * bt_rs, 5));
                let c_rs = cols + 16;
                let lim: Vec<u32> = (0..m).map(|r| (n - (r * 7) % n) as u32).collect();
                let lse: Vec<f32> = (0..m).map(|r| r as f32 * 0.1).collect();
                let dd: Vec<f32> = (0..m).map(|r| 0.3 - r as f32 * 0.05).collect();
                let x = |r: usize, j: usize| product(hd, (&a, hd, 1), (&bt, bt_rs), r, j);
                for tiles in paths(available(hd)) {
                    let mut scores = vec![f32::NAN; m * c_rs];
                    let mut max = vec![-1.0f32; m];
                    let epi = Epilogue::Max {
                        scale: 0.5,
                        lim: &lim,
                        max: &mut max,
                    };
                    wide_on(tiles, m, n, hd, &a, (&bt, bt_rs), (&mut scores, c_rs), epi);
                    let mut probs = vec![f32::NAN; m * c_rs];
                    let epi = Epilogue::Probs {
                        scale: 0.5,
                        lim: &lim,
                        lse: &lse,
                    };
                    wide_on(tiles, m, n, hd, &a, (&bt, bt_rs), (&mut probs, c_rs), epi);
                    let mut grads = vec![f32::NAN; m * c_rs];
                    let epi = Epilogue::ScoreGrad { p: &probs, dd: &dd };
                    wide_on(tiles, m, n, hd, &a, (&bt, bt_rs), (&mut grads, c_rs), epi);
                    for r in 0..m {
                        let l = lim[r] as usize;
                        let row_max = (0..l).map(|j| 0.5 * x(r, j)).fold(-1.0f64, f64::max);
                        let what = format!("{tiles} {hd} {m} {n} row {r}");
                        assert!((f64::from(max[r]) - row_max).abs() <= 1e-5, "max {what}");
                        for j in 0..n {
                            let s = 0.5 * x(r, j);
                            let p = if j < l {
                                (s - f64::from(lse[r])).exp()
                            } else {
                                0.0
                            };
                            let g = p * (x(r, j) - f64::from(dd[r]));
                            let at = r * c_rs + j;
                            assert!((f64::from(scores[at]) - s).abs() <= 1e-5, "scores {what}");
                            assert!(
                                (f64::from(probs[at]) - p).abs() <= 1e-5 * p.max(1.0),
                                "probs {what}"
                            );
                            let size = p * (x(r, j).abs() + f64::from(dd[r]).abs());
                            let diff = (f64::from(grads[at]) - g).abs();
                            assert!(diff <= 1e-5 * size.max(1.0), "grads {what}");
                        }
                    }
                }
            }
        }
    }

    /// `exp_row` on both paths against f64: the sum, the numerators, zeros past `n`.
    #[test]
    fn exp_row_matches_the_reference() {
        for (len, n) in [(16, 1), (48, 33), (64, 64), (100, 70)] {
            let row = filled(len, 6);
            let max = row[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for tiles in [false, available(32)] {
                let mut got = row.clone();
                let sum = exp_row_on(tiles, &mut got, n, max);
                let want: Vec<f64> = row[..n].iter().map(|&x| f64::from(x - max).exp()).collect();
                let total: f64 = want.iter().sum();
                assert!(
                    (f64::from(sum) - total).abs() <= 1e-6 * total,
                    "{tiles} {len} {n}"
                );
                for (g, w) in got.iter().zip(&want) {
                    assert!((f64::from(*g) - w).abs() <= 1e-6, "{tiles} {len} {n}");
                }
                assert!(got[n..].iter().all(|&x| x == 0.0), "{tiles} {len} {n}");
            }
        }
    }
}
