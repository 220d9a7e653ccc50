//! Matrix products in bf16 with f32 accumulation (issue 41): both operands rounded to bf16
//! (round to nearest even, as PyTorch's `.to(torch.bfloat16)`), every product of two bf16
//! exact in f32, the sums accumulated in f32.
//!
//! On a CPU with AVX512-BF16 (AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and
//! later) a kernel of this module computes it with `vdpbf16ps`, which multiplies 32 pairs of
//! bf16 and adds them into 16 f32 lanes: twice the multiply-adds of an f32 `vfmadd` per
//! instruction, and half the bytes to pack and hold in cache. The `gemm` crate (0.19) has f32,
//! f64 and f16 kernels but no bf16 dot product, and Burn's Flex widens bf16 to f32 for its
//! matmul, so the kernel is written here: a Goto-style blocked product (pack a block of `b`,
//! pack a block of `a` per task, a 12 x 32 register tile over pairs of the reduction).
//!
//! Elsewhere the same numbers are computed by rounding the operands into f32 copies and
//! running the f32 product ([`Path::Emulated`]): the same rounded inputs and exact products,
//! the sums in another order.

use rayon::prelude::*;

use crate::mm::{Threads, extent, mm};

mod pack;

use pack::{KC2, pack_all};
pub(crate) use pack::{Operand, round_bits};

/// How a bf16 product is computed on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `vdpbf16ps` (AVX512-BF16).
    Avx512Bf16,
    /// Operands rounded into f32 copies, then the f32 product.
    Emulated,
}

/// The path [`mm_bf16`] takes on this CPU: the kernel where the instructions are detected at
/// run time, else the emulation.
pub fn bf16_path() -> Path {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
        {
            return Path::Avx512Bf16;
        }
    }
    Path::Emulated
}

/// `c = a @ b` (or `c += a @ b` when `accumulate`) in bf16 with f32 accumulation, for
/// `a: [m, k]`, `b: [k, n]` and a row-major `c: [m, n]` at row stride `c_rs`, on `path`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_bf16_on(
    path: Path,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    (c, c_rs): (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    let ((a_rs, a_cs), (b_rs, b_cs)) = (a.strides(), b.strides());
    assert!(a.len() >= extent(m, k, a_rs, a_cs), "lhs out of bounds");
    assert!(b.len() >= extent(k, n, b_rs, b_cs), "rhs out of bounds");
    assert!(c.len() >= extent(m, n, c_rs, 1), "dst out of bounds");
    if m == 0 || n == 0 {
        return;
    }
    match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Bf16 if bf16_path() == Path::Avx512Bf16 => {
            blocked(m, n, k, a, b, (c, c_rs), accumulate, threads)
        }
        _ => {
            let (a, b) = (rounded(a, m, k), rounded(b, k, n));
            mm(
                m,
                n,
                k,
                (&a, k, 1),
                (&b, n, 1),
                (c, c_rs),
                accumulate,
                threads,
            );
        }
    }
}

/// [`mm_bf16_on`] on this CPU's [`bf16_path`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_bf16(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    c: (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    mm_bf16_on(bf16_path(), m, n, k, a, b, c, accumulate, threads);
}

/// A `[rows, cols]` operand rounded to bf16, as a dense row-major f32 matrix.
pub(crate) fn rounded(x: Operand<'_>, rows: usize, cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for j in 0..cols {
            let bits = match x {
                Operand::F32(s, rs, cs) => round_bits(s[i * rs + j * cs]),
                Operand::Bf16(s, rs, cs) => s[i * rs + j * cs].to_bits(),
            };
            out.push(f32::from_bits(u32::from(bits) << 16));
        }
    }
    out
}

/// Rows of the register tile (`a`'s rows per micro-panel).
const MR: usize = 12;
/// Columns of the register tile (two vectors of 16 f32).
const NR: usize = 32;
/// `a`'s rows per packed block (a multiple of [`MR`]).
const MC: usize = 96;
/// `b`'s columns per task (a multiple of [`NR`]).
const NC: usize = 512;

/// A destination pointer the tasks share; each writes its own tiles.
#[derive(Clone, Copy)]
struct Dst(*mut f32);
// SAFETY: the tasks of one product write disjoint tiles of the destination.
unsafe impl Send for Dst {}
// SAFETY: as above.
unsafe impl Sync for Dst {}

impl Dst {
    /// The element `at` past the start (a method, so that closures capture the whole `Dst`).
    fn at(&self, at: usize) -> *mut f32 {
        self.0.wrapping_add(at)
    }
}

/// Packed words per super-block of one operand: 32 MB.
const SUPER_WORDS: usize = 1 << 23;

/// The blocked product on the AVX512-BF16 kernel (operands checked by the caller).
///
/// `a` and `b` are packed for a super-block of the reduction (all of it unless the packed
/// operands would pass [`SUPER_WORDS`]), `b` for a super-block of columns; each task then runs
/// its `MC x NC` block of `c` through every reduction block of the super-block, so that the
/// block stays in cache between them (a pass over all of `c` per reduction block would meet
/// each tile's rows in memory again).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn blocked(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    (c, c_rs): (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    let ((a_rs, a_cs), (b_rs, b_cs)) = (a.strides(), b.strides());
    let kc = 2 * KC2;
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * c_rs..i * c_rs + n].fill(0.0);
            }
        }
        return;
    }
    let a_panels = m.div_ceil(MR);
    let a_block = a_panels * MR * KC2;
    // Reduction blocks per super-block, and column panels per super-block.
    let k_blocks = (SUPER_WORDS / a_block).clamp(1, k.div_ceil(kc));
    let per_nc = NC / NR;
    let b_panels = (SUPER_WORDS / (k_blocks * NR * KC2)).max(per_nc) / per_nc * per_nc;
    let b_panels = b_panels.min(n.div_ceil(NC) * per_nc);
    let b_block = b_panels * NR * KC2;
    // Buffers kept by the calling thread across calls (a fresh one is faulted in and zeroed
    // each time); taken while in use, so that a nested call finds none and makes its own.
    let (mut packed_a, mut packed_b) = PACKED.take();
    packed_a.resize(packed_a.len().max(k_blocks * a_block), 0);
    packed_b.resize(packed_b.len().max(k_blocks * b_block), 0);
    let dst = Dst(c.as_mut_ptr());
    let row_blocks = m.div_ceil(MC);
    for k0 in (0..k).step_by(k_blocks * kc) {
        let k_len = (k_blocks * kc).min(k - k0);
        let blocks = k_len.div_ceil(kc);
        for kb in 0..blocks {
            let (p0, len) = (k0 + kb * kc, kc.min(k0 + k_len - (k0 + kb * kc)));
            let out = &mut packed_a[kb * a_block..(kb + 1) * a_block];
            pack_all(a, (a_rs, a_cs), (0, m), p0, len, MR, out, threads);
        }
        for j0 in (0..n).step_by(b_panels * NR) {
            let cols = (b_panels * NR).min(n - j0);
            for kb in 0..blocks {
                let (p0, len) = (k0 + kb * kc, kc.min(k0 + k_len - (k0 + kb * kc)));
                let out = &mut packed_b[kb * b_block..(kb + 1) * b_block];
                pack_all(b, (b_cs, b_rs), (j0, cols), p0, len, NR, out, threads);
            }
            let (packed_a, packed_b) = (&packed_a[..], &packed_b[..]);
            let col_blocks = cols.div_ceil(NC);
            let task = |t: usize| {
                let (ib, jb) = (t / col_blocks, t % col_blocks);
                let (i0, rows) = (ib * MC, MC.min(m - ib * MC));
                let (c0, width_all) = (jb * NC, NC.min(cols - jb * NC));
                for kb in 0..blocks {
                    let len = kc.min(k_len - kb * kc);
                    let pairs = len.div_ceil(2);
                    let first = k0 == 0 && kb == 0 && !accumulate;
                    let (pa, pb) = (&packed_a[kb * a_block..], &packed_b[kb * b_block..]);
                    for jp in (c0 / NR)..(c0 + width_all).div_ceil(NR) {
                        let bp = &pb[jp * pairs * NR..(jp + 1) * pairs * NR];
                        let width = NR.min(cols - jp * NR);
                        for r in (i0 / MR)..(i0 + rows).div_ceil(MR) {
                            let ap = &pa[r * MR * pairs..(r + 1) * MR * pairs];
                            let height = MR.min(m - r * MR);
                            let at = r * MR * c_rs + j0 + jp * NR;
                            // SAFETY: the CPU has AVX512-BF16 (`bf16_path`); the panels hold
                            // `pairs` pairs; the tile `height x width` at `at` lies inside `c`
                            // (asserted by the caller) and belongs to this task alone.
                            unsafe { tile(pairs, ap, bp, dst.at(at), c_rs, height, width, first) };
                        }
                    }
                }
            };
            let tasks = row_blocks * col_blocks;
            match threads {
                Threads::All => (0..tasks).into_par_iter().for_each(task),
                Threads::One => (0..tasks).for_each(task),
            }
        }
    }
    PACKED.set((packed_a, packed_b));
}

thread_local! {
    /// [`blocked`]'s packed blocks of `a` and `b`.
    static PACKED: std::cell::Cell<(Vec<u32>, Vec<u32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// One `MR x NR` register tile over `pairs` reduction pairs: `c = acc` when `first`, else
/// `c += acc`, for the `height x width` corner that lies in the destination.
///
/// # Safety
/// AVX512-BF16 present; `a` and `b` hold `pairs * MR` and `pairs * NR` words; `c` valid for
/// reads and writes of `height` rows of `width` elements at row stride `c_rs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    pairs: usize,
    a: &[u32],
    b: &[u32],
    c: *mut f32,
    c_rs: usize,
    height: usize,
    width: usize,
    first: bool,
) {
    use std::arch::x86_64::*;
    assert!(a.len() >= pairs * MR && b.len() >= pairs * NR);
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
                let out = if first {
                    *v
                } else {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), *v)
                };
                _mm512_mask_storeu_ps(at, mask, out);
            }
        }
    }
}

#[cfg(test)]
mod tests;
