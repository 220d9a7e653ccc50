//! The bf16 products on AMX (Intel Sapphire Rapids and later): `tdpbf16ps` multiplies a tile of
//! 16 rows x 32 bf16 of `a` by 32 x 16 of `b` (pairs of the reduction, as [`super::pack`] packs
//! them) into a 16 x 16 f32 tile, 16 times the multiply-adds of one `vdpbf16ps`.
//!
//! Rust's AMX intrinsics and `is_x86_feature_detected!("amx-bf16")` are unstable (Rust 1.95),
//! and neither `gemm` nor Burn has an AMX product, so the instructions are written with `asm!`
//! (stable; the assembler knows them) and the CPU is asked with `cpuid`. Linux gives a process
//! the tiles' 8 KiB of register state only after `arch_prctl(ARCH_REQ_XCOMP_PERM)`.
//!
//! The register tile is 32 x 32 of `c`: four accumulator tiles (`tmm0`-`tmm3`), two tiles of
//! `a` (`tmm4`, `tmm5`: rows 0-15 and 16-31) and two of `b` (`tmm6`, `tmm7`: columns 0-15 and
//! 16-31 of a packed panel, whose rows of 32 words are 128 bytes apart).

use std::sync::OnceLock;

use rayon::prelude::*;

use super::pack::Operand;
use super::walk::MAX_GROUP;
use crate::mm::Threads;

/// Rows of `c` per register tile (and of `a` per packed panel).
pub(super) const MR: usize = 32;
/// Reduction pairs per `tdpbf16ps` (a tile row of 64 bytes).
pub(super) const STEP: usize = 16;

/// Whether this CPU and kernel let this process use AMX-BF16 (asked once).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
    #[allow(unused_unsafe)]
    // SAFETY: `cpuid` exists on every x86-64 CPU; leaf 7 is read only where the CPU has it.
    let (max, leaf7) = unsafe {
        let max = __get_cpuid_max(0).0;
        (max, (max >= 7).then(|| __cpuid_count(7, 0)))
    };
    let Some(leaf7) = leaf7 else { return false };
    let (amx_bf16, amx_tile) = ((leaf7.edx >> 22) & 1 == 1, (leaf7.edx >> 24) & 1 == 1);
    if max < 7 || !amx_bf16 || !amx_tile || !std::arch::is_x86_feature_detected!("avx512f") {
        return false;
    }
    // Ask Linux for the tile data state (XFEATURE_XTILEDATA, 18); it refuses where it cannot
    // save it (an older kernel, a hypervisor that hides it).
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a system call that only changes this process's permissions.
    let status = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    status == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// The tile configuration: palette 1, the eight tiles of 16 rows x 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// The tiles configured on this thread for [`tile`]; they are released when it drops.
pub(super) struct Tiles(std::marker::PhantomData<*const ()>);

impl Tiles {
    /// # Safety
    /// AMX is [`available`].
    #[cfg(target_arch = "x86_64")]
    pub(super) unsafe fn configure() -> Self {
        // SAFETY: AMX is available (the caller's promise); the configuration is 64 bytes.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly))
        };
        Tiles(std::marker::PhantomData)
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only `configure` (on a CPU with AMX) makes a `Tiles`, and it is neither
        // `Send` nor `Sync`: it drops on the thread whose tiles it configured.
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}

/// `a`'s rows `0..m` (row `i`, reduction index `p` at `x[i * rs + p * cs]`), the reduction from
/// `p0` for `len`, packed as the tiles [`block_tiles`] reads: panels of [`MR`] rows, each
/// `[pp / STEP][MR][STEP]` words (pp = `len` in pairs, rounded up to [`STEP`]), so that a step's
/// two tiles of `a` are 2 KiB in a row (rows of a row-major block, far apart, would each be a
/// stream of their own); the bf16 of an even reduction index in a word's low half. Rows past
/// `m` and pairs past `len` are zero, so whole tiles may be read. Returns pp.
pub(super) fn pack_rows(
    x: Operand<'_>,
    (rs, cs): (usize, usize),
    m: usize,
    p0: usize,
    len: usize,
    out: &mut [u32],
    threads: Threads,
) -> usize {
    let pp = len.div_ceil(2).div_ceil(STEP) * STEP;
    let out = &mut out[..m.div_ceil(MR) * MR * pp];
    let job = |(panel, words): (usize, &mut [u32])| {
        words.fill(0);
        let rows = MR.min(m - panel * MR);
        rows_in(x, (rs, cs), (panel * MR, rows), p0, len, words);
    };
    match threads {
        Threads::All => out.par_chunks_mut(MR * pp).enumerate().for_each(job),
        Threads::One => out.chunks_mut(MR * pp).enumerate().for_each(job),
    }
    pp
}

simd_dispatch! {
    /// [`pack_rows`] of one panel (`rows.1` rows from `rows.0`), compiled for the CPU's vectors.
    fn rows_in(
        x: Operand<'_>,
        strides: (usize, usize),
        rows: (usize, usize),
        p0: usize,
        len: usize,
        out: &mut [u32],
    ) = rows_in_generic
}

#[inline(always)]
fn rows_in_generic(
    x: Operand<'_>,
    strides: (usize, usize),
    rows: (usize, usize),
    p0: usize,
    len: usize,
    out: &mut [u32],
) {
    match x {
        Operand::F32(s, ..) => rows_of(s, strides, rows, p0, len, out),
        Operand::Bf16(s, ..) => rows_of(s, strides, rows, p0, len, out),
    }
}

/// [`pack_rows`] of one panel and element type: reduction pair `q` of row `r` at word
/// `(q / STEP) * STEP * MR + r * STEP + q % STEP`. With the reduction contiguous (`cs == 1`)
/// row by row; with the rows contiguous (`rs == 1`, a transposed `a`) pair by pair; else element
/// by element.
#[inline(always)]
fn rows_of<T: super::pack::Bits>(
    s: &[T],
    (rs, cs): (usize, usize),
    (i0, rows): (usize, usize),
    p0: usize,
    len: usize,
    out: &mut [u32],
) {
    const HALVES: usize = 2 * STEP;
    let word = |q: usize, r: usize| (q / STEP) * STEP * MR + r * STEP + q % STEP;
    if cs == 1 {
        let halves: &mut [u16] = bytemuck::cast_slice_mut(out);
        for r in 0..rows {
            let src = &s[(i0 + r) * rs + p0..][..len];
            for (c, run) in src.chunks(HALVES).enumerate() {
                let dst = &mut halves[c * HALVES * MR + r * HALVES..][..run.len()];
                for (o, &v) in dst.iter_mut().zip(run) {
                    *o = v.bits() as u16;
                }
            }
        }
        return;
    }
    let at = |r: usize, p: usize| (i0 + r) * rs + (p0 + p) * cs;
    // Where the rows are contiguous (a transposed row-major matrix): a pair's two runs of rows
    // read together, their words written row by row (a step's 32 rows are 32 cache lines, in
    // L1 across its pairs). Walking blocks of rows across pairs instead re-reads lines of rows
    // far apart (a matrix row apart), which conflict in the L1 cache.
    let (paired_rows, whole_pairs) = if rs == 1 { (rows, len / 2) } else { (0, 0) };
    for q in 0..whole_pairs {
        let lo = &s[at(0, 2 * q)..][..paired_rows];
        let hi = &s[at(0, 2 * q + 1)..][..paired_rows];
        let mut words = [0u32; MR];
        for ((w, &l), &h) in words.iter_mut().zip(lo).zip(hi) {
            *w = l.bits() | (h.bits() << 16);
        }
        let first = word(q, 0);
        for (r, &w) in words[..paired_rows].iter().enumerate() {
            out[first + r * STEP] = w;
        }
    }
    // The rest: an odd last reduction index, or every pair where the rows are not contiguous.
    for r in 0..rows {
        let q_from = if r < paired_rows { whole_pairs } else { 0 };
        for q in q_from..len.div_ceil(2) {
            let lo = s[at(r, 2 * q)].bits();
            let hi = if 2 * q + 1 < len {
                s[at(r, 2 * q + 1)].bits()
            } else {
                0
            };
            out[word(q, r)] = lo | (hi << 16);
        }
    }
}

/// One reduction block of a task's tiles: its pairs, packed `a` (by [`pack_rows`]) and packed
/// `b` (panels of `[pairs][NR]` words).
pub(super) struct Block<'a> {
    pub(super) pairs: usize,
    pub(super) pa: &'a [u32],
    pub(super) pb: &'a [u32],
}

/// The tiles of one task over a group of consecutive reduction blocks: for each column panel
/// in `panels` and each row panel of the task, `c += a @ b` (or `c = a @ b` when `first`) on
/// the `rows` x `cols` of `c` that lie in the destination, where `c` points at column 0 of row
/// 0 with rows `c_rs` apart; `prefetch` as [`Walk::prefetch`]. `ops` are [`TILE`] (or, in
/// tests, a model of it).
///
/// # Safety
/// [`Tiles`] configured on this thread; the blocks hold their packed panels; `c` valid for
/// reads and writes of the task's rows (`rows`) and of the columns of `panels` below `cols`,
/// and no other reference to them live.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn block_tiles(
    blocks: &[Block<'_>],
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    cols: usize,
    (c, c_rs): (*mut f32, usize),
    first: bool,
    prefetch: bool,
    ops: &TileOps,
) {
    use super::NR;
    assert!(blocks.len() <= MAX_GROUP);
    let mut last = [[0u32; STEP * NR]; MAX_GROUP];
    let mut acc = Acc([0.0; MR * NR]);
    for jp in panels.clone() {
        for (block, last) in blocks.iter().zip(last.iter_mut()) {
            let bp = &block.pb[jp * block.pairs * NR..(jp + 1) * block.pairs * NR];
            // A step past the panel's last whole one reads its rows from a copy padded with
            // zeros (the panel's next words belong to another panel, or to nothing).
            let whole = block.pairs / STEP;
            if whole * STEP < block.pairs {
                let tail = &bp[whole * STEP * NR..];
                last[..tail.len()].copy_from_slice(tail);
                last[tail.len()..].fill(0);
            }
            if jp + 1 < panels.end {
                let next = &block.pb[(jp + 1) * block.pairs * NR..][..block.pairs * NR];
                for line in next.chunks(16) {
                    // SAFETY: a prefetch of an address inside the packed buffer.
                    unsafe {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                            line.as_ptr().cast::<i8>(),
                        )
                    };
                }
            }
        }
        let width = NR.min(cols - jp * NR);
        for r in (rows.start / MR)..rows.end.div_ceil(MR) {
            let height = MR.min(rows.end - r * MR);
            let at = c.wrapping_add(r * MR * c_rs + jp * NR);
            let direct = height == MR && width == NR;
            if !direct && !first {
                for i in 0..height {
                    // SAFETY: row `i` of the tile's corner lies in the destination.
                    let row = unsafe { std::slice::from_raw_parts(at.add(i * c_rs), width) };
                    acc.0[i * NR..i * NR + width].copy_from_slice(row);
                }
            }
            let (out, out_rs) = if direct {
                (at, c_rs * 4)
            } else {
                (acc.0.as_mut_ptr(), NR * 4)
            };
            // SAFETY (of the three calls): the tiles are configured (the caller's promise);
            // each step's rows lie in the packed panels (`MR x STEP` words of `a` a step,
            // `pairs` rows of `b`, the rest from `last`); `out` is the destination's full tile
            // or the accumulator.
            unsafe { (ops.start)(out, out_rs, first) };
            for (block, last) in blocks.iter().zip(&last) {
                let pp = block.pairs.div_ceil(STEP) * STEP;
                let args = Steps {
                    steps: pp / STEP,
                    whole: block.pairs / STEP,
                    a: block.pa[r * MR * pp..(r + 1) * MR * pp].as_ptr(),
                    b: block.pb[jp * block.pairs * NR..].as_ptr(),
                    last: last.as_ptr(),
                    prefetch,
                };
                unsafe { (ops.steps)(args) };
            }
            unsafe { (ops.finish)(out, out_rs) };
            if !direct {
                for i in 0..height {
                    // SAFETY: as above.
                    let row = unsafe { std::slice::from_raw_parts_mut(at.add(i * c_rs), width) };
                    row.copy_from_slice(&acc.0[i * NR..i * NR + width]);
                }
            }
        }
    }
}

/// A 32 x 32 accumulator for the tiles at the destination's edges.
#[repr(C, align(64))]
struct Acc([f32; MR * super::NR]);

/// One block's steps of [`STEP`] pairs into the accumulator tiles: step `s` reads its two tiles
/// of `a` at `a + s * STEP * MR` words (rows 64 bytes apart), and `b` at `b + s * STEP * NR`
/// words for `s < whole`, else at `last` (rows 128 bytes apart); with `prefetch`, the next
/// step's tiles are fetched into L1 meanwhile ([`Walk::prefetch`]).
#[derive(Clone, Copy)]
pub(super) struct Steps {
    pub(super) steps: usize,
    pub(super) whole: usize,
    pub(super) a: *const u32,
    pub(super) b: *const u32,
    pub(super) last: *const u32,
    pub(super) prefetch: bool,
}

/// The register tile's work: `start` loads the 32 x 32 accumulators from `c` (rows `c_rs`
/// bytes apart; zeros when the flag says so), `steps` adds one block's products, `finish`
/// stores them back.
pub(super) struct TileOps {
    pub(super) start: unsafe fn(*mut f32, usize, bool),
    pub(super) steps: unsafe fn(Steps),
    pub(super) finish: unsafe fn(*mut f32, usize),
}

/// The register tile on AMX: four accumulators (`tmm0`-`tmm3`), two tiles of `a` (`tmm4`,
/// `tmm5`) and two of `b` (`tmm6`, `tmm7`).
#[cfg(target_arch = "x86_64")]
pub(super) const TILE: TileOps = TileOps {
    start,
    steps,
    finish,
};

/// # Safety
/// [`Tiles`] configured on this thread; unless `zero`, `c` readable for 32 rows of 128 bytes.
#[cfg(target_arch = "x86_64")]
unsafe fn start(c: *mut f32, c_rs: usize, zero: bool) {
    use std::arch::asm;
    // SAFETY: the tiles are configured and `c` readable (the caller's promise).
    unsafe {
        if zero {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        } else {
            asm!(
                "tileloadd tmm0, [{c} + {s}*1]",
                "tileloadd tmm1, [{c} + {s}*1 + 64]",
                "tileloadd tmm2, [{c16} + {s}*1]",
                "tileloadd tmm3, [{c16} + {s}*1 + 64]",
                c = in(reg) c,
                c16 = in(reg) c.byte_add(16 * c_rs),
                s = in(reg) c_rs,
                options(nostack, readonly)
            );
        }
    }
}

/// # Safety
/// [`Tiles`] configured on this thread; every step's 32 rows of `a` (64 bytes each) and 16
/// rows of `b` (128 bytes each) readable.
#[cfg(target_arch = "x86_64")]
unsafe fn steps(t: Steps) {
    use std::arch::asm;
    let a_rs = 4 * STEP;
    for s in 0..t.steps {
        let a = t.a.wrapping_add(s * STEP * MR);
        let b = if s < t.whole {
            t.b.wrapping_add(s * STEP * super::NR)
        } else {
            t.last
        };
        if t.prefetch && s + 1 < t.steps {
            fetch(a.wrapping_add(STEP * MR));
            if s + 1 < t.whole {
                fetch(b.wrapping_add(STEP * super::NR));
            }
        }
        // SAFETY: the step's rows of `a` and `b` are readable (the caller's promise).
        unsafe {
            asm!(
                "tileloadd tmm4, [{a} + {sa}*1]",
                "tileloadd tmm6, [{b} + {sb}*1]",
                "tileloadd tmm7, [{b} + {sb}*1 + 64]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm5, [{a16} + {sa}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a = in(reg) a,
                a16 = in(reg) a.byte_add(16 * a_rs),
                sa = in(reg) a_rs,
                b = in(reg) b,
                sb = in(reg) 128usize,
                options(nostack, readonly)
            );
        }
    }
}

/// Fetch the 2 KiB at `at` (a step's two tiles of `a`, or of `b`) into the L1 cache.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn fetch(at: *const u32) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    for line in 0..32 {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(16 * line).cast::<i8>()) };
    }
}

/// # Safety
/// [`Tiles`] configured on this thread; `c` writable for 32 rows of 128 bytes.
#[cfg(target_arch = "x86_64")]
unsafe fn finish(c: *mut f32, c_rs: usize) {
    use std::arch::asm;
    // SAFETY: `c` is writable (the caller's promise).
    unsafe {
        asm!(
            "tilestored [{c} + {s}*1], tmm0",
            "tilestored [{c} + {s}*1 + 64], tmm1",
            "tilestored [{c16} + {s}*1], tmm2",
            "tilestored [{c16} + {s}*1 + 64], tmm3",
            c = in(reg) c,
            c16 = in(reg) c.byte_add(16 * c_rs),
            s = in(reg) c_rs,
            options(nostack)
        );
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
#[path = "amx_tests.rs"]
mod tests;
