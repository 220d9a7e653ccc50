//! The packing's blocks on AVX2 ([`super::pack`]): 16 elements of a lane rounded (f32) or read
//! (bf16) as the 8 words of its pairs in one vector, and 4 or 8 lanes' words transposed in
//! registers into the panel's rows. The compiler's loop for the transpose went through the
//! stack a word at a time: packing `w^T` of a bf16 weight took 5% of a LoRA step on the
//! Qwen3-1.7B shape (`benches/README.md`, twenty-first session).

use std::arch::x86_64::*;

use half::bf16;

/// An element type whose runs of 16 become the 8 packed words of their pairs in a vector.
pub(super) trait Words: Copy {
    /// The words of the 16 elements at `run`: the even element's bf16 bits in a word's low
    /// half.
    ///
    /// # Safety
    /// AVX2 present; `run` valid for reads of 16 elements.
    unsafe fn words(run: *const Self) -> __m256i;
}

impl Words for f32 {
    #[inline(always)]
    unsafe fn words(run: *const f32) -> __m256i {
        // SAFETY: as the caller vouches.
        unsafe { rounded(run) }
    }
}

impl Words for bf16 {
    #[inline(always)]
    unsafe fn words(run: *const bf16) -> __m256i {
        // SAFETY: 16 bf16 are 32 bytes, read unaligned; little-endian, so the even element is a
        // word's low half.
        unsafe { load(run.cast()) }
    }
}

/// 32 bytes at `at`, unaligned.
///
/// # Safety
/// AVX2 present; `at` valid for reads of 32 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load(at: *const __m256i) -> __m256i {
    // SAFETY: as the caller vouches.
    unsafe { _mm256_loadu_si256(at) }
}

/// The 16 f32 at `run` rounded to bf16 to nearest even (a NaN made quiet, as
/// [`super::round_bits`]), as the 8 words of their pairs.
///
/// # Safety
/// AVX2 present; `run` valid for reads of 16 f32.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn rounded(run: *const f32) -> __m256i {
    let round = |v: __m256i| {
        // NaN (magnitude past infinity's bits): the high half made quiet; else to nearest even.
        let magnitude = _mm256_and_si256(v, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f80_0000));
        let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(v), _mm256_set1_epi32(0x40));
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(v), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd);
        let nearest = _mm256_srli_epi32::<16>(_mm256_add_epi32(v, bias));
        _mm256_blendv_epi8(nearest, quiet, nan)
    };
    // SAFETY: `run` holds 16 f32 (64 bytes), read unaligned.
    let (lo, hi) = unsafe {
        let at = run.cast::<__m256i>();
        (_mm256_loadu_si256(at), _mm256_loadu_si256(at.add(1)))
    };
    // 16-bit halves in the order of each 128-bit lane: lo's 0-3, hi's 0-3 | lo's 4-7, hi's 4-7;
    // the 64-bit quarters put back in order.
    let packed = _mm256_packus_epi32(round(lo), round(hi));
    _mm256_permute4x64_epi64::<0b11_01_10_00>(packed)
}

/// Four lanes' words (`w[l]`: pairs 0-7 of lane `l`) transposed: vector `j` holds pair `j`'s
/// four words in its low 128 bits and pair `j + 4`'s in its high 128 bits.
#[target_feature(enable = "avx2")]
#[inline]
fn quads(w: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(w[0], w[1]);
    let t1 = _mm256_unpackhi_epi32(w[0], w[1]);
    let t2 = _mm256_unpacklo_epi32(w[2], w[3]);
    let t3 = _mm256_unpackhi_epi32(w[2], w[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// `L` (4 or 8) lanes' runs (`rows`, each at least `2 * pairs` elements) packed into `out`
/// (lane `l`'s word of pair `q` at `q * width + l`), 8 pairs at a time: the vectors of
/// [`super::pack`]'s `block_of`, the same words.
///
/// # Safety
/// AVX2 present.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn block<T: Words, const L: usize>(
    rows: &[&[T]; L],
    pairs: usize,
    out: &mut [u32],
    width: usize,
) {
    assert!(L == 4 || L == 8, "blocks of 4 or 8 lanes");
    assert!(pairs.is_multiple_of(8), "whole blocks of 8 pairs");
    assert!(rows.iter().all(|r| r.len() >= 2 * pairs), "runs too short");
    if pairs == 0 {
        return;
    }
    assert!(
        width >= L && out.len() >= (pairs - 1) * width + L,
        "out too short"
    );
    let o = out.as_mut_ptr();
    for q0 in (0..pairs).step_by(8) {
        // SAFETY: each run holds `2 * pairs` elements, so the 16 from `2 * q0` (asserted).
        let w: [__m256i; L] =
            std::array::from_fn(|l| unsafe { T::words(rows[l].as_ptr().add(2 * q0)) });
        let a = quads([w[0], w[1], w[2], w[3]]);
        // SAFETY (the stores): pair `q < pairs` writes `L` words from `q * width`, inside
        // `out` (asserted).
        if L == 4 {
            for (j, v) in a.iter().enumerate() {
                unsafe {
                    let lo = o.add((q0 + j) * width).cast::<__m128i>();
                    let hi = o.add((q0 + j + 4) * width).cast::<__m128i>();
                    _mm_storeu_si128(lo, _mm256_castsi256_si128(*v));
                    _mm_storeu_si128(hi, _mm256_extracti128_si256::<1>(*v));
                }
            }
        } else {
            let b = quads([w[4], w[5], w[6], w[7]]);
            for (j, (va, vb)) in a.iter().zip(&b).enumerate() {
                unsafe {
                    let lo = o.add((q0 + j) * width).cast::<__m256i>();
                    let hi = o.add((q0 + j + 4) * width).cast::<__m256i>();
                    _mm256_storeu_si256(lo, _mm256_permute2x128_si256::<0x20>(*va, *vb));
                    _mm256_storeu_si256(hi, _mm256_permute2x128_si256::<0x31>(*va, *vb));
                }
            }
        }
    }
}
