//! Packing of the bf16 products' operands ([`super`]): each operand rounded to bf16 (or read
//! as bf16) into the pairs of reduction elements that `vdpbf16ps` multiplies.

use half::bf16;
use rayon::prelude::*;

use crate::mm::Threads;

/// An operand of a bf16 product: f32 (rounded while packed) or bf16, with its row and column
/// strides.
#[derive(Clone, Copy)]
pub(crate) enum Operand<'a> {
    F32(&'a [f32], usize, usize),
    Bf16(&'a [bf16], usize, usize),
}

impl Operand<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Operand::F32(s, ..) => s.len(),
            Operand::Bf16(s, ..) => s.len(),
        }
    }

    pub(super) fn strides(&self) -> (usize, usize) {
        match *self {
            Operand::F32(_, rs, cs) | Operand::Bf16(_, rs, cs) => (rs, cs),
        }
    }
}

/// `x` rounded to bf16 to nearest, ties to even (a NaN stays a quiet NaN).
#[inline(always)]
pub(crate) fn round_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        ((b >> 16) | 0x40) as u16
    } else {
        ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
    }
}

/// Reduction pairs per packed block (`2 * KC2` elements of the reduction).
pub(super) const KC2: usize = 128;
/// An element the packing reads: its bf16 bits (an f32 rounded, a bf16 as it is).
pub(super) trait Bits: Copy {
    fn bits(self) -> u32;
    /// [`block_of`] on the CPU's vectors, where this type and the CPU have such a path (the
    /// same words); `false` (and `out` untouched) where not.
    #[inline(always)]
    fn block<const L: usize>(
        _rows: &[&[Self]; L],
        _pairs: usize,
        _out: &mut [u32],
        _width: usize,
    ) -> bool {
        false
    }
}

/// [`Bits::block`] through [`super::pack_x86::block`] where the CPU has AVX2.
macro_rules! vector_block {
    () => {
        #[inline(always)]
        fn block<const L: usize>(
            rows: &[&[Self]; L],
            pairs: usize,
            out: &mut [u32],
            width: usize,
        ) -> bool {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                unsafe { super::pack_x86::block(rows, pairs, out, width) };
                return true;
            }
            let _ = (rows, pairs, out, width);
            false
        }
    };
}

impl Bits for f32 {
    #[inline(always)]
    fn bits(self) -> u32 {
        u32::from(round_bits(self))
    }

    vector_block!();
}

impl Bits for bf16 {
    #[inline(always)]
    fn bits(self) -> u32 {
        u32::from(self.to_bits())
    }

    vector_block!();
}

/// A packed buffer the packing tasks share; each writes its own slots.
#[derive(Clone, Copy)]
struct Packed(*mut u32);
// SAFETY: the packing tasks write disjoint slots.
unsafe impl Send for Packed {}
// SAFETY: as above.
unsafe impl Sync for Packed {}

impl Packed {
    /// `len` words from `at` (a method, so that closures capture the whole `Packed`).
    ///
    /// # Safety
    /// In bounds of the buffer, and no other live reference to those words.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, at: usize, len: usize) -> &mut [u32] {
        // SAFETY: as the caller vouches.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// Pack `lanes` lanes of `x` from `lane0` (lane `l`, reduction index `p` at `x[l * ls + p * ps]`), the
/// reduction from `p0` for `len`, into `out` as panels of `width` lanes, each
/// `[len.div_ceil(2)][width]` u32: the bf16 of an even reduction index in a word's low half,
/// of the next in its high half (the pairs `vdpbf16ps` multiplies); lanes past `lanes` and a
/// reduction index past `len` are zero.
///
/// With the lanes contiguous (`ls == 1`: a row-major weight, a transposed activation) the
/// tasks take runs of reduction pairs and read each pair of rows once, in memory order, for
/// every panel (a panel at a time would walk the matrix by columns, a cache miss a row).
/// Otherwise each task packs whole panels, lane by lane.
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_all(
    x: Operand<'_>,
    (ls, ps): (usize, usize),
    (lane0, lanes): (usize, usize),
    p0: usize,
    len: usize,
    width: usize,
    out: &mut [u32],
    threads: Threads,
) {
    let pairs = len.div_ceil(2);
    let panels = lanes.div_ceil(width);
    let out = &mut out[..panels * pairs * width];
    let parallel = threads == Threads::All;
    if ls == 1 && lanes > 1 {
        let packed = Packed(out.as_mut_ptr());
        // Runs of pairs of at least 32 KiB of words.
        let run = (8192 / lanes.max(1)).clamp(1, pairs.max(1));
        let job = |r: usize| {
            let qs = (r * run, ((r + 1) * run).min(pairs));
            pack_pairs(x, ps, (lane0, lanes), p0, len, width, qs, packed);
        };
        let runs = pairs.div_ceil(run);
        if parallel {
            (0..runs).into_par_iter().for_each(job);
        } else {
            (0..runs).for_each(job);
        }
    } else {
        let job = |(panel, out): (usize, &mut [u32])| {
            let count = width.min(lanes - panel * width);
            pack_lanes(
                x,
                (ls, ps),
                lane0 + panel * width,
                count,
                p0,
                len,
                width,
                out,
            );
        };
        let chunks = out.chunks_mut(pairs * width);
        if parallel {
            chunks
                .collect::<Vec<_>>()
                .into_par_iter()
                .enumerate()
                .for_each(job);
        } else {
            chunks.enumerate().for_each(job);
        }
    }
}

simd_dispatch! {
    #[allow(clippy::too_many_arguments)]
    /// Pairs `qs.0..qs.1` of every panel, lanes contiguous ([`pack_all`]).
    fn pack_pairs(
        x: Operand<'_>,
        ps: usize,
        lanes: (usize, usize),
        p0: usize,
        len: usize,
        width: usize,
        qs: (usize, usize),
        out: Packed,
    ) = pack_pairs_generic
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pack_pairs_generic(
    x: Operand<'_>,
    ps: usize,
    lanes: (usize, usize),
    p0: usize,
    len: usize,
    width: usize,
    qs: (usize, usize),
    out: Packed,
) {
    match x {
        Operand::F32(s, ..) => pairs_of(s, ps, lanes, p0, len, width, qs, out),
        Operand::Bf16(s, ..) => pairs_of(s, ps, lanes, p0, len, width, qs, out),
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pairs_of<T: Bits>(
    s: &[T],
    ps: usize,
    (lane0, lanes): (usize, usize),
    p0: usize,
    len: usize,
    width: usize,
    (q0, q1): (usize, usize),
    out: Packed,
) {
    let pairs = len.div_ceil(2);
    // Panels narrower than the vectors (12 rows of `a`) are packed through `words`: a run of
    // lanes packed in whole vectors, then copied panel by panel (packed in place, a panel of
    // 12 ran as three 4-lane pieces and its loop's overhead, most of a weight gradient's
    // packing).
    let staged = !width.is_multiple_of(16);
    let run = (WORDS / width).max(1) * width;
    let mut words = [0u32; WORDS];
    for q in q0..q1 {
        let lo = &s[(p0 + 2 * q) * ps + lane0..][..lanes];
        let hi = (2 * q + 1 < len).then(|| &s[(p0 + 2 * q + 1) * ps + lane0..][..lanes]);
        if staged && width <= WORDS {
            for r0 in (0..lanes).step_by(run) {
                let r = run.min(lanes - r0);
                let w = &mut words[..r];
                pair_words(w, &lo[r0..r0 + r], hi.map(|hi| &hi[r0..r0 + r]));
                for l0 in (0..r).step_by(width) {
                    let count = width.min(r - l0);
                    let panel = (r0 + l0) / width;
                    // SAFETY: as below.
                    let o = unsafe { out.slot((panel * pairs + q) * width, width) };
                    o[..count].copy_from_slice(&w[l0..l0 + count]);
                    if count < width {
                        o[count..].fill(0);
                    }
                }
            }
            continue;
        }
        for panel in 0..lanes.div_ceil(width) {
            let l0 = panel * width;
            let count = width.min(lanes - l0);
            // SAFETY: slot `(panel, q)` lies in the buffer (`pack_all` sized it) and is this
            // task's alone (its run of pairs).
            let o = unsafe { out.slot((panel * pairs + q) * width, width) };
            pair_words(&mut o[..count], &lo[l0..l0 + count], hi.map(|hi| &hi[l0..]));
            if count < width {
                o[count..].fill(0);
            }
        }
    }
}

/// Words on the stack of [`pairs_of`]'s staged panels.
const WORDS: usize = 480;

/// `o[l]`: the bf16 of `lo[l]` in the low half, of `hi[l]` (zero without `hi`) in the high.
#[inline(always)]
fn pair_words<T: Bits>(o: &mut [u32], lo: &[T], hi: Option<&[T]>) {
    match hi {
        Some(hi) => {
            for ((o, &l), &h) in o.iter_mut().zip(lo).zip(hi) {
                *o = l.bits() | (h.bits() << 16);
            }
        }
        None => {
            for (o, &l) in o.iter_mut().zip(lo) {
                *o = l.bits();
            }
        }
    }
}

simd_dispatch! {
    #[allow(clippy::too_many_arguments)]
    /// One panel of `count` lanes from `lane0`, lane by lane ([`pack_all`]).
    fn pack_lanes(
        x: Operand<'_>,
        strides: (usize, usize),
        lane0: usize,
        count: usize,
        p0: usize,
        len: usize,
        width: usize,
        out: &mut [u32],
    ) = pack_lanes_generic
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pack_lanes_generic(
    x: Operand<'_>,
    strides: (usize, usize),
    lane0: usize,
    count: usize,
    p0: usize,
    len: usize,
    width: usize,
    out: &mut [u32],
) {
    match x {
        Operand::F32(s, ..) => lanes_of(s, strides, lane0, count, p0, len, width, out),
        Operand::Bf16(s, ..) => lanes_of(s, strides, lane0, count, p0, len, width, out),
    }
}

/// [`pack_lanes`] of one element type: with the reduction contiguous (`ps == 1`: a row-major
/// activation, a transposed weight) blocks of lanes x 8 pairs ([`block_of`]), and the rest of each
/// lane's run becomes 16-bit words whose pairs are the packed words; otherwise element by
/// element.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn lanes_of<T: Bits>(
    s: &[T],
    (ls, ps): (usize, usize),
    lane0: usize,
    count: usize,
    p0: usize,
    len: usize,
    width: usize,
    out: &mut [u32],
) {
    const B: usize = 8;
    let pairs = len.div_ceil(2);
    if count < width {
        out.fill(0);
    }
    // The blocks: lanes `..blocked_lanes` (8 at a time, or 4 in panels of 12), pairs
    // `..blocked_pairs` (whole pairs only).
    let lanes_per_block = [8, 4]
        .into_iter()
        .find(|&l| ps == 1 && width.is_multiple_of(l))
        .unwrap_or(0);
    let (blocked_lanes, blocked_pairs) = match lanes_per_block {
        0 => (0, 0),
        l => (count / l * l, len / 2 / B * B),
    };
    let run = |l: usize| &s[(lane0 + l) * ls + p0..][..2 * blocked_pairs];
    if lanes_per_block == 8 {
        for l0 in (0..blocked_lanes).step_by(8) {
            let rows: [&[T]; 8] = std::array::from_fn(|i| run(l0 + i));
            block_of(&rows, blocked_pairs, &mut out[l0..], width);
        }
    } else {
        for l0 in (0..blocked_lanes).step_by(4) {
            let rows: [&[T]; 4] = std::array::from_fn(|i| run(l0 + i));
            block_of(&rows, blocked_pairs, &mut out[l0..], width);
        }
    }
    // A lane's words, written as 16-bit halves: on x86 (little-endian), the first of two halves
    // is a word's low half, the even reduction index.
    let mut words = [0u32; KC2];
    for l in 0..count {
        // Pairs the blocks wrote for this lane.
        let q0 = if l < blocked_lanes { blocked_pairs } else { 0 };
        if q0 == pairs {
            continue;
        }
        let at = (lane0 + l) * ls + (p0 + 2 * q0) * ps;
        let (len, pairs) = (len - 2 * q0, pairs - q0);
        words[pairs - 1] = 0;
        let halves: &mut [u16] = bytemuck::cast_slice_mut(&mut words[..pairs]);
        if ps == 1 {
            for (r, &v) in halves.iter_mut().zip(&s[at..at + len]) {
                *r = v.bits() as u16;
            }
        } else {
            for (p, r) in halves.iter_mut().enumerate().take(len) {
                *r = s[at + p * ps].bits() as u16;
            }
        }
        for (o, &w) in out[q0 * width + l..]
            .iter_mut()
            .step_by(width)
            .zip(&words[..pairs])
        {
            *o = w;
        }
    }
}

/// `L` lanes' runs (`rows`, each `2 * pairs` elements) packed into `out` (lane `l`'s word of
/// pair `q` at `q * width + l`), 8 pairs at a time: on AVX2 through [`Bits::block`] (each lane's
/// 16 elements rounded or read in one vector, the words transposed in registers); elsewhere each
/// lane's 16 elements become words, then are written pair by pair, `L` words each.
#[inline(always)]
fn block_of<T: Bits, const L: usize>(
    rows: &[&[T]; L],
    pairs: usize,
    out: &mut [u32],
    width: usize,
) {
    const B: usize = 8;
    if (L == 4 || L == 8) && T::block(rows, pairs, out, width) {
        return;
    }
    for q0 in (0..pairs).step_by(B) {
        let mut block = [[0u32; B]; L];
        for (row, words) in rows.iter().zip(block.iter_mut()) {
            let run = &row[2 * q0..2 * q0 + 2 * B];
            for (w, pair) in words.iter_mut().zip(run.chunks_exact(2)) {
                *w = pair[0].bits() | (pair[1].bits() << 16);
            }
        }
        for q in 0..B {
            let o = &mut out[(q0 + q) * width..][..L];
            for (o, words) in o.iter_mut().zip(&block) {
                *o = words[q];
            }
        }
    }
}
