//! Strided f32 matrix products through the `gemm` crate (the kernel Flex's matmul uses).

/// Threads one product may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Threads {
    /// The calling thread only (the caller already spreads its tasks over the threads).
    One,
    /// Rayon's pool.
    All,
}

/// `c = a @ b` (or `c += a @ b` when `accumulate`) for `a: [m, k]`, `b: [k, n]`, `c: [m, n]`,
/// each given as `(data, row stride, column stride)` (`c` row-major with its row stride).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm(
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
    c: (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    mm_scaled(m, n, k, a, b, c, accumulate.then_some(1.0), 1.0, threads);
}

/// `c = alpha c + beta (a @ b)` (operands as in [`mm`]): one pass of `gemm` that also scales
/// what the destination held, as PyTorch's `addmm(c, a, b, beta=alpha, alpha=beta)`; with
/// `alpha` `None`, `c = beta (a @ b)` without reading the destination.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_scaled(
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
    (c, c_rs): (&mut [f32], usize),
    alpha: Option<f32>,
    beta: f32,
    threads: Threads,
) {
    assert!(c.len() >= extent(m, n, c_rs, 1), "dst out of bounds");
    // SAFETY: `c` is a distinct `&mut` slice (no aliasing with `a` or `b`) that the assert keeps
    // every destination index inside.
    unsafe { mm_raw(m, n, k, a, b, (c.as_mut_ptr(), c_rs), alpha, beta, threads) }
}

/// `c = alpha c + beta (a @ b)` into a raw row-major destination, or `c = beta (a @ b)` when
/// `alpha` is `None` (the destination is then not read).
///
/// # Safety
/// `c` must be valid for writes (and reads when `alpha` is given) of the `m x n` elements at
/// row stride `c_rs`, and must not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
unsafe fn mm_raw(
    m: usize,
    n: usize,
    k: usize,
    (a, a_rs, a_cs): (&[f32], usize, usize),
    (b, b_rs, b_cs): (&[f32], usize, usize),
    (c, c_rs): (*mut f32, usize),
    alpha: Option<f32>,
    beta: f32,
    threads: Threads,
) {
    assert!(a.len() >= extent(m, k, a_rs, a_cs), "lhs out of bounds");
    assert!(b.len() >= extent(k, n, b_rs, b_cs), "rhs out of bounds");
    let rows = invariant_rows(m, n, k, b_rs);
    if rows > m {
        // SAFETY: as this function's, for the padded product's operands and destination.
        unsafe {
            padded(
                m,
                rows,
                n,
                k,
                (a, a_rs, a_cs),
                (b, b_rs, b_cs),
                (c, c_rs),
                alpha,
                beta,
                threads,
            )
        };
        return;
    }
    let parallelism = match threads {
        Threads::One => gemm::Parallelism::None,
        Threads::All => gemm::Parallelism::Rayon(0),
    };
    // SAFETY: the asserts keep every operand index inside its slice; the caller vouches for `c`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            c_rs as isize,
            alpha.is_some(),
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            alpha.unwrap_or(1.0),
            beta,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// The fewest rows for which `gemm` computes an `[m, n] @ [n, k]` product on its general path,
/// whose arithmetic for one row does not depend on the others: each element a chain of fused
/// multiply-adds over reduction blocks whose size depends on `k` alone. Below it, `gemm` 0.19
/// takes paths chosen by the row count: one row goes to a matrix-vector kernel, `m * n <= 256`
/// with a column-major right operand to dot-product kernels, and `m, n <= 64` blocks the
/// reduction by 512 where the general path divides `k` evenly. A row's product (its logits, its
/// hidden states) would then change with how many rows share the call: with the padding, it
/// is the same alone and in any batch (issue 40, L1). `m` itself when no path depends on it.
fn invariant_rows(m: usize, n: usize, k: usize, b_rs: usize) -> usize {
    if m == 0 || n <= 1 || k <= 2 {
        // Nothing to compute, or paths chosen by `n` or `k` alone.
        return m;
    }
    let mut rows = m.max(2);
    if b_rs == 1 {
        rows = rows.max(256 / n + 1);
    }
    if n <= 64 && k > 512 {
        rows = rows.max(65);
    }
    rows
}

/// [`mm_raw`] of `m` rows through a product of `rows > m` (the first `m` rows real, the rest
/// zero): `gemm` then takes its general path (see [`invariant_rows`]). The destination rows go
/// through the padded product too (`gemm` applies `alpha` and `beta` to them itself).
///
/// # Safety
/// As [`mm_raw`].
#[allow(clippy::too_many_arguments)]
unsafe fn padded(
    m: usize,
    rows: usize,
    n: usize,
    k: usize,
    (a, a_rs, a_cs): (&[f32], usize, usize),
    b: (&[f32], usize, usize),
    (c, c_rs): (*mut f32, usize),
    alpha: Option<f32>,
    beta: f32,
    threads: Threads,
) {
    let mut lhs = vec![0.0f32; rows * k];
    for i in 0..m {
        for p in 0..k {
            lhs[i * k + p] = a[i * a_rs + p * a_cs];
        }
    }
    let mut dst = vec![0.0f32; rows * n];
    if alpha.is_some() {
        for i in 0..m {
            // SAFETY: the caller vouches for reads of `c`'s `m x n` elements.
            let row = unsafe { std::slice::from_raw_parts(c.add(i * c_rs), n) };
            dst[i * n..(i + 1) * n].copy_from_slice(row);
        }
    }
    // SAFETY: `dst` is a fresh buffer of `rows x n`; `lhs` and `b` are in bounds (asserted there).
    unsafe {
        mm_raw(
            rows,
            n,
            k,
            (&lhs, k, 1),
            b,
            (dst.as_mut_ptr(), n),
            alpha,
            beta,
            threads,
        )
    };
    for i in 0..m {
        // SAFETY: the caller vouches for writes of `c`'s `m x n` elements.
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * c_rs), n) };
        row.copy_from_slice(&dst[i * n..(i + 1) * n]);
    }
}

/// `a @ b` into a new row-major `[m, n]` buffer (see [`mm`] for the operands). The buffer is
/// not zeroed first: the product writes every element (`gemm` does not read the destination
/// when not accumulating), so the allocation costs no pass over memory.
pub(crate) fn mm_new(
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
    threads: Threads,
) -> Vec<f32> {
    if k == 0 {
        return vec![0.0; m * n];
    }
    let mut c: Vec<f32> = Vec::with_capacity(m * n);
    let spare = c.spare_capacity_mut();
    // SAFETY: `MaybeUninit<f32>` and `f32` have the same layout; `mm_raw` only writes the
    // `m * n` destination elements (no read: `accumulate` is false), after which all of them are
    // initialised and the length can cover them.
    unsafe {
        mm_raw(
            m,
            n,
            k,
            a,
            b,
            (spare.as_mut_ptr().cast::<f32>(), n),
            None,
            1.0,
            threads,
        );
        c.set_len(m * n);
    }
    c
}

/// Elements a `rows x cols` operand at these strides spans.
pub(crate) fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// A weight matrix stored row-major `[rows, cols]`: f32, read in place, or bf16 (frozen weights
/// kept at half the bytes), widened to f32 one block at a time for `gemm`, which computes in
/// f32 only.
#[derive(Clone, Copy)]
pub(crate) enum Matrix<'a> {
    F32(&'a [f32]),
    Bf16(&'a [half::bf16]),
}

/// f32 elements per widened block: 8 MB, so that a block `gemm` packs from is still in the
/// last-level cache after it was written.
const WIDEN_BLOCK: usize = 1 << 21;

/// The thinnest reduction block a bf16 product is cut into; where the output is so wide that
/// a block would be thinner (the LM head's logits over the vocabulary), it is blocked along its
/// output axis instead: rank-16 updates of a `[rows, vocab]` destination would run far below
/// the `gemm` peak.
const MIN_REDUCTION_BLOCK: usize = 256;

/// `c (+)= a @ op(w)` for `a: [m, k]` (as in [`mm`]) and `w` stored `[rows, cols]`, where
/// `op(w)` is `w` (`k = rows`, `n = cols`) or, when `transposed`, `w^T` (`k = cols`,
/// `n = rows`). `c: [m, n]` at row stride `c_rs`; `accumulate` adds to what it holds.
///
/// A bf16 `w` is widened block by block into a scratch buffer: along the reduction axis (each
/// block adds its share to `c`, which stays in cache), or along the output axis (each block
/// writes its own columns of `c`) when a reduction block would be thinner than
/// [`MIN_REDUCTION_BLOCK`]. Measured on the Qwen3-1.7B projections (`examples/bf16_projection`,
/// `benches/README.md`): blocking the reduction costs 2-8% over the f32 product, blocking the
/// output 8-32% (each output block makes `gemm` pack the whole left operand again).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_matrix(
    m: usize,
    a: (&[f32], usize, usize),
    w: Matrix<'_>,
    shape: [usize; 2],
    transposed: bool,
    c: (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    let blocking = (WIDEN_BLOCK, MIN_REDUCTION_BLOCK);
    mm_matrix_blocked(m, a, w, shape, transposed, c, accumulate, threads, blocking);
}

/// [`mm_matrix`] with its block size and reduction limit as arguments (the tests make them
/// small, to run every blocking on small matrices).
#[allow(clippy::too_many_arguments)]
fn mm_matrix_blocked(
    m: usize,
    a: (&[f32], usize, usize),
    w: Matrix<'_>,
    [rows, cols]: [usize; 2],
    transposed: bool,
    (c, c_rs): (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
    (widen_block, min_reduction_block): (usize, usize),
) {
    let (k, n) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let w = match w {
        Matrix::F32(w) => {
            let b = if transposed {
                (w, 1, cols)
            } else {
                (w, cols, 1)
            };
            return mm(m, n, k, a, b, (c, c_rs), accumulate, threads);
        }
        Matrix::Bf16(w) => w,
    };
    assert!(w.len() >= rows * cols, "weight out of bounds");
    let (a, a_rs, a_cs) = a;
    // Block along W's rows (`true`) or columns, and whether that axis is the output one.
    let along_output = widen_block / n.max(1) < min_reduction_block;
    let by_rows = along_output == transposed;
    let (axis_len, other) = if by_rows { (rows, cols) } else { (cols, rows) };
    let block = (widen_block / other.max(1)).max(16).min(axis_len.max(1));
    // One buffer per thread, reused across calls (a fresh one would be faulted in and zeroed
    // each time); taken out while in use, so a nested call on this thread (rayon runs other
    // tasks while `gemm` waits) finds none and allocates its own.
    let mut scratch = SCRATCH.take();
    if scratch.len() < block * other {
        scratch.resize(block * other, 0.0);
    }
    for start in (0..axis_len).step_by(block) {
        let len = block.min(axis_len - start);
        // The block as a dense `[r, s]` matrix: rows start..start+len of W (s = cols), or its
        // columns start..start+len (r = rows, s = len).
        let (r, s) = if by_rows { (len, cols) } else { (rows, len) };
        let dst = &mut scratch[..r * s];
        widen(w, cols, by_rows, start, len, dst);
        // `op(W)`'s block as `[k_b, n_b]` with its strides: a block of rows of W is `[len, cols]`
        // (`W` rows, `W^T` columns), a block of columns `[rows, len]`.
        let b = if transposed {
            (&*dst, 1, s)
        } else {
            (&*dst, s, 1)
        };
        if along_output {
            mm(
                m,
                len,
                k,
                (a, a_rs, a_cs),
                b,
                (&mut c[start..], c_rs),
                accumulate,
                threads,
            );
        } else {
            mm(
                m,
                n,
                len,
                (&a[start * a_cs..], a_rs, a_cs),
                b,
                (&mut *c, c_rs),
                accumulate || start > 0,
                threads,
            );
        }
    }
    SCRATCH.set(scratch);
}

thread_local! {
    /// [`mm_matrix_blocked`]'s widened blocks.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Rows `start..start + len` of the bf16 `w` (row length `cols`) when `by_rows`, else those
/// columns of every row, into `dst` as a dense f32 matrix. A bf16 is the high half of an f32's
/// bits, so widening is exact.
fn widen(w: &[half::bf16], cols: usize, by_rows: bool, start: usize, len: usize, dst: &mut [f32]) {
    use rayon::prelude::*;
    if by_rows {
        // Whole rows: one contiguous run, converted in large pieces.
        const PIECE: usize = 1 << 16;
        let src = &w[start * cols..(start + len) * cols];
        dst.par_chunks_mut(PIECE)
            .zip(src.par_chunks(PIECE))
            .for_each(|(out, src)| widen_run(src, out));
    } else {
        dst.par_chunks_mut(len.max(1))
            .enumerate()
            .for_each(|(i, out)| widen_run(&w[i * cols + start..i * cols + start + len], out));
    }
}

simd_dispatch! {
    /// `out[i] = src[i]` widened to f32 (`src.len() == out.len()`).
    fn widen_run(src: &[half::bf16], out: &mut [f32]) = widen_run_generic
}

#[inline(always)]
fn widen_run_generic(src: &[half::bf16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(src) {
        *o = f32::from_bits(u32::from(v.to_bits()) << 16);
    }
}

#[cfg(test)]
mod tests;
