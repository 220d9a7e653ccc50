//! The products of the fused kernels at their precision ([`Precision`]): f32 through `gemm`
//! ([`crate::mm`]), or bf16 with f32 accumulation ([`crate::bf16`]); weights f32 or bf16
//! ([`Matrix`]).

use crate::bf16;
use crate::mm::{Threads, mm, mm_new};

/// How a product multiplies its operands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// f32 operands and accumulation.
    #[default]
    F32,
    /// Operands rounded to bf16, products accumulated in f32 ([`bf16`]), as `torch.autocast`'s
    /// bf16 matrix products on CPU.
    Bf16,
}

/// [`mm`] at `precision`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_in(
    precision: Precision,
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
    c: (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    match precision {
        Precision::F32 => mm(m, n, k, a, b, c, accumulate, threads),
        Precision::Bf16 => bf16::mm_bf16(
            m,
            n,
            k,
            bf16::Operand::F32(a.0, a.1, a.2),
            bf16::Operand::F32(b.0, b.1, b.2),
            c,
            accumulate,
            threads,
        ),
    }
}

/// [`mm_new`] at `precision`.
pub(crate) fn mm_new_in(
    precision: Precision,
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
    threads: Threads,
) -> Vec<f32> {
    if precision == Precision::F32 {
        return mm_new(m, n, k, a, b, threads);
    }
    let (a, b) = (
        bf16::Operand::F32(a.0, a.1, a.2),
        bf16::Operand::F32(b.0, b.1, b.2),
    );
    bf16::mm_bf16_new(m, n, k, a, b, threads)
}

/// A weight matrix stored row-major `[rows, cols]`: f32, read in place, or bf16 (frozen weights
/// kept at half the bytes), widened to f32 one block at a time for `gemm`, which computes in
/// f32 only.
#[derive(Clone, Copy)]
pub(crate) enum Matrix<'a> {
    F32(&'a [f32]),
    Bf16(&'a [half::bf16]),
}

impl<'a> Matrix<'a> {
    /// The bf16 kernel's operand reading this matrix at strides `(rs, cs)`.
    fn operand(self, (rs, cs): (usize, usize)) -> bf16::Operand<'a> {
        match self {
            Matrix::F32(w) => bf16::Operand::F32(w, rs, cs),
            Matrix::Bf16(w) => bf16::Operand::Bf16(w, rs, cs),
        }
    }
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
/// A bf16 `w`, or any `w` at [`Precision::Bf16`], makes a bf16 product with f32 accumulation
/// ([`bf16`]): `a` rounded to bf16, on the bf16 kernel where the CPU has it. Without the
/// kernel, a bf16 `w` is widened block by block into a scratch buffer: along the reduction axis (each
/// block adds its share to `c`, which stays in cache), or along the output axis (each block
/// writes its own columns of `c`) when a reduction block would be thinner than
/// [`MIN_REDUCTION_BLOCK`]. Measured on the Qwen3-1.7B projections (`examples/bf16_projection`,
/// `benches/README.md`): blocking the reduction costs 2-8% over the f32 product, blocking the
/// output 8-32% (each output block makes `gemm` pack the whole left operand again).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_matrix(
    precision: Precision,
    m: usize,
    a: (&[f32], usize, usize),
    w: Matrix<'_>,
    shape: [usize; 2],
    transposed: bool,
    c: (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    let ((k, n), strides) = op_layout(shape, transposed);
    let a16 = bf16::Operand::F32(a.0, a.1, a.2);
    match (w, precision) {
        (Matrix::F32(_), Precision::Bf16) => {
            bf16::mm_bf16(m, n, k, a16, w.operand(strides), c, accumulate, threads);
        }
        (Matrix::Bf16(wb), _) if bf16::bf16_path().has_kernel() => {
            let kept = bf16::packed(wb, shape, transposed);
            let rhs = kernel_rhs(w, kept.as_deref(), strides);
            bf16::mm_bf16_kernel(m, n, k, a16, rhs, c, accumulate, threads);
        }
        _ => {
            // An f32 product; for a bf16 `w` without the kernel, the same numbers as the kernel's:
            // `a` rounded, `w` widened block by block.
            let rounded = matches!(w, Matrix::Bf16(_)).then(|| bf16::rounded(a16, m, k));
            let a = rounded.as_deref().map_or(a, |r| (r, k, 1));
            let blocking = (WIDEN_BLOCK, MIN_REDUCTION_BLOCK);
            mm_matrix_blocked(m, a, w, shape, transposed, c, accumulate, threads, blocking);
        }
    }
}

/// [`mm_matrix`] into a new row-major `[m, n]` buffer (`n` the output width of `op(w)`). A
/// product of an f32 `w` (at either precision) or on the bf16 kernel writes it without zeroing
/// it first ([`mm_new_in`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_matrix_new(
    precision: Precision,
    m: usize,
    a: (&[f32], usize, usize),
    w: Matrix<'_>,
    [rows, cols]: [usize; 2],
    transposed: bool,
    threads: Threads,
) -> Vec<f32> {
    let ((k, n), (rs, cs)) = op_layout([rows, cols], transposed);
    if let Matrix::F32(w) = w {
        // f32 weights, at either precision: into a buffer not zero-filled first.
        return mm_new_in(precision, m, n, k, a, (w, rs, cs), threads);
    }
    if let Matrix::Bf16(wb) = w
        && bf16::bf16_path().has_kernel()
    {
        // The kernel writes every element: no zeroing first.
        let a16 = bf16::Operand::F32(a.0, a.1, a.2);
        let kept = bf16::packed(wb, [rows, cols], transposed);
        let rhs = kernel_rhs(w, kept.as_deref(), (rs, cs));
        if let Some(c) = bf16::mm_bf16_kernel_new(m, n, k, a16, rhs, threads) {
            return c;
        }
    }
    let mut c = vec![0.0f32; m * n];
    mm_matrix(
        precision,
        m,
        a,
        w,
        [rows, cols],
        transposed,
        (&mut c, n),
        false,
        threads,
    );
    c
}

/// [`mm_matrix_new`] plus a rank-`r` product `l @ r` (`l: [m, rank]`, `r: [rank, n]`,
/// row-major, f32): on the AVX512-BF16 kernel for a bf16 `w`, added to each tile as it is
/// stored ([`bf16::mm_bf16_kernel_new_low`]); elsewhere accumulated by `gemm` afterwards. The
/// same numbers either way.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mm_matrix_new_low(
    precision: Precision,
    m: usize,
    a: (&[f32], usize, usize),
    w: Matrix<'_>,
    shape: [usize; 2],
    transposed: bool,
    low: bf16::LowRank<'_>,
    threads: Threads,
) -> Vec<f32> {
    let ((k, n), strides) = op_layout(shape, transposed);
    if let Matrix::Bf16(wb) = w {
        let a16 = bf16::Operand::F32(a.0, a.1, a.2);
        let kept = bf16::packed(wb, shape, transposed);
        let rhs = kernel_rhs(w, kept.as_deref(), strides);
        if let Some(c) = bf16::mm_bf16_kernel_new_low(m, n, k, a16, rhs, low, threads) {
            return c;
        }
    }
    let mut c = mm_matrix_new(precision, m, a, w, shape, transposed, threads);
    let (l, r, rank) = ((low.l, low.rank, 1), (low.r, n, 1), low.rank);
    mm(m, n, rank, l, r, (&mut c, n), true, threads);
    c
}

/// `op(w)` (as in [`mm_matrix`]) packed once for the bf16 kernel, for several products at
/// `precision` that multiply it (the fused head's row chunks); `None` where those products
/// would not run on the kernel (f32 products, or a CPU without it).
pub(crate) fn packed_matrix(
    precision: Precision,
    w: Matrix<'_>,
    shape: [usize; 2],
    transposed: bool,
) -> Option<bf16::PackedB> {
    let on_kernel = matches!(w, Matrix::Bf16(_)) || precision == Precision::Bf16;
    if !on_kernel || !bf16::bf16_path().has_kernel() {
        return None;
    }
    let ((k, n), strides) = op_layout(shape, transposed);
    Some(bf16::PackedB::pack(w.operand(strides), k, n))
}

/// `c (+)= a @ b` on the bf16 kernel for `a: [m, k]` and a `b` packed before
/// ([`packed_matrix`]): the bits of [`mm_matrix`] on the `w` it was packed from.
pub(crate) fn mm_packed(
    m: usize,
    a: (&[f32], usize, usize),
    b: &bf16::PackedB,
    c: (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    let (k, n) = b.shape();
    let a16 = bf16::Operand::F32(a.0, a.1, a.2);
    let ran = bf16::mm_bf16_kernel(m, n, k, a16, bf16::Rhs::Packed(b), c, accumulate, threads);
    debug_assert!(
        ran,
        "a packed operand exists only where the CPU has the kernel"
    );
}

/// `op(w)` (strides `(rs, cs)`) as the bf16 kernel's right operand: the packing an inference
/// guard keeps for it ([`bf16::packed`]), else `w` itself, packed by the product.
fn kernel_rhs<'a>(
    w: Matrix<'a>,
    kept: Option<&'a bf16::PackedB>,
    (rs, cs): (usize, usize),
) -> bf16::Rhs<'a> {
    match kept {
        Some(p) => bf16::Rhs::Packed(p),
        None => bf16::Rhs::Pack(w.operand((rs, cs))),
    }
}

/// `op(w)` of a `w` stored `[rows, cols]` (`w^T` when `transposed`): the product's `(k, n)`,
/// and `op(w)`'s row and column strides in that storage.
fn op_layout([rows, cols]: [usize; 2], transposed: bool) -> ((usize, usize), (usize, usize)) {
    if transposed {
        ((cols, rows), (1, cols))
    } else {
        ((rows, cols), (cols, 1))
    }
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
#[path = "products_tests.rs"]
mod tests;
