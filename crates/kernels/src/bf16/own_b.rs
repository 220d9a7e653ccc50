//! The AVX512-BF16 product with each task packing its own columns of `b` ([`blocked_own_b`]).
//!
//! [`super::blocked`] packs a whole super-block of `b` (up to 32 MB) before its tasks start,
//! and three row blocks of a 512-row product each read it again: on the Qwen3-1.7B LoRA step
//! a weight crossed memory about six times per product (read, written packed, read back by each
//! row block), and the packing was bound by memory (`benches/README.md`, twenty-fourth
//! session). Here a task owns a block of columns for all the rows: it packs that block of `b`
//! one reduction block at a time into a buffer of its thread (at most 128 KiB, in L2) and runs
//! every row tile against it, so the weight is read from memory once and the packed words never
//! leave the core's caches. Each tile sums the reduction blocks in the same order as
//! [`super::blocked`]: the same bits.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::{Dst, KC2, LowRank, MR, NR, Operand, SUPER_WORDS, avx512, pack_all};
use crate::mm::Threads;

/// The most rows of a product whose tasks pack their own `b`: a task holds all the rows' tiles
/// of its columns, whose sums must stay in L2 between reduction blocks.
pub(super) const MAX_ROWS: usize = 768;
/// The fewest elements of a `b` packed by the tasks: a smaller one stays in the caches between
/// its packing up front and its reads, where packing it once for all the tasks costs less.
const MIN_B: usize = 1 << 20;
/// The most column panels ([`NR`] columns each) of one task: 256 columns, whose packed block
/// of `b` is 128 KiB.
const MAX_PANELS: usize = 8;
/// The fewest column panels of one task.
const MIN_PANELS: usize = 2;
/// The most bytes of a task's sums (`m` rows of its columns, f32).
const MAX_SUMS: usize = 512 << 10;

/// Whether the products take this way where it applies (measurements only: both ways give the
/// same bits).
static ON: AtomicBool = AtomicBool::new(true);

/// Whether the AVX512-BF16 products pack `b` in their tasks ([`blocked_own_b`]) where the shape
/// allows, from now on (measurements only: `examples/bf16_projection --task-packing` times both
/// ways; the products are the same bits either way). Returns the former setting.
pub fn set_task_packing(on: bool) -> bool {
    ON.swap(on, Ordering::Relaxed)
}

thread_local! {
    /// A setting for the products this thread starts, over [`ON`] (tests: a test's setting
    /// must not reach the products of the tests running beside it).
    static THIS_THREAD: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// `f` with the products this thread starts packing `b` in their tasks or not.
#[cfg(test)]
pub(super) fn with_task_packing<R>(on: bool, f: impl FnOnce() -> R) -> R {
    let before = THIS_THREAD.replace(Some(on));
    let out = f();
    THIS_THREAD.set(before);
    out
}

/// Whether an `[m, k] @ [k, n]` product packing `b` here takes [`blocked_own_b`]: a `b` that
/// does not stay in cache, rows few enough for a task's sums to stay in L2, and columns enough
/// for two tasks a thread.
pub(super) fn applies(m: usize, n: usize, k: usize, threads: Threads) -> bool {
    let on = THIS_THREAD
        .get()
        .unwrap_or_else(|| ON.load(Ordering::Relaxed));
    let threads = match threads {
        Threads::All => rayon::current_num_threads(),
        Threads::One => 1,
    };
    on && m <= MAX_ROWS && k * n >= MIN_B && n.div_ceil(NR) >= 2 * threads * MIN_PANELS
}

/// Column panels per task: about [`super::TASKS_PER_THREAD`] tasks a thread, from
/// [`MIN_PANELS`] to [`MAX_PANELS`], and fewer where the task's sums for `m` rows would pass
/// [`MAX_SUMS`].
fn panels_per_task(m: usize, col_panels: usize, threads: Threads) -> usize {
    let want = match threads {
        Threads::All => super::TASKS_PER_THREAD * rayon::current_num_threads(),
        Threads::One => 1,
    };
    let most = (MAX_SUMS / (4 * NR * m.max(1))).clamp(MIN_PANELS, MAX_PANELS);
    col_panels.div_ceil(want).clamp(MIN_PANELS, most)
}

/// The lines of a task's next block of `b` (its lanes, the next reduction block), fetched
/// into L2 a few at a time while the tiles of this block run: the packing of that block then
/// reads from cache. Read in place, a block is short runs far apart (a weight's rows, 256 to 512
/// bytes each, 4 KiB or more apart), which the hardware's prefetchers do not follow.
#[cfg(target_arch = "x86_64")]
struct Ahead {
    base: *const u8,
    /// Bytes from one run to the next.
    stride: usize,
    /// Lines per run (one more than its length covers, for a run that starts mid-line).
    lines: usize,
    /// Lines in all.
    total: usize,
    /// The next line to fetch.
    at: usize,
}

#[cfg(target_arch = "x86_64")]
impl Ahead {
    /// The block of `b` (`[k, n]` at strides `(rs, cs)`) of lanes `j0..j0 + cols` and reduction
    /// indices `p0..p0 + len`; nothing to fetch where neither stride is 1.
    fn new(b: Operand<'_>, (j0, cols): (usize, usize), (p0, len): (usize, usize)) -> Ahead {
        let (base, size) = match b {
            Operand::F32(s, ..) => (s.as_ptr().cast::<u8>(), 4),
            Operand::Bf16(s, ..) => (s.as_ptr().cast::<u8>(), 2),
        };
        let (rs, cs) = b.strides();
        let (first, runs, run_len, stride) = if cs == 1 {
            (p0 * rs + j0, len, cols, rs)
        } else if rs == 1 {
            (j0 * cs + p0, cols, len, cs)
        } else {
            (0, 0, 0, 0)
        };
        let lines = (run_len * size).div_ceil(64) + 1;
        Ahead {
            base: base.wrapping_add(first * size),
            stride: stride * size,
            lines,
            total: runs * lines,
            at: 0,
        }
    }

    /// Fetch the next `count` lines.
    fn fetch(&mut self, count: usize) {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        let end = (self.at + count).min(self.total);
        for i in self.at..end {
            let (run, line) = (i / self.lines, i % self.lines);
            let at = self.base.wrapping_add(run * self.stride + line * 64);
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(at.cast::<i8>()) };
        }
        self.at = end;
    }
}

thread_local! {
    /// A task's packed block of `b`, kept by each thread across tasks and products.
    static OWN_B: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The product of [`super::blocked`] on the AVX512-BF16 kernel, `b` packed by the tasks
/// (module docs), for a shape [`applies`] accepts.
///
/// # Safety
/// As [`super::blocked`]: AVX512-BF16 present; `dst` valid for writes (and reads, when
/// `accumulate`) of `m` rows of `n` elements at row stride `c_rs`, no other reference to them
/// live; operands checked by the caller; `k > 0`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn blocked_own_b(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    (dst, c_rs): (Dst, usize),
    accumulate: bool,
    low: Option<LowRank<'_>>,
    threads: Threads,
) {
    let (b_rs, b_cs) = b.strides();
    let kc = 2 * KC2;
    let a_panels = m.div_ceil(MR);
    let a_block = a_panels * MR * KC2;
    let k_blocks = (SUPER_WORDS / a_block).clamp(1, k.div_ceil(kc));
    let col_panels = n.div_ceil(NR);
    let per_task = panels_per_task(m, col_panels, threads);
    let tasks = col_panels.div_ceil(per_task);
    let (mut packed_a, packed_b) = super::PACKED.take();
    packed_a.resize(packed_a.len().max(k_blocks * a_block), 0);
    for k0 in (0..k).step_by(k_blocks * kc) {
        let k_len = (k_blocks * kc).min(k - k0);
        let blocks = k_len.div_ceil(kc);
        let (range, path) = ((k0, k_len), super::Path::Avx512Bf16);
        super::pack_a_blocks(path, a, m, range, a_block, &mut packed_a, threads);
        let packed_a = &packed_a[..];
        let task = |t: usize| {
            let j0 = t * per_task * NR;
            let cols = (per_task * NR).min(n - j0);
            let panels = cols.div_ceil(NR);
            let mut pb = OWN_B.take();
            pb.resize(pb.len().max(per_task * NR * KC2), 0);
            for kb in 0..blocks {
                let (p0, len) = (k0 + kb * kc, kc.min(k_len - kb * kc));
                let pairs = len.div_ceil(2);
                pack_all(
                    b,
                    (b_cs, b_rs),
                    (j0, cols),
                    p0,
                    len,
                    NR,
                    &mut pb,
                    Threads::One,
                );
                let first = k0 == 0 && kb == 0 && !accumulate;
                let last = k0 + k_len == k && kb + 1 == blocks;
                let pa = &packed_a[kb * a_block..];
                // The next block this thread will likely pack: this task's next reduction
                // block, else the next task's first (rayon hands a thread runs of tasks).
                let next_j0 = j0 + per_task * NR;
                let mut ahead = if kb + 1 < blocks {
                    let p1 = p0 + kc;
                    Ahead::new(b, (j0, cols), (p1, kc.min(k0 + k_len - p1)))
                } else if next_j0 < n {
                    let next_cols = (per_task * NR).min(n - next_j0);
                    Ahead::new(b, (next_j0, next_cols), (k0, kc.min(k_len)))
                } else {
                    Ahead::new(b, (0, 0), (0, 0))
                };
                let per_tile = ahead.total.div_ceil(panels * a_panels);
                for jp in 0..panels {
                    let bp = &pb[jp * pairs * NR..(jp + 1) * pairs * NR];
                    let width = NR.min(cols - jp * NR);
                    for r in 0..a_panels {
                        let ap = &pa[r * MR * pairs..(r + 1) * MR * pairs];
                        ahead.fetch(per_tile);
                        // SAFETY: the CPU has AVX512-BF16 (the caller's promise); the panels
                        // hold `pairs` pairs; the tile at row panel `r` and these columns lies
                        // inside the destination (the caller's promise) and belongs to this
                        // task alone (its columns); a share's operands cover the destination
                        // (checked by its caller).
                        unsafe {
                            avx512::tile_at(
                                (pairs, ap, bp, None),
                                (dst, c_rs),
                                (m, n),
                                (r, j0 + jp * NR, width),
                                first,
                                low.filter(|_| last),
                            )
                        };
                    }
                }
            }
            OWN_B.set(pb);
        };
        match threads {
            Threads::All => (0..tasks).into_par_iter().for_each(task),
            Threads::One => (0..tasks).for_each(task),
        }
    }
    super::PACKED.set((packed_a, packed_b));
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::bf16::tests::values;
    use crate::bf16::{LowRank, Path, Rhs, bf16_path, mm_bf16_kernel, mm_bf16_kernel_new_low};

    /// The tasks packing their own `b` give the bits of the product packing it up front: f32
    /// and bf16 operands, `b` row-major and transposed, partial tiles and panels, one reduction
    /// block and several, a partial last one, accumulating or not, with and without a
    /// rank-`r` share; and the shapes do take the new way ([`applies`]).
    #[test]
    fn tasks_packing_their_columns_give_the_bits_of_packing_up_front() {
        if bf16_path() != Path::Avx512Bf16 {
            println!(
                "no AVX512-BF16 kernel here ({:?}): nothing to compare",
                bf16_path()
            );
            return;
        }
        for (m, n, k) in [
            (37, 8200, 520),
            (512, 640, 6600),
            (12, 1000, 4200),
            (700, 4100, 1030),
        ] {
            assert!(
                applies(m, n, k, Threads::All),
                "{m}x{n}x{k} takes the tasks' packing"
            );
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let b16: Vec<half::bf16> = b.iter().map(|&x| half::bf16::from_f32(x)).collect();
            let seed = values(m * n, 3);
            let (l, r) = (values(m * 8, 4), values(8 * n, 5));
            let b_ops = [
                Operand::F32(&b, n, 1),
                Operand::F32(&b, 1, k),
                Operand::Bf16(&b16, n, 1),
                Operand::Bf16(&b16, 1, k),
            ];
            for (i, bo) in b_ops.into_iter().enumerate() {
                let ao = Operand::F32(&a, k, 1);
                for accumulate in [false, true] {
                    let run = |on: bool| {
                        with_task_packing(on, || {
                            let mut c = seed.clone();
                            let rhs = Rhs::Pack(bo);
                            assert!(mm_bf16_kernel(
                                m,
                                n,
                                k,
                                ao,
                                rhs,
                                (&mut c, n),
                                accumulate,
                                Threads::All
                            ));
                            c
                        })
                    };
                    let (new, old) = (run(true), run(false));
                    let same = new
                        .iter()
                        .zip(&old)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{m}x{n}x{k}, b {i}, accumulate {accumulate}");
                }
                let share = LowRank {
                    l: &l,
                    r: &r,
                    rank: 8,
                };
                let run = |on: bool| {
                    with_task_packing(on, || {
                        let rhs = Rhs::Pack(bo);
                        mm_bf16_kernel_new_low(m, n, k, ao, rhs, share, Threads::All)
                            .expect("the AVX512-BF16 kernel")
                    })
                };
                let (new, old) = (run(true), run(false));
                let same = new
                    .iter()
                    .zip(&old)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{m}x{n}x{k}, b {i}, with a share");
            }
        }
    }
}
