//! The two shapes of LoRA's adapter products ([`super`]), each reading its large operand once,
//! in place, in row order.
//!
//! The rank `r` is small (8-64), so every adapter product has one side of `r`: `x @ a` and
//! `dy @ b^T` reduce a wide row to `r` numbers ([`rows_dot`]), and `a^T x`-shaped weight
//! gradients sum `r` scaled copies of each wide row ([`rows_outer`]). Through `gemm` each call
//! packed the wide operand (an activation or an output gradient, megabytes) for a product of a
//! few MFLOP, and its micro-kernel ran with most of its columns empty; on the 1.7B LoRA shape
//! those products took about 6% of a step (`benches/README.md`).
//!
//! Both are deterministic at any thread count: a row of [`rows_dot`] is one task's, its sums in
//! a fixed order, and depends on that row alone (issue 40, L1); each column slice of
//! [`rows_outer`] is one task's, summed over the rows in their order.

use rayon::prelude::*;

/// Floats per vector lane group (one AVX-512 register).
const W: usize = 16;
/// Outputs of the rank side computed together.
const G: usize = 4;
/// Rows of [`rows_dot`] per task.
const ROWS_PER_TASK: usize = 16;
/// Columns of [`rows_outer`] per task.
const COLS: usize = 64;

/// `c[i, j] = sum_p x[i, p] bt[j, p]` for `x: [n, k]` and `bt: [r, k]` row-major: `[n, r]`.
pub(super) fn rows_dot(x: &[f32], n: usize, k: usize, bt: &[f32], r: usize) -> Vec<f32> {
    assert!(
        x.len() >= n * k && bt.len() >= r * k,
        "operands out of bounds"
    );
    let mut c = vec![0.0f32; n * r];
    if r == 0 || n == 0 {
        return c;
    }
    c.par_chunks_mut(ROWS_PER_TASK * r)
        .enumerate()
        .for_each(|(t, out)| {
            let i0 = t * ROWS_PER_TASK;
            let rows = out.len() / r;
            dot_rows(&x[i0 * k..(i0 + rows) * k], k, bt, r, out);
        });
    c
}

simd_dispatch! {
    /// [`rows_dot`] of the rows of `x` (`out.len() / r` of them) into `out`.
    fn dot_rows(x: &[f32], k: usize, bt: &[f32], r: usize, out: &mut [f32]) = dot_rows_generic
}

#[inline(always)]
fn dot_rows_generic(x: &[f32], k: usize, bt: &[f32], r: usize, out: &mut [f32]) {
    let whole = k / W * W;
    for (xr, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(r)) {
        for j0 in (0..r).step_by(G) {
            let g = G.min(r - j0);
            // Rank rows past `r` repeat the last one; their sums are not stored.
            let b: [&[f32]; G] = std::array::from_fn(|t| &bt[(j0 + t.min(g - 1)) * k..][..k]);
            let mut acc = [[0.0f32; W]; G];
            for p in (0..whole).step_by(W) {
                let xv = &xr[p..p + W];
                for (acc, b) in acc.iter_mut().zip(&b) {
                    let bv = &b[p..p + W];
                    for l in 0..W {
                        acc[l] += xv[l] * bv[l];
                    }
                }
            }
            for t in 0..g {
                let tail: f32 = (whole..k).map(|p| xr[p] * b[t][p]).sum();
                o[j0 + t] = acc[t].iter().sum::<f32>() + tail;
            }
        }
    }
}

/// `c[j, q] = sum_i a[i, j] d[i, q]` for `a: [n, r]` and `d: [n, m]` row-major: `[r, m]`
/// (`a^T d`).
pub(super) fn rows_outer(a: &[f32], n: usize, r: usize, d: &[f32], m: usize) -> Vec<f32> {
    assert!(
        a.len() >= n * r && d.len() >= n * m,
        "operands out of bounds"
    );
    let mut c = vec![0.0f32; r * m];
    if r == 0 || m == 0 {
        return c;
    }
    let slices: Vec<Vec<f32>> = (0..m.div_ceil(COLS))
        .into_par_iter()
        .map(|s| {
            let q0 = s * COLS;
            let mut out = vec![0.0f32; r * COLS];
            outer_slice(a, n, r, d, m, q0, &mut out);
            out
        })
        .collect();
    for (s, out) in slices.iter().enumerate() {
        let (q0, w) = (s * COLS, COLS.min(m - s * COLS));
        for j in 0..r {
            c[j * m + q0..j * m + q0 + w].copy_from_slice(&out[j * COLS..j * COLS + w]);
        }
    }
    c
}

simd_dispatch! {
    /// [`rows_outer`] of columns `q0..q0 + 64` (fewer at the end) into `out: [r, 64]`.
    fn outer_slice(
        a: &[f32],
        n: usize,
        r: usize,
        d: &[f32],
        m: usize,
        q0: usize,
        out: &mut [f32],
    ) = outer_slice_generic
}

#[inline(always)]
fn outer_slice_generic(
    a: &[f32],
    n: usize,
    r: usize,
    d: &[f32],
    m: usize,
    q0: usize,
    out: &mut [f32],
) {
    let w = COLS.min(m - q0);
    let mut padded = [0.0f32; COLS];
    for j0 in (0..r).step_by(G) {
        let g = G.min(r - j0);
        let mut acc = [[0.0f32; COLS]; G];
        for i in 0..n {
            let row = &d[i * m + q0..][..w];
            let dv: &[f32; COLS] = match row.try_into() {
                Ok(full) => full,
                Err(_) => {
                    padded[..w].copy_from_slice(row);
                    &padded
                }
            };
            let ai = &a[i * r + j0..][..g];
            for (t, acc) in acc.iter_mut().enumerate() {
                let s = if t < g { ai[t] } else { 0.0 };
                for l in 0..COLS {
                    acc[l] += s * dv[l];
                }
            }
        }
        for (t, acc) in acc.iter().enumerate().take(g) {
            out[(j0 + t) * COLS..(j0 + t + 1) * COLS].copy_from_slice(acc);
        }
    }
}
