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
//! pack a block of `a` per task, a 12 x 32 register tile over pairs of the reduction); for up to
//! 768 rows each task packs its own columns of `b` instead (`own_b`).
//!
//! Elsewhere the same numbers are computed by rounding the operands into f32 copies and
//! running the f32 product ([`Path::Emulated`]): the same rounded inputs and exact products,
//! the sums in another order.

use rayon::prelude::*;

use crate::mm::{Threads, extent, mm, mm_new};

mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod low_rank;
mod own_b;
mod pack;
#[cfg(target_arch = "x86_64")]
mod pack_x86;
mod path;
mod prepack;
mod rounded;
mod walk;

pub(crate) use low_rank::{LowRank, mm_bf16_kernel_new_low};
pub use own_b::set_task_packing;
use pack::{KC2, pack_all};
pub(crate) use pack::{Operand, round_bits};
pub use path::{
    BF16_KERNEL_VAR, Bf16KernelError, Path, bf16_path, chosen_bf16_path, detected_bf16_path,
    has_bf16_path,
};
#[cfg(test)]
pub(crate) use prepack::kept_packed_forms;
pub(crate) use prepack::{PackedB, packed, retain};
pub use prepack::{PackedWeights, keep_packed_weights};
pub(crate) use rounded::rounded;
pub use walk::{Walk as AmxWalk, set_walk as set_amx_walk};

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
    if path.has_kernel()
        && mm_bf16_kernel_on(
            path,
            m,
            n,
            k,
            a,
            Rhs::Pack(b),
            (c, c_rs),
            accumulate,
            threads,
        )
    {
        return;
    }
    check(m, n, k, a, Rhs::Pack(b));
    assert!(c.len() >= extent(m, n, c_rs, 1), "dst out of bounds");
    if m == 0 || n == 0 {
        return;
    }
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

/// `a @ b` into a new row-major `[m, n]` buffer on this CPU's [`bf16_path`], written without
/// zeroing it first: the kernel writes every element, and so does `gemm` on the rounded copies
/// where the CPU lacks a kernel (the numbers of [`mm_bf16`]).
pub(crate) fn mm_bf16_new(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    threads: Threads,
) -> Vec<f32> {
    if let Some(c) = mm_bf16_kernel_new(m, n, k, a, Rhs::Pack(b), threads) {
        return c;
    }
    let (a, b) = (rounded(a, m, k), rounded(b, k, n));
    mm_new(m, n, k, (&a, k, 1), (&b, n, 1), threads)
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

/// `c = a @ b` or `c += a @ b` on this CPU's bf16 kernel ([`bf16_path`]), `b` packed here or
/// before ([`prepack`]); `false` (and `c` untouched) where the CPU lacks a kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_bf16_kernel(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Rhs<'_>,
    c: (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) -> bool {
    mm_bf16_kernel_on(bf16_path(), m, n, k, a, b, c, accumulate, threads)
}

/// [`mm_bf16_kernel`] on `path`, which must be one this CPU has ([`detected_bf16_path`]).
#[allow(clippy::too_many_arguments)]
fn mm_bf16_kernel_on(
    path: Path,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Rhs<'_>,
    (c, c_rs): (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) -> bool {
    check(m, n, k, a, b);
    assert!(c.len() >= extent(m, n, c_rs, 1), "dst out of bounds");
    assert!(has_bf16_path(path), "{path:?} is not on this CPU");
    #[cfg(target_arch = "x86_64")]
    if path.has_kernel() {
        if m > 0 && n > 0 {
            // SAFETY: the kernel's instructions are present (asserted above); `c` holds the
            // destination (asserted above) and is borrowed mutably for the call.
            let dst = (Dst(c.as_mut_ptr()), c_rs);
            unsafe { blocked(path, m, n, k, a, b, dst, accumulate, None, threads) };
        }
        return true;
    }
    false
}

/// `a @ b` into a new row-major `[m, n]` buffer on this CPU's bf16 kernel, written without
/// zeroing it first; `None` where the CPU lacks a kernel.
pub(crate) fn mm_bf16_kernel_new(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Rhs<'_>,
    threads: Threads,
) -> Option<Vec<f32>> {
    check(m, n, k, a, b);
    let path = bf16_path();
    #[cfg(target_arch = "x86_64")]
    if path.has_kernel() {
        return Some(low_rank::kernel_new(path, m, n, k, a, b, None, threads));
    }
    None
}

/// The operands of a product `[m, k] @ [k, n]` lie in bounds (a packed `b` has that shape).
fn check(m: usize, n: usize, k: usize, a: Operand<'_>, b: Rhs<'_>) {
    let (a_rs, a_cs) = a.strides();
    assert!(a.len() >= extent(m, k, a_rs, a_cs), "lhs out of bounds");
    match b {
        Rhs::Pack(b) => {
            let (b_rs, b_cs) = b.strides();
            assert!(b.len() >= extent(k, n, b_rs, b_cs), "rhs out of bounds");
        }
        Rhs::Packed(p) => assert!(p.k == k && p.n == n, "packed rhs of another shape"),
    }
}

/// Rows of the register tile (`a`'s rows per micro-panel).
const MR: usize = 12;
/// Columns of the register tile (two vectors of 16 f32).
const NR: usize = 32;
/// The most rows of one task (16 panels of [`MR`]).
const MAX_ROWS: usize = 192;
/// The fewest rows of one task, where the product has that many (4 panels of [`MR`]).
const MIN_ROWS: usize = 48;
/// The fewest column panels ([`NR`] columns each) of one task.
const MIN_COL_PANELS: usize = 4;
/// Tasks per thread a product is cut into where its shape allows: a thread slowed by the
/// machine's other work leaves its last tasks to the others, and an odd task costs little.
const TASKS_PER_THREAD: usize = 8;
/// The most columns of `b` per task (a multiple of [`NR`]).
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

/// The right operand of [`blocked`]: packed here, one block at a time, or packed before
/// ([`prepack`]).
#[derive(Clone, Copy)]
pub(crate) enum Rhs<'a> {
    Pack(Operand<'a>),
    Packed(&'a PackedB),
}

/// The blocked product on the AVX512-BF16 kernel (operands checked by the caller).
///
/// `a` and `b` are packed for a super-block of the reduction (all of it unless the packed
/// operands would pass [`SUPER_WORDS`]), `b` for a super-block of columns (all of them when it
/// comes packed); each task then runs its block of `c` (up to 192 rows and [`NC`] columns) through every reduction block
/// of the super-block, so that the block stays in cache between them (a pass over all of `c`
/// per reduction block would meet each tile's rows in memory again).
///
/// # Safety
/// AVX512-BF16 present; `dst` valid for writes (and reads, when `accumulate`) of `m` rows of
/// `n` elements at row stride `c_rs`, and no other reference to them live.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn blocked(
    path: Path,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Rhs<'_>,
    (dst, c_rs): (Dst, usize),
    accumulate: bool,
    low: Option<LowRank<'_>>,
    threads: Threads,
) {
    assert!(
        low.is_none() || path == Path::Avx512Bf16,
        "a low-rank share on {path:?}"
    );
    let kc = 2 * KC2;
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row `i` of the destination (the caller's promise).
                unsafe { std::ptr::write_bytes(dst.at(i * c_rs), 0, n) };
            }
        }
        return;
    }
    if let (Path::Avx512Bf16, Rhs::Pack(b)) = (path, b)
        && own_b::applies(m, n, k, threads)
    {
        // SAFETY: the caller's promises, passed on.
        unsafe { own_b::blocked_own_b(m, n, k, a, b, (dst, c_rs), accumulate, low, threads) };
        return;
    }
    // AMX packs `a` by rows ([`amx::pack_rows`]), in panels of 32 rows.
    let mr = if path == Path::Amx { amx::MR } else { MR };
    let walk = walk::walk();
    let a_panels = m.div_ceil(mr);
    let a_block = a_panels * mr * KC2;
    // Reduction blocks per super-block, and column panels per super-block.
    let k_blocks = (SUPER_WORDS / a_block).clamp(1, k.div_ceil(kc));
    let per_nc = NC / NR;
    let b_panels = match b {
        Rhs::Packed(_) => n.div_ceil(NR),
        Rhs::Pack(_) => {
            let panels = (SUPER_WORDS / (k_blocks * NR * KC2)).max(per_nc) / per_nc * per_nc;
            panels.min(n.div_ceil(NC) * per_nc)
        }
    };
    let b_block = b_panels * NR * KC2;
    // Buffers kept by the calling thread across calls (a fresh one is faulted in and zeroed
    // each time); taken while in use, so that a nested call finds none and makes its own.
    let (mut packed_a, mut packed_b) = PACKED.take();
    packed_a.resize(packed_a.len().max(k_blocks * a_block), 0);
    if let Rhs::Pack(_) = b {
        packed_b.resize(packed_b.len().max(k_blocks * b_block), 0);
    }
    // Row blocks of equal numbers of panels (blocks of a fixed height left a short last one:
    // a prefill's 128 rows made tasks of 96 and 32 rows, and a thread idle for a quarter of
    // each product), and column blocks, to make about `TASKS_PER_THREAD` tasks a thread.
    let (row_blocks, nc) = blocking(a_panels, n.div_ceil(NR), mr, threads);
    let row_block = |ib: usize| {
        let (base, extra) = (a_panels / row_blocks, a_panels % row_blocks);
        let first = ib * base + ib.min(extra);
        let i0 = first * mr;
        (i0, ((base + usize::from(ib < extra)) * mr).min(m - i0))
    };
    for k0 in (0..k).step_by(k_blocks * kc) {
        let k_len = (k_blocks * kc).min(k - k0);
        let blocks = k_len.div_ceil(kc);
        pack_a_blocks(path, a, m, (k0, k_len), a_block, &mut packed_a, threads);
        for j0 in (0..n).step_by(b_panels * NR) {
            let cols = (b_panels * NR).min(n - j0);
            let pb_all: &[u32] = match b {
                Rhs::Pack(b) => {
                    let (b_rs, b_cs) = b.strides();
                    for kb in 0..blocks {
                        let (p0, len) = (k0 + kb * kc, kc.min(k0 + k_len - (k0 + kb * kc)));
                        let out = &mut packed_b[kb * b_block..(kb + 1) * b_block];
                        pack_all(b, (b_cs, b_rs), (j0, cols), p0, len, NR, out, threads);
                    }
                    &packed_b
                }
                Rhs::Packed(p) => {
                    debug_assert!(p.k == k && p.n == n && p.block_words() == b_block);
                    &p.words[(k0 / kc) * b_block..]
                }
            };
            let packed_a = &packed_a[..];
            let col_blocks = cols.div_ceil(nc);
            let task = |t: usize| {
                let (ib, jb) = (t / col_blocks, t % col_blocks);
                let (i0, rows) = row_block(ib);
                let (c0, width_all) = (jb * nc, nc.min(cols - jb * nc));
                let panels = (c0 / NR)..(c0 + width_all).div_ceil(NR);
                if path == Path::Amx {
                    // SAFETY: AMX is present where the path is (the caller's promise).
                    let _tiles = unsafe { amx::Tiles::configure() };
                    let block = |kb: usize| amx::Block {
                        pairs: kc.min(k_len - kb * kc).div_ceil(2),
                        pa: &packed_a[kb * a_block..],
                        pb: &pb_all[kb * b_block..],
                    };
                    for g0 in (0..blocks).step_by(walk.group) {
                        // The group's blocks on the stack (the slots past it repeat its last).
                        let len = walk.group.min(blocks - g0);
                        let group: [amx::Block<'_>; walk::MAX_GROUP] =
                            std::array::from_fn(|i| block(g0 + i.min(len - 1)));
                        let group = &group[..len];
                        let first = k0 == 0 && g0 == 0 && !accumulate;
                        let (row_range, c) = (i0..i0 + rows, (dst.at(j0), c_rs));
                        // SAFETY: the tiles are configured; the blocks hold the packed
                        // panels; the task's rows and columns lie in the destination (the
                        // caller's promise) and are this task's alone.
                        unsafe {
                            amx::block_tiles(
                                group,
                                row_range,
                                panels.clone(),
                                cols,
                                c,
                                first,
                                walk.prefetch,
                                &amx::TILE,
                            )
                        };
                    }
                    return;
                }
                for kb in 0..blocks {
                    let len = kc.min(k_len - kb * kc);
                    let pairs = len.div_ceil(2);
                    let first = k0 == 0 && kb == 0 && !accumulate;
                    let last = k0 + k_len == k && kb + 1 == blocks;
                    let (pa, pb) = (&packed_a[kb * a_block..], &pb_all[kb * b_block..]);
                    for jp in panels.clone() {
                        let bp = &pb[jp * pairs * NR..(jp + 1) * pairs * NR];
                        // The next panel, fetched into L2 during this panel's first tile: a
                        // weight packed before comes from memory, and its first tile would
                        // otherwise wait on it.
                        let next = (jp + 1 < panels.end)
                            .then(|| &pb[(jp + 1) * pairs * NR..(jp + 2) * pairs * NR]);
                        let width = NR.min(cols - jp * NR);
                        for r in (i0 / MR)..(i0 + rows).div_ceil(MR) {
                            let next = if r == i0 / MR { next } else { None };
                            let ap = &pa[r * MR * pairs..(r + 1) * MR * pairs];
                            // SAFETY: the CPU has AVX512-BF16 (the caller's promise); the
                            // panels hold `pairs` pairs; the tile at row panel `r` and these
                            // columns lies inside the destination (the caller's promise) and
                            // belongs to this task alone; a share's operands cover the
                            // destination (checked by the share's caller).
                            unsafe {
                                avx512::tile_at(
                                    (pairs, ap, bp, next),
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

/// How [`blocked`] cuts a product of `row_panels` x `col_panels` panels into tasks: the number
/// of row blocks (of equal panels of `mr` rows, up to [`MAX_ROWS`]) and the columns of a column block
/// (a multiple of [`NR`], up to [`NC`]).
fn blocking(row_panels: usize, col_panels: usize, mr: usize, threads: Threads) -> (usize, usize) {
    let want = match threads {
        Threads::All => TASKS_PER_THREAD * rayon::current_num_threads(),
        Threads::One => 1,
    };
    let mut row_blocks = row_panels.div_ceil((MAX_ROWS / mr).max(1)).max(1);
    let per_col = col_panels
        .div_ceil(want.div_ceil(row_blocks))
        .clamp(MIN_COL_PANELS, NC / NR);
    let col_blocks = col_panels.div_ceil(per_col);
    // A short product keeps one row block (each panel of `b` then leaves memory once: a
    // weight packed before is read from memory); a tall one is cut finer for more tasks.
    if row_blocks > 1 && row_blocks * col_blocks < want {
        let most = row_panels.div_ceil((MIN_ROWS / mr).max(1)).max(row_blocks);
        row_blocks = want.div_ceil(col_blocks).min(most);
    }
    (row_blocks, per_col * NR)
}

/// Pack `a`'s reduction blocks `k0..k0 + k_len` (`m` rows) for `path`'s kernel into `out`, a
/// block every `a_block` words ([`amx::pack_rows`] on AMX, else panels of [`MR`] rows).
#[cfg(target_arch = "x86_64")]
fn pack_a_blocks(
    path: Path,
    a: Operand<'_>,
    m: usize,
    (k0, k_len): (usize, usize),
    a_block: usize,
    out: &mut [u32],
    threads: Threads,
) {
    let (strides, kc) = (a.strides(), 2 * KC2);
    for kb in 0..k_len.div_ceil(kc) {
        let (p0, len) = (k0 + kb * kc, kc.min(k_len - kb * kc));
        let out = &mut out[kb * a_block..(kb + 1) * a_block];
        if path == Path::Amx {
            amx::pack_rows(a, strides, m, p0, len, out, threads);
        } else {
            pack_all(a, strides, (0, m), p0, len, MR, out, threads);
        }
    }
}

thread_local! {
    /// [`blocked`]'s packed blocks of `a` and `b`.
    static PACKED: std::cell::Cell<(Vec<u32>, Vec<u32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

#[cfg(test)]
mod tests;
