//! Batch-1 matrix-vector products for decoding.
//!
//! Decoding one token reads every weight once, so it is bound by memory bandwidth. Flex's
//! matmul hands `[1, k] @ [k, n]` to the `gemm` crate, which runs it on one thread: about 55% of
//! what this machine's memory delivers to two (benches/README.md). This kernel spreads the
//! weight over rayon's threads and streams it once:
//! - `w` row-major `[k, n]` (a Linear weight): each thread takes a contiguous block of rows and
//!   accumulates `x[i] * w[i, ..]` (four rows at a time) into its own partial output; the
//!   partials are added;
//! - `w` a transposed view of a row-major `[n, k]` (the tied LM head, `embed^T`): the outputs are
//!   split over the threads, one dot product each over a contiguous row.
//!
//! Weights may be f32 or bf16 (`Qwen3ForCausalLM::with_bf16_weights`: half the bytes to read,
//! widened to f32 in registers). Any other shape, layout or dtype goes to the backend's matmul.

use burn::backend::flex::FlexTensor;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor, TensorData, bf16};
use rayon::prelude::*;

/// Backends that can run [`row_matmul`]: only Flex has a kernel; [`row_matmul`] sends every
/// other device to the standard matmul before dispatching.
#[backend_extension(Flex)]
pub trait RowMatmul: Backend {
    /// `x @ w`, `x: [1, k]`, `w: [k, n]` -> `[1, n]`.
    fn row_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(x, w)
    }
}

impl RowMatmul for Flex {
    fn row_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match flex_row_matmul(&x, &w) {
            Some(out) => out,
            None => {
                let w = if w.dtype() == DType::F32 {
                    w
                } else {
                    Self::float_cast(w, burn::tensor::FloatDType::F32)
                };
                Self::float_matmul(x, w)
            }
        }
    }
}

/// `x @ w` for `x: [1, k]` and `w: [k, n]`. On plain Flex (no autodiff), with f32 operands, the
/// multithreaded kernel of this module; elsewhere the backend's matmul.
pub fn row_matmul(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    if !super::flex_inference(&x.device()) || x.dims()[0] != 1 || x.dtype() != DType::F32 {
        return x.matmul(crate::widened(w));
    }
    Tensor::from_dispatch(<Dispatch as RowMatmul>::row_matmul(
        x.into_dispatch(),
        w.into_dispatch(),
    ))
}

/// Outputs per task in the dot-product layout (a small head stays on one thread).
const MIN_COLUMNS_PER_TASK: usize = 256;

fn flex_row_matmul(x: &FlexTensor, w: &FlexTensor) -> Option<FlexTensor> {
    if x.dtype() != DType::F32 {
        return None;
    }
    match w.dtype() {
        DType::F32 => row_matmul_typed::<f32>(x, w),
        DType::BF16 => row_matmul_typed::<bf16>(x, w),
        _ => None,
    }
}

/// A weight element the kernels read: f32, or bf16 widened on the fly (its bits are the high
/// half of an f32).
trait Weight: Copy + Send + Sync + burn::backend::Element + bytemuck::Pod {
    /// Whether the input is rounded to bf16 first: a bf16 weight makes a bf16 product (as
    /// prefill's, `mm::bf16`), f32 accumulation.
    const BF16_PRODUCT: bool;
    fn f32(self) -> f32;
}

impl Weight for f32 {
    const BF16_PRODUCT: bool = false;
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

impl Weight for bf16 {
    const BF16_PRODUCT: bool = true;
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

fn row_matmul_typed<W: Weight>(x: &FlexTensor, w: &FlexTensor) -> Option<FlexTensor> {
    let (xs, ws) = (x.layout().shape(), w.layout().shape());
    if xs.num_dims() != 2 || ws.num_dims() != 2 || xs[0] != 1 || xs[1] != ws[0] {
        return None;
    }
    let (k, n) = (ws[0], ws[1]);
    let (x_start, x_end) = x.layout().contiguous_offsets()?;
    let xv = &x.storage::<f32>()[x_start..x_end];
    let rounded: Vec<f32>;
    let xv = if W::BF16_PRODUCT {
        let bits = |v: f32| u32::from(crate::bf16::round_bits(v)) << 16;
        rounded = xv.iter().map(|&v| f32::from_bits(bits(v))).collect();
        &rounded[..]
    } else {
        xv
    };
    let data = w.storage::<W>();
    let offset = w.layout().start_offset();
    let strides = w.layout().strides();
    let mut out = vec![0.0f32; n];
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads).max(MIN_COLUMNS_PER_TASK).min(n.max(1));
    if strides == [n as isize, 1] {
        // Split the rows: each thread streams one contiguous block of the weight into its own
        // partial sums (one sequential stream per thread, which the hardware prefetchers follow
        // across pages), then the partials are added.
        let w = &data[offset..offset + k * n];
        let rows = k.div_ceil(threads).max(1);
        let partials: Vec<Vec<f32>> = (0..k.div_ceil(rows))
            .into_par_iter()
            .map(|c| {
                let (r0, r1) = (c * rows, ((c + 1) * rows).min(k));
                let mut part = vec![0.0f32; n];
                axpy_rows(&xv[r0..r1], &w[r0 * n..r1 * n], n, 0, &mut part);
                part
            })
            .collect();
        for part in &partials {
            for (o, p) in out.iter_mut().zip(part) {
                *o += p;
            }
        }
    } else if strides == [1, k as isize] {
        let w = &data[offset..offset + k * n];
        out.par_chunks_mut(chunk).enumerate().for_each(|(c, o)| {
            for (j, y) in o.iter_mut().enumerate() {
                let row = c * chunk + j;
                *y = dot(xv, &w[row * k..(row + 1) * k]);
            }
        });
    } else {
        return None;
    }
    Some(FlexTensor::from_data(TensorData::new(out, [1, n])))
}

/// `out[j] = sum_i x[i] * w[i, col0 + j]` for a row-major `w` with `n` columns.
fn axpy_rows<W: Weight>(x: &[f32], w: &[W], n: usize, col0: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected at run time.
            return unsafe { axpy_rows_avx512(x, w, n, col0, out) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were detected at run time.
            return unsafe { axpy_rows_avx2(x, w, n, col0, out) };
        }
    }
    axpy_rows_generic(x, w, n, col0, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_rows_avx512<W: Weight>(x: &[f32], w: &[W], n: usize, col0: usize, out: &mut [f32]) {
    axpy_rows_generic(x, w, n, col0, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_rows_avx2<W: Weight>(x: &[f32], w: &[W], n: usize, col0: usize, out: &mut [f32]) {
    axpy_rows_generic(x, w, n, col0, out)
}

/// Four rows per pass, so `out` is loaded and stored once per four weight rows; the inner loops
/// are plain slices, which the compiler vectorises for the enabled target features.
#[inline(always)]
fn axpy_rows_generic<W: Weight>(x: &[f32], w: &[W], n: usize, col0: usize, out: &mut [f32]) {
    let len = out.len();
    let row = |i: usize| &w[i * n + col0..i * n + col0 + len];
    let k = x.len();
    let mut i = 0;
    while i + 4 <= k {
        let (a0, a1, a2, a3) = (x[i], x[i + 1], x[i + 2], x[i + 3]);
        let (r0, r1, r2, r3) = (row(i), row(i + 1), row(i + 2), row(i + 3));
        for j in 0..len {
            out[j] += a0 * r0[j].f32() + a1 * r1[j].f32() + a2 * r2[j].f32() + a3 * r3[j].f32();
        }
        i += 4;
    }
    while i < k {
        let (a, r) = (x[i], row(i));
        for j in 0..len {
            out[j] += a * r[j].f32();
        }
        i += 1;
    }
}

/// `sum_i a[i] * b[i]`.
fn dot<W: Weight>(a: &[f32], b: &[W]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected at run time.
            return unsafe { dot_avx512(a, b) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were detected at run time.
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_generic(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512<W: Weight>(a: &[f32], b: &[W]) -> f32 {
    dot_generic(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<W: Weight>(a: &[f32], b: &[W]) -> f32 {
    dot_generic(a, b)
}

/// Sixteen independent partial sums (a reassociated sum, so the compiler may vectorise it).
#[inline(always)]
fn dot_generic<W: Weight>(a: &[f32], b: &[W]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y.f32())
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l].f32();
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    /// The kernel against the backend's matmul: both layouts, odd sizes, and the fallbacks.
    #[test]
    fn row_matmul_matches_matmul() {
        #[allow(deprecated)]
        for device in [Device::flex(), Device::ndarray()] {
            for (k, n) in [(1, 1), (3, 5), (64, 300), (1024, 3072), (1027, 2049)] {
                let x = Tensor::<2>::random([1, k], Distribution::Normal(0.0, 1.0), &device);
                let w = Tensor::<2>::random([k, n], Distribution::Normal(0.0, 1.0), &device);
                let wt = Tensor::<2>::random([n, k], Distribution::Normal(0.0, 1.0), &device);
                for w in [w, wt.transpose()] {
                    let expected = x.clone().matmul(w.clone());
                    let got = row_matmul(x.clone(), w);
                    assert_eq!(got.dims(), [1, n]);
                    let diff = (got - expected).abs().max().into_scalar::<f32>();
                    // Sums of k products of unit normals: float rounding grows like sqrt(k).
                    let tol = 1e-5 * (k as f32).sqrt() * 4.0;
                    assert!(diff <= tol, "k={k} n={n}: max abs diff {diff} > {tol}");
                }
            }
        }
    }

    /// bf16 weights against the f32 matmul of the same (rounded) weights.
    #[test]
    fn bf16_weights_match_the_widened_matmul() {
        let device = Device::flex();
        for (k, n) in [(3, 5), (1024, 3072), (1027, 2049)] {
            let x = Tensor::<2>::random([1, k], Distribution::Normal(0.0, 1.0), &device);
            let w = Tensor::<2>::random([k, n], Distribution::Normal(0.0, 1.0), &device)
                .cast(DType::BF16);
            let wt = Tensor::<2>::random([n, k], Distribution::Normal(0.0, 1.0), &device)
                .cast(DType::BF16);
            // A bf16 product: the input rounded to bf16 as well.
            let xr = x.clone().cast(DType::BF16).cast(DType::F32);
            for w in [w, wt.transpose()] {
                let expected = xr.clone().matmul(w.clone().cast(DType::F32));
                let got = row_matmul(x.clone(), w);
                assert_eq!(got.dtype(), DType::F32);
                let diff = (got - expected).abs().max().into_scalar::<f32>();
                let tol = 1e-5 * (k as f32).sqrt() * 4.0;
                assert!(diff <= tol, "k={k} n={n}: max abs diff {diff} > {tol}");
            }
        }
    }

    /// A strided weight (neither layout) and autodiff devices take the matmul path.
    #[test]
    fn other_layouts_and_autodiff_fall_back() {
        let device = Device::flex();
        let x = Tensor::<2>::random([1, 8], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<2>::random([8, 20], Distribution::Normal(0.0, 1.0), &device);
        let strided = w.clone().slice([0..8, 0..20]).narrow(1, 2, 10);
        let diff = (row_matmul(x.clone(), strided.clone()) - x.clone().matmul(strided))
            .abs()
            .max()
            .into_scalar::<f32>();
        assert!(diff < 1e-5);
        let ad = Device::flex().autodiff();
        let xa = Tensor::<2>::random([1, 8], Distribution::Normal(0.0, 1.0), &ad).require_grad();
        let wa = Tensor::<2>::random([8, 4], Distribution::Normal(0.0, 1.0), &ad);
        let grads = row_matmul(xa.clone(), wa).sum().backward();
        assert!(xa.grad(&grads).is_some());
    }
}
