//! The score tiles of [`super::wide_words`] on AVX512-BF16: the same tiles and epilogues as
//! [`super::avx512::wide`], the reduction over `hd` in pairs of bf16 (`vdpbf16ps`), half the
//! steps of the f32 tiles.

use std::arch::x86_64::*;

use super::W;
use super::avx512::{Epi, TileArgs, finish, store_scaled};

/// One pair of the reduction on an `R x J` tile: the `J` registers of words at `b`, each
/// multiplied pairwise by row `r`'s word `a(r)` broadcast, added into the accumulators.
///
/// # Safety
/// AVX512-BF16 present; `b` valid for reads of `16 J` words.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn step<const R: usize, const J: usize>(
    acc: &mut [[__m512; J]; R],
    b: *const u32,
    a: impl Fn(usize) -> u32,
) {
    // SAFETY: `16 J` words at `b`, as the caller vouches; the transmutes reinterpret 512 bits.
    unsafe {
        let mut bv: [__m512bh; J] = std::mem::zeroed();
        for (j, x) in bv.iter_mut().enumerate() {
            let at = b.add(j * W).cast();
            *x = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(at));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let w: __m512bh = std::mem::transmute(_mm512_set1_epi32(a(r) as i32));
            for (x, bx) in row.iter_mut().zip(&bv) {
                *x = _mm512_dpbf16_ps(*x, w, *bx);
            }
        }
    }
}

/// [`super::wide_words`] over `regs` registers of 16 columns: tiles of 8 rows by 3 registers,
/// then the edges with fewer (as [`super::avx512::wide`]).
///
/// # Safety
/// AVX512-BF16 present; `a` holds `m` rows of `HD / 2` words, `bt` holds `HD / 2` rows of
/// `16 regs` words at row stride `bt_rs`, `c` holds `m` rows of `16 regs` floats at row stride
/// `c_rs`, and the epilogue's values cover `m` rows.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn wide_words<const HD: usize>(
    m: usize,
    regs: usize,
    a: *const u32,
    (bt, bt_rs): (*const u32, usize),
    (c, c_rs): (*mut f32, usize),
    epi: Epi,
) {
    // SAFETY (all tiles): rows `r..r + R <= m`, registers `j..j + J <= regs`, as the caller
    // vouches.
    score_tiles!(m, regs, tile::<HD>, |r: usize, j: usize| (
        a,
        (bt, bt_rs),
        (c, c_rs),
        (r, j * W),
        epi
    ));
}

/// `R` rows by `J` registers at row `r0` and column `j0` of the block, accumulated in
/// registers over the `HD / 2` pairs, then through the epilogue.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile<const HD: usize, const R: usize, const J: usize>(
    (a, (bt, bt_rs), c, (r0, j0), epi): TileArgs<u32>,
) {
    // SAFETY (all pointer offsets): inside the tile, as the caller vouches.
    let (a, bt) = unsafe { (a.add(r0 * HD / 2), bt.add(j0)) };
    let mut acc = [[_mm512_setzero_ps(); J]; R];
    for d in 0..HD / 2 {
        // SAFETY: pair `d` of the tile's registers of `bt` and of its rows of `a`.
        unsafe { step(&mut acc, bt.add(d * bt_rs), |r| *a.add(r * HD / 2 + d)) };
    }
    // SAFETY: the tile's rows and columns, as the caller vouches.
    unsafe { finish::<R, J>(acc, c, (r0, j0), epi) };
}

/// [`super::narrow_words`] on tiles of `R` rows (then 4 where `R` is larger, then single
/// rows), `NV` registers (`hd = 16 NV`) per row.
///
/// # Safety
/// AVX512-BF16 present; `a` holds words `(i, p)` for `i < m`, `p < pairs` at
/// `i a_rs + p a_ps`, `b` holds `pairs` rows of `16 NV` words, `c` holds `m` rows of `16 NV`
/// floats at row stride `c_rs`.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn narrow_words<const NV: usize, const R: usize>(
    m: usize,
    pairs: usize,
    (a, a_rs, a_ps): (*const u32, usize, usize),
    b: *const u32,
    (c, c_rs): (*mut f32, usize),
    accumulate: bool,
    beta: f32,
) {
    let mut r = 0;
    // SAFETY (all tiles): rows `r..r + rows <= m` of `a` and `c`, as the caller vouches.
    let tile = |r: usize, rows: usize| unsafe {
        let (ar, cr) = ((a.add(r * a_rs), a_rs, a_ps), (c.add(r * c_rs), c_rs));
        match rows {
            1 => narrow_tile::<NV, 1>(pairs, ar, b, cr, accumulate, beta),
            4 => narrow_tile::<NV, 4>(pairs, ar, b, cr, accumulate, beta),
            _ => narrow_tile::<NV, R>(pairs, ar, b, cr, accumulate, beta),
        }
    };
    while r + R <= m {
        tile(r, R);
        r += R;
    }
    while R > 4 && r + 4 <= m {
        tile(r, 4);
        r += 4;
    }
    while r < m {
        tile(r, 1);
        r += 1;
    }
}

/// `R` rows of [`narrow_words`]: the `R x NV` accumulators stay in registers over the pairs,
/// then `c = beta acc` (or `c += beta acc` when `accumulate`).
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn narrow_tile<const NV: usize, const R: usize>(
    pairs: usize,
    (a, a_rs, a_ps): (*const u32, usize, usize),
    b: *const u32,
    (c, c_rs): (*mut f32, usize),
    accumulate: bool,
    beta: f32,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for p in 0..pairs {
        // SAFETY: pair `p < pairs` of `b` (16 NV words) and of rows `< R` of `a`.
        unsafe { step(&mut acc, b.add(p * NV * W), |r| *a.add(r * a_rs + p * a_ps)) };
    }
    // SAFETY: the tile's rows of `c`, as the caller vouches.
    unsafe { store_scaled(&acc, (c, c_rs), accumulate, beta) };
}
