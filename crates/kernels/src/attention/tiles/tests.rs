use super::*;

fn filled(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// `sum_kk a[r, kk] b[kk, j]` in f64, `a` at strides `(a_rs, a_cs)`, `b` at row stride
/// `b_rs`.
fn product(
    k: usize,
    (a, a_rs, a_cs): (&[f32], usize, usize),
    (b, b_rs): (&[f32], usize),
    r: usize,
    j: usize,
) -> f64 {
    (0..k)
        .map(|kk| f64::from(a[r * a_rs + kk * a_cs]) * f64::from(b[kk * b_rs + j]))
        .sum()
}

/// The paths to test on this machine: `gemm`, and the tiles where they run.
fn paths(tiles: bool) -> Vec<bool> {
    if tiles {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// `narrow` against the f64 product on its paths (the tiles at `hd = 32`, `gemm` at every
/// size), with row counts that leave each remainder of the row tiles: `a` row-major (as `P`, `dS`) and
/// transposed (as `dS^T`, accumulating), into a strided `c`; steps past one slice.
#[test]
fn narrow_products_match_the_reference() {
    for hd in [32, 64, 128] {
        for (m, k) in [
            (1, 1),
            (3, 16),
            (4, 37),
            (7, 300),
            (13, 64),
            (64, 100),
            (29, 513),
        ] {
            let (a, b) = (filled(m * k, 1), filled(k * hd, 2));
            for (a_rs, a_cs, accumulate) in [(k, 1, false), (1, m, true)] {
                let c_rs = hd + 5;
                let start = filled(m * c_rs, 3);
                for tiles in paths(narrow_available(hd)) {
                    let mut got = start.clone();
                    let c = (&mut got[..], c_rs);
                    narrow_on(tiles, m, k, hd, (&a, a_rs, a_cs), &b, c, accumulate, 0.7);
                    for r in 0..m {
                        for j in 0..hd {
                            let base = if accumulate { start[r * c_rs + j] } else { 0.0 };
                            let p = product(k, (&a, a_rs, a_cs), (&b, hd), r, j);
                            let want = f64::from(base) + 0.7 * p;
                            let diff = (f64::from(got[r * c_rs + j]) - want).abs();
                            assert!(diff <= 1e-5 * k as f64, "{tiles} {hd} {m} {k} {a_rs}");
                        }
                        assert_eq!(
                            got[r * c_rs + hd..(r + 1) * c_rs],
                            start[r * c_rs + hd..(r + 1) * c_rs]
                        );
                    }
                }
            }
        }
    }
}

/// `wide` with each epilogue against f64 on both paths: the forward's scaled scores and row
/// maxima over the causal limit, the probabilities (0 past the limit), the score gradients.
#[test]
fn wide_epilogues_match_the_reference() {
    for hd in [32, 64, 128] {
        for (m, n) in [(1usize, 1usize), (3, 17), (8, 48), (13, 100), (64, 130)] {
            let cols = n.next_multiple_of(W);
            let bt_rs = cols + 3;
            let (a, bt) = (filled(m * hd, 4), filled(hd * bt_rs, 5));
            let c_rs = cols + 16;
            let lim: Vec<u32> = (0..m).map(|r| (n - (r * 7) % n) as u32).collect();
            let lse: Vec<f32> = (0..m).map(|r| r as f32 * 0.1).collect();
            let dd: Vec<f32> = (0..m).map(|r| 0.3 - r as f32 * 0.05).collect();
            let x = |r: usize, j: usize| product(hd, (&a, hd, 1), (&bt, bt_rs), r, j);
            for tiles in paths(available(hd)) {
                let mut scores = vec![f32::NAN; m * c_rs];
                let mut max = vec![-1.0f32; m];
                let epi = Epilogue::Max {
                    scale: 0.5,
                    lim: &lim,
                    max: &mut max,
                };
                wide_on(tiles, m, n, hd, &a, (&bt, bt_rs), (&mut scores, c_rs), epi);
                let mut probs = vec![f32::NAN; m * c_rs];
                let epi = Epilogue::Probs {
                    scale: 0.5,
                    lim: &lim,
                    lse: &lse,
                };
                wide_on(tiles, m, n, hd, &a, (&bt, bt_rs), (&mut probs, c_rs), epi);
                let mut grads = vec![f32::NAN; m * c_rs];
                let epi = Epilogue::ScoreGrad { p: &probs, dd: &dd };
                wide_on(tiles, m, n, hd, &a, (&bt, bt_rs), (&mut grads, c_rs), epi);
                for r in 0..m {
                    let l = lim[r] as usize;
                    let row_max = (0..l).map(|j| 0.5 * x(r, j)).fold(-1.0f64, f64::max);
                    let what = format!("{tiles} {hd} {m} {n} row {r}");
                    assert!((f64::from(max[r]) - row_max).abs() <= 1e-5, "max {what}");
                    for j in 0..n {
                        let s = 0.5 * x(r, j);
                        let p = if j < l {
                            (s - f64::from(lse[r])).exp()
                        } else {
                            0.0
                        };
                        let g = p * (x(r, j) - f64::from(dd[r]));
                        let at = r * c_rs + j;
                        assert!((f64::from(scores[at]) - s).abs() <= 1e-5, "scores {what}");
                        assert!(
                            (f64::from(probs[at]) - p).abs() <= 1e-5 * p.max(1.0),
                            "probs {what}"
                        );
                        let size = p * (x(r, j).abs() + f64::from(dd[r]).abs());
                        let diff = (f64::from(grads[at]) - g).abs();
                        assert!(diff <= 1e-5 * size.max(1.0), "grads {what}");
                    }
                }
            }
        }
    }
}

/// `exp_row` on both paths against f64: the sum, the numerators, zeros past `n`.
#[test]
fn exp_row_matches_the_reference() {
    for (len, n) in [(16, 1), (48, 33), (64, 64), (100, 70)] {
        let row = filled(len, 6);
        let max = row[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for tiles in [false, available(32)] {
            let mut got = row.clone();
            let sum = exp_row_on(tiles, &mut got, n, max);
            let want: Vec<f64> = row[..n].iter().map(|&x| f64::from(x - max).exp()).collect();
            let total: f64 = want.iter().sum();
            assert!(
                (f64::from(sum) - total).abs() <= 1e-6 * total,
                "{tiles} {len} {n}"
            );
            for (g, w) in got.iter().zip(&want) {
                assert!((f64::from(*g) - w).abs() <= 1e-6, "{tiles} {len} {n}");
            }
            assert!(got[n..].iter().all(|&x| x == 0.0), "{tiles} {len} {n}");
        }
    }
}
