//! The bf16 products' register tile on AVX512-BF16 ([`super`]).

use super::{Dst, LowRank, MR, NR};

/// A rank-`rank` product `l @ r` added to a tile as it is stored ([`tile`]): `l` at the tile's
/// first row (row stride `rank`), `r` at the tile's first column (row stride `r_rs`).
#[derive(Clone, Copy)]
pub(super) struct LowTile {
    pub(super) l: *const f32,
    pub(super) r: *const f32,
    pub(super) r_rs: usize,
    pub(super) rank: usize,
}

/// One `MR x NR` register tile over `pairs` reduction pairs: `c = acc` when `first`, else
/// `c += acc`, for the `height x width` corner that lies in the destination; `next` (a panel
/// of `b` a later tile reads) is fetched into L2 meanwhile. With `low`, `l @ r` (a chain of
/// f32 multiply-adds over the rank from zero, `gemm`'s order) is added to each element after
/// that sum, as `gemm` accumulating `l @ r` onto the stored tile would; only when `LOW` (the
/// products without a share compile without that code).
///
/// # Safety
/// AVX512-BF16 present; `a`, `b` and `next` hold `pairs * MR`, `pairs * NR` and `pairs * NR`
/// words; `c` valid for reads and writes of `height` rows of `width` elements at row stride
/// `c_rs`; `low`'s `l` valid for reads of `height` rows of `rank` and its `r` of `rank` rows of
/// `width` at row stride `r_rs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile<const LOW: bool>(
    pairs: usize,
    a: &[u32],
    b: &[u32],
    next: Option<&[u32]>,
    c: *mut f32,
    c_rs: usize,
    height: usize,
    width: usize,
    first: bool,
    low: Option<LowTile>,
) {
    use std::arch::x86_64::*;
    assert!(a.len() >= pairs * MR && b.len() >= pairs * NR);
    // Without a next panel, the prefetches touch this one (in L1 already).
    let next = next.unwrap_or(b);
    assert!(next.len() >= pairs * NR);
    let pn = next.as_ptr();
    // The destination tile's lines, fetched while the products run: rows of a wide `c` are
    // far apart, and a miss on each of them at the end would stall the tile.
    for r in 0..height {
        for h in 0..width.div_ceil(16) {
            // SAFETY: a prefetch of an address inside the tile's corner.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(c.add(r * c_rs + h * 16).cast::<i8>()) };
        }
    }
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    for q in 0..pairs {
        // SAFETY: `q < pairs`, so both loads and every broadcast are inside the panels.
        unsafe {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(pb.add(q * NR).cast()));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(pb.add(q * NR + 16).cast()));
            _mm_prefetch::<_MM_HINT_T1>(pn.add(q * NR).cast::<i8>());
            _mm_prefetch::<_MM_HINT_T1>(pn.add(q * NR + 16).cast::<i8>());
            for (r, acc) in acc.iter_mut().enumerate() {
                let x: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*pa.add(q * MR + r) as i32));
                acc[0] = _mm512_dpbf16_ps(acc[0], x, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], x, b1);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(height) {
        for (h, v) in acc.iter().enumerate() {
            let cols = width.saturating_sub(h * 16).min(16);
            if cols == 0 {
                continue;
            }
            let mask: __mmask16 = if cols == 16 {
                0xffff
            } else {
                (1u16 << cols) - 1
            };
            // SAFETY: the `cols` elements at this row and offset lie inside the tile's corner.
            unsafe {
                let at = c.add(r * c_rs + h * 16);
                let mut out = if first {
                    *v
                } else {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), *v)
                };
                if let Some(low) = low.filter(|_| LOW) {
                    let mut sum = _mm512_setzero_ps();
                    for t in 0..low.rank {
                        let l = _mm512_set1_ps(*low.l.add(r * low.rank + t));
                        let rv = _mm512_maskz_loadu_ps(mask, low.r.add(t * low.r_rs + h * 16));
                        sum = _mm512_fmadd_ps(rv, l, sum);
                    }
                    out = _mm512_add_ps(out, sum);
                }
                _mm512_mask_storeu_ps(at, mask, out);
            }
        }
    }
}

/// The tile of a blocked product at row panel `r` and column `col` of its `[m, n]` destination
/// (`width` columns, a partial last panel's rows cut at `m`), with `low`'s share added where
/// given (the caller passes it on the last reduction block only), through [`tile`] with the
/// share's code only where there is a share.
///
/// # Safety
/// As [`tile`], for the tile `MR.min(m - r * MR) x width` at row `r * MR` and column `col` of
/// `dst`, which belongs to the caller's task alone; `low`'s operands cover the destination.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_at(
    (pairs, a, b, next): (usize, &[u32], &[u32], Option<&[u32]>),
    (dst, c_rs): (Dst, usize),
    (m, n): (usize, usize),
    (r, col, width): (usize, usize, usize),
    first: bool,
    low: Option<LowRank<'_>>,
) {
    let height = MR.min(m - r * MR);
    let c = dst.at(r * MR * c_rs + col);
    let low = low.map(|low| LowTile {
        l: low.l[r * MR * low.rank..].as_ptr(),
        r: low.r[col..].as_ptr(),
        r_rs: n,
        rank: low.rank,
    });
    // SAFETY: the caller's promises.
    unsafe {
        match low {
            Some(_) => tile::<true>(pairs, a, b, next, c, c_rs, height, width, first, low),
            None => tile::<false>(pairs, a, b, next, c, c_rs, height, width, first, None),
        }
    }
}
