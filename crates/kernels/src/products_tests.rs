//! Tests of the weight products: the bf16 blockings.
use super::*;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + seed * 40_503) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// Every blocking of a bf16 weight (output or reduction axis, rows or columns of `w`, one
/// block or several, a short last block) equals the f32 product of the same rounded
/// weight, accumulating or not.
#[test]
fn bf16_weight_products_equal_the_f32_product_of_the_rounded_weight() {
    let (m, rows, cols) = (7, 37, 53);
    let w: Vec<half::bf16> = values(rows * cols, 1)
        .into_iter()
        .map(half::bf16::from_f32)
        .collect();
    let wide: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
    for transposed in [false, true] {
        let (k, n) = if transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let a = values(m * k, 2);
        let start = values(m * n, 3);
        // One reduction block; several (a short last one); several output blocks.
        for blocking in [(1 << 20, 1), (64 * 16, 1), (64 * 16, 1 << 20)] {
            for accumulate in [false, true] {
                let product = |weight: Matrix<'_>| {
                    let mut c = start.clone();
                    let (a, c_rs) = ((&a[..], k, 1), n);
                    mm_matrix_blocked(
                        m,
                        a,
                        weight,
                        [rows, cols],
                        transposed,
                        (&mut c, c_rs),
                        accumulate,
                        Threads::All,
                        blocking,
                    );
                    c
                };
                let (expected, found) = (product(Matrix::F32(&wide)), product(Matrix::Bf16(&w)));
                let diff = expected
                    .iter()
                    .zip(&found)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    diff <= 1e-6 * k as f32,
                    "transposed={transposed} blocking={blocking:?} accumulate={accumulate}: \
                     {diff}"
                );
            }
        }
    }
}
