//! The attention at bf16 precision against an f64 reference on the same bf16-rounded inputs:
//! values and the gradients of q, k and v, on both ways of running the score products.

use super::*;
use crate::bf16::round_bits;
use burn::tensor::TensorData;

/// `n` values spread like a normal (a sum of uniforms), from `seed`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (0..4).map(|_| uniform()).sum::<f32>() - 2.0)
        .collect()
}

fn bf16_of(x: f32) -> f64 {
    f64::from(f32::from_bits(u32::from(round_bits(x)) << 16))
}

/// The attention and its gradients in f64 from the bf16 values of `q`, `k`, `v`, `d_out`
/// (causal, bottom-right aligned; `starts` as the kernel takes them).
#[allow(clippy::type_complexity)]
fn reference(
    [b, hq, hkv, t, s, hd]: [usize; 6],
    (q, k, v, d_out): (&[f32], &[f32], &[f32], &[f32]),
    scale: f64,
    starts: Option<&[u32]>,
) -> [Vec<f64>; 4] {
    let (q, k, v, d_out): (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) = (
        q.iter().map(|&x| bf16_of(x)).collect(),
        k.iter().map(|&x| bf16_of(x)).collect(),
        v.iter().map(|&x| bf16_of(x)).collect(),
        d_out.iter().map(|&x| bf16_of(x)).collect(),
    );
    let mut out = vec![0.0; b * hq * t * hd];
    let (mut dq, mut dk, mut dv) = (out.clone(), vec![0.0; k.len()], vec![0.0; v.len()]);
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            let qo = |i: usize| ((bi * hq + h) * t + i) * hd;
            let ko = |j: usize| ((bi * hkv + kh) * s + j) * hd;
            for i in 0..t {
                let first = starts.map_or(0, |st| st[bi * t + i] as usize);
                let keys = first..s - t + i + 1;
                let sc: Vec<f64> = keys
                    .clone()
                    .map(|j| scale * (0..hd).map(|d| q[qo(i) + d] * k[ko(j) + d]).sum::<f64>())
                    .collect();
                let max = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = sc.iter().map(|x| (x - max).exp()).sum();
                let p: Vec<f64> = sc.iter().map(|x| (x - max).exp() / sum).collect();
                for (pj, j) in p.iter().zip(keys.clone()) {
                    for d in 0..hd {
                        out[qo(i) + d] += pj * v[ko(j) + d];
                    }
                }
                let dd: f64 = (0..hd).map(|d| d_out[qo(i) + d] * out[qo(i) + d]).sum();
                for (pj, j) in p.iter().zip(keys) {
                    let dp: f64 = (0..hd).map(|d| d_out[qo(i) + d] * v[ko(j) + d]).sum();
                    let ds = pj * (dp - dd);
                    for d in 0..hd {
                        dq[qo(i) + d] += scale * ds * k[ko(j) + d];
                        dk[ko(j) + d] += scale * ds * q[qo(i) + d];
                        dv[ko(j) + d] += pj * d_out[qo(i) + d];
                    }
                }
            }
        }
    }
    [out, dq, dk, dv]
}

fn tensor(x: &[f32], shape: [usize; 4]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(x.to_vec(), shape))
}

/// The bf16 attention (forward and backward) against [`reference`]: each result's largest
/// error at most `2^-7` of its largest magnitude. The probabilities and score gradients enter
/// their products rounded to bf16 (a relative error up to `2^-9` each, as in PyTorch's flash
/// attention for bf16), which the reference does not do; a missing scale or a wrong layout
/// moves results by their own magnitude. Both modes run where the CPU has AVX512-BF16 (the
/// words tiles, then the f32 tiles on rounded copies); elsewhere only the second, and the
/// test prints which ran. Head sizes 32, 64, 128 (the tiles) and 16 (`gemm`), partial tiles,
/// `s > t`, packed documents.
#[test]
fn bf16_attention_matches_the_reference_on_rounded_inputs() {
    println!("words tiles on this CPU: {}", tiles::words_available(128));
    let packed: Vec<u32> = [0u32; 30]
        .into_iter()
        .chain([30; 45])
        .chain([75; 25])
        .collect();
    for (dims, starts) in [
        ([1, 4, 2, 70, 70, 128], None),
        ([2, 2, 1, 37, 41, 64], None),
        ([1, 2, 2, 9, 9, 32], None),
        ([1, 2, 1, 100, 100, 128], Some(&packed[..])),
        ([1, 2, 1, 20, 23, 16], None),
    ] {
        let [b, hq, hkv, t, s, hd] = dims;
        let (qn, kn) = (b * hq * t * hd, b * hkv * s * hd);
        let (q, k, v, d_out) = (values(qn, 1), values(kn, 2), values(kn, 3), values(qn, 4));
        let scale = (hd as f32).powf(-0.5);
        let want = reference(dims, (&q, &k, &v, &d_out), f64::from(scale), starts);
        let (qt, kt, vt) = (
            tensor(&q, [b, hq, t, hd]),
            tensor(&k, [b, hkv, s, hd]),
            tensor(&v, [b, hkv, s, hd]),
        );
        // This CPU's mode for the head size, and the rounded copies where that is another.
        let mut modes = vec![Mode::of(Precision::Bf16, hd)];
        if modes[0] != (Mode::Bf16 { words: false }) {
            modes.push(Mode::Bf16 { words: false });
        }
        for &mode in &modes {
            let (out, lse) = forward(&qt, &kt, &vt, scale, starts, mode);
            let dt = tensor(&d_out, [b, hq, t, hd]);
            let (dq, dk, dv) = backward(&dt, &qt, &kt, &vt, &out, &lse, scale, starts, mode);
            for (name, got, want) in [
                ("out", &out, &want[0]),
                ("dq", &dq, &want[1]),
                ("dk", &dk, &want[2]),
                ("dv", &dv, &want[3]),
            ] {
                let got = got.storage::<f32>();
                let top = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                let err = got
                    .iter()
                    .zip(want)
                    .fold(0.0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs()));
                println!("{dims:?} {mode:?} {name}: error {err:.2e} of {top:.2e}");
                assert!(
                    err <= top / 128.0,
                    "{dims:?} {mode:?}: {name} off by {err} (largest {top})"
                );
            }
        }
    }
}

/// The public op at bf16 precision runs this CPU's mode: the same numbers as that mode called
/// directly, values and `q`'s gradient through autodiff; at f32 it differs from them.
#[test]
fn bf16_precision_reaches_the_kernel() {
    let device = burn::tensor::Device::flex().autodiff();
    let [b, hq, hkv, t, hd] = [1, 2, 1, 40, 64];
    let (q, k, v) = (
        values(b * hq * t * hd, 5),
        values(b * hkv * t * hd, 6),
        values(b * hkv * t * hd, 7),
    );
    let scale = (hd as f32).powf(-0.5);
    let mode = Mode::of(Precision::Bf16, hd);
    let (qt, kt, vt) = (
        tensor(&q, [b, hq, t, hd]),
        tensor(&k, [b, hkv, t, hd]),
        tensor(&v, [b, hkv, t, hd]),
    );
    let (out, lse) = forward(&qt, &kt, &vt, scale, None, mode);
    // The gradients of `out.sum()`: an upstream gradient of ones.
    let ones = tensor(&vec![1.0; b * hq * t * hd], [b, hq, t, hd]);
    let (dq, ..) = backward(&ones, &qt, &kt, &vt, &out, &lse, scale, None, mode);
    let (out, dq) = (out.storage::<f32>().to_vec(), dq.storage::<f32>().to_vec());
    let make = |x: &[f32], h: usize| {
        Tensor::<4>::from_data(TensorData::new(x.to_vec(), [b, h, t, hd]), &device).require_grad()
    };
    for (precision, same) in [(Precision::Bf16, true), (Precision::F32, false)] {
        let (qa, ka, va) = (make(&q, hq), make(&k, hkv), make(&v, hkv));
        let y = causal_attention(&qa, &ka, &va, scale, None, precision).expect("the kernel");
        let grads = y.clone().sum().backward();
        let got: Vec<f32> = y.into_data().try_to_vec::<f32>().expect("f32");
        let got_dq: Vec<f32> = qa
            .grad(&grads)
            .expect("dq")
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32");
        assert_eq!(got == out, same, "{precision:?} against {mode:?}: values");
        assert_eq!(got_dq == dq, same, "{precision:?} against {mode:?}: dq");
    }
}

/// The products on bf16 words against f64 on the bf16 values, within 1e-5 of the largest
/// result (the f32 sums' rounding; a wrong pair or layout is off by the result's own size):
/// the `hd`-column products (`a` by rows and by columns, odd reductions, row tails; `c += 0.7
/// a b` onto 0.5) on the words tiles where the CPU has them and on the bf16 products
/// elsewhere, and the score products (`scale a bt`, partial registers) on both sides' kinds.
#[test]
fn words_products_match_the_rounded_reference() {
    for hd in [32, 64, 128] {
        let words = tiles::words_available(hd);
        println!("hd {hd}: words tiles {words}");
        for (m, k, by_columns) in [(13, 37, false), (7, 64, true), (40, 5, false), (3, 9, true)] {
            let (a, b) = (values(m * k, 11), values(k * hd, 12));
            let (a_rs, a_cs) = if by_columns { (1, m) } else { (k, 1) };
            let want: Vec<f64> = (0..m * hd)
                .map(|x| {
                    let (i, d) = (x / hd, x % hd);
                    let dot: f64 = (0..k)
                        .map(|kk| bf16_of(a[i * a_rs + kk * a_cs]) * bf16_of(b[kk * hd + d]))
                        .sum();
                    0.5 + 0.7 * dot
                })
                .collect();
            let top = want.iter().fold(0.0f64, |t, x| t.max(x.abs()));
            for w in [words, false].into_iter().take(if words { 2 } else { 1 }) {
                let mut c = vec![0.5f32; m * hd];
                bf16::narrow(w, m, k, hd, (&a, a_rs, a_cs), &b, (&mut c, hd), true, 0.7);
                let err = c
                    .iter()
                    .zip(&want)
                    .fold(0.0f64, |e, (g, w)| e.max((f64::from(*g) - w).abs()));
                assert!(
                    err <= 1e-5 * top,
                    "hd {hd} m {m} k {k} by columns {by_columns} words {w}: off by {err} of {top}"
                );
            }
        }
        // Scores: `c = scale a bt` for `a: [m, hd]`, `bt` the transposed keys `[n, hd]`.
        let (m, n, ts) = (11, 37, 48);
        let (a, keys) = (values(m * hd, 13), values(n * hd, 14));
        let scale = 0.3f32;
        let want: Vec<f64> = (0..m * n)
            .map(|x| {
                let (i, j) = (x / n, x % n);
                let dot: f64 = (0..hd)
                    .map(|d| bf16_of(a[i * hd + d]) * bf16_of(keys[j * hd + d]))
                    .sum();
                f64::from(scale) * dot
            })
            .collect();
        let top = want.iter().fold(0.0f64, |t, x| t.max(x.abs()));
        let lim = vec![n as u32; m];
        for w in [words, false].into_iter().take(if words { 2 } else { 1 }) {
            let (rows, bt) = if w {
                let bt = bf16::transposed_words(&keys, n, hd, ts);
                (bf16::Held::Words(bf16::words(&a)), bf16::Held::Words(bt))
            } else {
                let mut bt = vec![0.0f32; hd * ts];
                for (j, row) in bf16::rounded(&keys).chunks_exact(hd).enumerate() {
                    row.iter()
                        .enumerate()
                        .for_each(|(d, x)| bt[d * ts + j] = *x);
                }
                (bf16::Held::F32(bf16::rounded(&a)), bf16::Held::F32(bt))
            };
            let mut c = vec![0.0f32; m * ts];
            let mut max = vec![f32::NEG_INFINITY; m];
            let epilogue = tiles::Epilogue::Max {
                scale,
                lim: &lim,
                max: &mut max,
            };
            bf16::scores(
                m,
                n,
                hd,
                rows.side(),
                (bt.side(), ts),
                (&mut c, ts),
                epilogue,
            );
            let err = (0..m * n).fold(0.0f64, |e, x| {
                e.max((f64::from(c[(x / n) * ts + x % n]) - want[x]).abs())
            });
            assert!(
                err <= 1e-5 * top,
                "hd {hd} scores, words {w}: off by {err} of {top}"
            );
        }
    }
}
