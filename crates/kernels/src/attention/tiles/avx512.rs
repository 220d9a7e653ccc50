//! The AVX-512 tiles of [`super`]: the narrow and wide products and the row passes.

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

/// `c = beta acc` (or `c += beta acc` when `accumulate`) for an `R x NV` tile of
/// accumulators at `c` (row stride `c_rs`): the narrow products' store, f32 and bf16 words.
///
/// # Safety
/// AVX-512 present; `R` rows of `16 NV` floats of `c` valid for reads and writes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_scaled<const NV: usize, const R: usize>(
    acc: &[[__m512; NV]; R],
    (c, c_rs): (*mut f32, usize),
    accumulate: bool,
    beta: f32,
) {
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
    // SAFETY: the tile's rows and columns of `c`, as the caller vouches.
    unsafe { store_scaled(&acc, (c, c_rs), accumulate, beta) };
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
/// stride, the tile's first row and column in the block, the epilogue; `T` is `f32`, or `u32`
/// for the words tiles (`bt_rs` then counts words).
pub(super) type TileArgs<T> = (
    *const T,
    (*const T, usize),
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
    // SAFETY (all tiles): rows `r..r + R <= m` of `a`, `c` and the epilogue's values,
    // registers `j..j + J <= regs` of `bt` and `c`, as the caller vouches.
    score_tiles!(m, regs, wide_tile::<HD>, |r: usize, j: usize| (
        a,
        (bt, bt_rs),
        (c, c_rs),
        (r, j * W),
        epi
    ));
}

/// `R` rows by `J` registers of [`super::wide`] at row `r0` and column `j0` of the block,
/// accumulated in registers over `HD`, then through the epilogue.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn wide_tile<const HD: usize, const R: usize, const J: usize>(
    (a, (bt, bt_rs), (c, c_rs), (r0, j0), epi): TileArgs<f32>,
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
    // SAFETY: the tile's rows and columns, as the caller vouches.
    unsafe { finish::<R, J>(acc, (c, c_rs), (r0, j0), epi) };
}

/// The epilogue of an `R x J` score tile `acc` at row `r0` and column `j0` of the block
/// ([`super::Epilogue`]), stored into `c`.
///
/// # Safety
/// AVX-512 present; rows `r0..r0 + R` of `c` (and of the epilogue's values) and its columns
/// `j0..j0 + 16 J` inside the block.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn finish<const R: usize, const J: usize>(
    acc: [[__m512; J]; R],
    (c, c_rs): (*mut f32, usize),
    (r0, j0): (usize, usize),
    epi: Epi,
) {
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
