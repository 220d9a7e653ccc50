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
    (a, a_rs, a_cs): (&[f32], usize, usize),
    (b, b_rs, b_cs): (&[f32], usize, usize),
    (c, c_rs): (&mut [f32], usize),
    accumulate: bool,
    threads: Threads,
) {
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * rs + (cols - 1) * cs + 1
        }
    };
    assert!(a.len() >= last(m, k, a_rs, a_cs), "lhs out of bounds");
    assert!(b.len() >= last(k, n, b_rs, b_cs), "rhs out of bounds");
    assert!(c.len() >= last(m, n, c_rs, 1), "dst out of bounds");
    let parallelism = match threads {
        Threads::One => gemm::Parallelism::None,
        Threads::All => gemm::Parallelism::Rayon(0),
    };
    // SAFETY: the asserts above keep every index the strides reach inside the slices, and `c`
    // does not alias `a` or `b` (it is a distinct `&mut`).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}
