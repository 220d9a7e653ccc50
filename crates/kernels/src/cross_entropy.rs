//! Softmax cross-entropy over the vocabulary, one pass per row.
//!
//! The composed loss (`qwen_burn_model::loss`, [`cross_entropy_sum_reference`]) forms the max, `exp`, the row sums, the probabilities and a
//! one-hot matrix as separate `[n, vocab]` tensors, each a pass over memory with glibc's scalar
//! `expf`. This kernel handles one row per task (rows over rayon's threads): the max, then
//! `e = exp(z - max)` written straight into the gradient coefficient with the vectorised
//! [`exp_f32`](super::exp::exp_f32) while summing, then the same buffer scaled in place to
//! `softmax - one_hot`. The row (600 KB for Qwen3's vocabulary) stays in cache between the passes.
//! The probabilities are never materialised twice.

use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Int, Tensor, TensorData};
use rayon::prelude::*;

use super::exp::exp_f32;
use super::int_values;

/// Backends with a fused cross-entropy kernel (Flex).
#[backend_extension(Flex)]
pub trait CrossEntropyRows: Backend {
    /// Per row of `z: [n, v]` with target `y: [n]` (negative = ignored): the negative
    /// log-likelihood `[n]` (0 where ignored) and, if `coefficient`, `softmax(z) - one_hot(y)`
    /// `[n, v]` (zero rows where ignored); else an empty `[0, v]` tensor.
    fn cross_entropy_rows(
        z: FloatTensor<Self>,
        y: IntTensor<Self>,
        coefficient: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

impl CrossEntropyRows for Flex {
    fn cross_entropy_rows(
        z: FloatTensor<Self>,
        y: IntTensor<Self>,
        coefficient: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        flex_cross_entropy_rows(&z, &y, coefficient)
    }
}

/// [`CrossEntropyRows::cross_entropy_rows`] on Flex with f32 logits (autodiff or not: the inputs
/// are used as constants); `None` on other devices, for the composed path.
///
/// # Shapes
/// - `z`: `[n, v]`, `y`: `[n]` -> nll `[n]`, coefficient `[n, v]`
pub fn cross_entropy_rows(
    z: &Tensor<2>,
    y: &Tensor<1, Int>,
    coefficient: bool,
) -> Option<(Tensor<1>, Option<Tensor<2>>)> {
    if !super::flex_training(&z.device()) || z.dtype() != DType::F32 {
        return None;
    }
    let z = z.clone().inner();
    let y = y.clone().inner();
    let (nll, c) = <Dispatch as CrossEntropyRows>::cross_entropy_rows(
        z.into_dispatch(),
        y.into_dispatch(),
        coefficient,
    );
    let nll = Tensor::<1>::from_dispatch(nll);
    Some((nll, coefficient.then(|| Tensor::<2>::from_dispatch(c))))
}

fn flex_cross_entropy_rows(z: &FlexTensor, y: &FlexTensor, want: bool) -> (FlexTensor, FlexTensor) {
    let z = if z.is_contiguous() && z.layout().start_offset() == 0 {
        z.clone()
    } else {
        z.to_contiguous()
    };
    let shape = z.layout().shape().clone();
    let (n, v) = (shape[0], shape[1]);
    let zd = z.storage::<f32>();
    let targets = int_values(y);
    let mut nll = vec![0.0f32; n];
    let mut coef = vec![0.0f32; if want { n * v } else { 0 }];
    if want {
        nll.par_iter_mut()
            .zip(coef.par_chunks_mut(v))
            .enumerate()
            .for_each(|(i, (l, c))| {
                c.copy_from_slice(&zd[i * v..(i + 1) * v]);
                *l = row_loss(c, targets[i], true);
            });
    } else {
        nll.par_iter_mut().enumerate().for_each(|(i, l)| {
            let mut row = zd[i * v..(i + 1) * v].to_vec();
            *l = row_loss(&mut row, targets[i], false);
        });
    }
    let nll = FlexTensor::from_data(TensorData::new(nll, [n]));
    let coef = FlexTensor::from_data(TensorData::new(coef, [if want { n } else { 0 }, v]));
    (nll, coef)
}

simd_dispatch! {
    /// One row's NLL; with `coefficient`, `z` is overwritten with `softmax(z) - one_hot(target)`
    /// (zeros for an ignored row). `z` is read from and written to cache-resident memory: the max,
    /// then `exp(z - max)` stored in place while summing, then the in-place scale.
    pub(super) fn row_loss(z: &mut [f32], target: i64, coefficient: bool) -> f32
        = row_loss_generic
}

const LANES: usize = 16;

#[inline(always)]
fn row_loss_generic(z: &mut [f32], target: i64, coefficient: bool) -> f32 {
    if target < 0 {
        if coefficient {
            z.iter_mut().for_each(|x| *x = 0.0);
        }
        return 0.0;
    }
    // Max over 16 independent lanes (vectorises), then the tail.
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = z.chunks_exact(LANES);
    let tail = chunks.remainder();
    for ch in chunks {
        for l in 0..LANES {
            lanes[l] = lanes[l].max(ch[l]);
        }
    }
    let max = tail.iter().copied().fold(
        lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        f32::max,
    );
    let t = target as usize;
    let z_target = z[t];
    // Sum of exp(z - max) in f32 lanes; with `coefficient` the exps replace the logits.
    let mut sums = [0.0f32; LANES];
    let tail_start = z.len() - z.len() % LANES;
    if coefficient {
        for zs in z.chunks_exact_mut(LANES) {
            for l in 0..LANES {
                let e = exp_f32(zs[l] - max);
                zs[l] = e;
                sums[l] += e;
            }
        }
        for x in &mut z[tail_start..] {
            let e = exp_f32(*x - max);
            *x = e;
            sums[0] += e;
        }
    } else {
        for zs in z.chunks_exact(LANES) {
            for l in 0..LANES {
                sums[l] += exp_f32(zs[l] - max);
            }
        }
        sums[0] += z[tail_start..]
            .iter()
            .map(|&x| exp_f32(x - max))
            .sum::<f32>();
    }
    let sum: f32 = sums.iter().sum();
    if coefficient {
        let inv = 1.0 / sum;
        z.iter_mut().for_each(|x| *x *= inv);
        z[t] -= 1.0;
    }
    max + sum.ln() - z_target
}

/// The textbook formulation, `-sum(burn::tensor::activation::log_softmax(z)[target])`, for tests and benchmarks.
///
/// # Shapes
/// - `logits`: `[b, t, vocab]`, `targets`: `[b, t]` -> `[1]`
pub fn cross_entropy_sum_reference(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let targets = targets.reshape([b * t]);
    let valid = targets.clone().greater_equal_elem(0).float(); // [n]
    let safe = targets.clamp_min(0).reshape([b * t, 1]);
    let logp = burn::tensor::activation::log_softmax(logits.reshape([b * t, v]), 1);
    let nll = logp.gather(1, safe).reshape([b * t]).neg();
    (nll * valid).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{Device, Distribution};

    /// Against log_softmax (NLL) and softmax - one_hot (coefficient), with ignored rows.
    #[test]
    fn rows_match_the_composed_softmax() {
        let device = Device::flex();
        for (n, v, std) in [
            (5, 11, 3.0),
            (4, 1000, 1.0),
            (3, 151_936, 2.0),
            (2, 37, 40.0),
        ] {
            let z = Tensor::<2>::random([n, v], Distribution::Normal(0.0, std), &device);
            let targets: Vec<i64> = (0..n as i64)
                .map(|i| if i == 1 { -100 } else { (i * 7919) % v as i64 })
                .collect();
            let y = Tensor::<1, Int>::from_data(TensorData::new(targets.clone(), [n]), &device);
            let (nll, c) = cross_entropy_rows(&z, &y, true).expect("flex takes the kernel");
            let c = c.unwrap();
            let logp = log_softmax(z.clone(), 1);
            let probs = logp.clone().exp();
            let nll = nll.into_data().try_to_vec::<f32>().unwrap();
            let c_rows = c.clone().into_data().try_to_vec::<f32>().unwrap();
            let p_rows = probs.into_data().try_to_vec::<f32>().unwrap();
            let lp = logp.into_data().try_to_vec::<f32>().unwrap();
            for (i, &t) in targets.iter().enumerate() {
                if t < 0 {
                    assert_eq!(nll[i], 0.0);
                    assert!(c_rows[i * v..(i + 1) * v].iter().all(|&x| x == 0.0));
                    continue;
                }
                let want = -lp[i * v + t as usize];
                // Both sides sum `v` exponentials in f32, in different orders: their log-sums
                // may differ by about `eps * sqrt(v)` (random inputs, so the bound holds with
                // a margin, not by one draw).
                let order = 4.0 * f32::EPSILON * (v as f32).sqrt();
                assert!(
                    (nll[i] - want).abs() <= 2e-6 * want.abs().max(1.0) + order,
                    "n={n} v={v} row {i}: nll {} vs {want}",
                    nll[i]
                );
                for j in 0..v {
                    let expected = p_rows[i * v + j] - if j == t as usize { 1.0 } else { 0.0 };
                    let got = c_rows[i * v + j];
                    assert!(
                        (got - expected).abs() <= 1e-6,
                        "n={n} v={v} ({i}, {j}): {got} vs {expected}"
                    );
                }
            }
            // Without the coefficient: the same NLL (the two paths order the tail of a row's
            // sum differently, so the last bit may differ on some draws).
            let (nll2, none) = cross_entropy_rows(&z, &y, false).unwrap();
            assert!(none.is_none());
            let nll2 = nll2.into_data().try_to_vec::<f32>().unwrap();
            for (a, b) in nll2.iter().zip(&nll) {
                assert!((a - b).abs() <= 2e-6 * b.abs().max(1.0), "{a} vs {b}");
            }
        }
    }
}
