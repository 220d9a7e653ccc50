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

#[cfg(test)]
mod tests;
