//! Tests of the strided products: row invariance.
use super::*;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + seed * 40_503) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// A row's product is the same bits alone and among any number of other rows (issue 40,
/// L1), at the shapes where `gemm` would pick its path by the row count: one row, few
/// outputs (LoRA's rank, small experts) with a long or a short reduction, a column-major
/// right operand (the transposed embedding of the tied head), accumulating or not. Without
/// [`invariant_rows`] the one-row, the `m * n <= 256` and the `m, n <= 64` cases differ.
#[test]
fn a_rows_product_does_not_depend_on_the_other_rows() {
    for (n, k) in [
        (8, 1100),
        (32, 600),
        (64, 40),
        (200, 16),
        (640, 1100),
        (5, 128),
    ] {
        for b_column_major in [false, true] {
            let b = values(k * n, 5);
            let (b_rs, b_cs) = if b_column_major { (1, k) } else { (n, 1) };
            for accumulate in [false, true] {
                let mut reference: Option<Vec<f32>> = None;
                for m in [1usize, 2, 3, 7, 20, 64, 65, 100, 300] {
                    // The probed row is the last; the others differ with `m`.
                    let mut a = values((m - 1) * k, 7 + m as u64);
                    a.extend(values(k, 99));
                    let mut c = values((m - 1) * n, 11 + m as u64);
                    c.extend(values(n, 77));
                    mm(
                        m,
                        n,
                        k,
                        (&a, k, 1),
                        (&b, b_rs, b_cs),
                        (&mut c, n),
                        accumulate,
                        Threads::All,
                    );
                    let row = c[(m - 1) * n..].to_vec();
                    match &reference {
                        None => reference = Some(row),
                        Some(r) => assert!(
                            r.iter().zip(&row).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "n {n}, k {k}, column-major {b_column_major}, accumulate \
                             {accumulate}: the row differs at m = {m}"
                        ),
                    }
                }
            }
        }
    }
}
