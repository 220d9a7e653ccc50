//! Muon's Newton–Schulz orthogonalisation of a matrix in one kernel.
//!
//! Burn's `Muon` runs each of the five quintic iterations as tensor operations: three matrix
//! products (one of them on a transposed view, which Flex copies first) and four element-wise
//! passes, each allocating. Here the iteration keeps three buffers and runs as PyTorch's
//! `torch.optim.Muon` writes it, with `addmm`: every product goes through `gemm` with the scale
//! of what the destination held folded in,
//!
//! ```text
//! X = G / max(||G||_F, eps)            (G transposed first if it has more rows than columns)
//! repeat: A = X X^T                    gemm, X^T read through strides
//!         B = b A + c A A              gemm into a copy of A
//!         X = a X + B X                gemm into a copy of X
//! ```
//!
//! so the only passes outside `gemm` are the normalisation and two copies per iteration. The
//! Frobenius norm is summed in f64. `crates/train/tests/muon.rs` compares whole Muon steps with
//! `torch.optim.Muon`; the kernel test below compares it with the composed iteration.

use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor, TensorData};

use super::mm::{Threads, mm, mm_scaled};
use super::{Elements, flex_training};

/// The iteration's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NewtonSchulz {
    /// The quintic coefficients `(a, b, c)`.
    pub coefficients: (f32, f32, f32),
    /// Iterations.
    pub steps: usize,
    /// Floor of the norm the input is divided by.
    pub epsilon: f32,
}

/// Backends with the fused Newton–Schulz iteration (Flex).
#[backend_extension(Flex)]
pub trait FusedNewtonSchulz: Backend {
    /// The orthogonalised `g` (same shape).
    fn newton_schulz(g: FloatTensor<Self>, ns: NewtonSchulz) -> FloatTensor<Self>;
}

impl FusedNewtonSchulz for Flex {
    fn newton_schulz(g: FloatTensor<Self>, ns: NewtonSchulz) -> FloatTensor<Self> {
        orthogonalise(&g, ns)
    }
}

/// Whether [`newton_schulz`] applies to `t`: f32 on Flex without autodiff, the kernels on.
pub fn fused_newton_schulz_applies<const D: usize>(t: &Tensor<D>) -> bool {
    flex_training(&t.device()) && !t.device().is_autodiff() && t.dtype() == DType::F32
}

/// `g` orthogonalised by the Newton–Schulz iteration on Flex in f32.
///
/// # Panics
/// Where the kernel does not apply ([`fused_newton_schulz_applies`]).
///
/// # Shapes
/// - `g`: `[rows, cols]`; the result has the same shape.
pub fn newton_schulz(g: Tensor<2>, ns: NewtonSchulz) -> Tensor<2> {
    assert!(
        fused_newton_schulz_applies(&g),
        "the fused Newton-Schulz kernel needs an f32 tensor on Flex"
    );
    Tensor::from_dispatch(<Dispatch as FusedNewtonSchulz>::newton_schulz(
        g.into_dispatch(),
        ns,
    ))
}

fn orthogonalise(g: &FlexTensor, ns: NewtonSchulz) -> FlexTensor {
    let dims = g.layout().shape().to_vec();
    let [rows, cols] = [dims[0], dims[1]];
    let elements = Elements::of(g);
    let src = elements.f32();
    // Work on the wide orientation, `[m, n]` with `m <= n`: the Gram matrix is then `[m, m]`.
    let tall = rows > cols;
    let (m, n) = if tall { (cols, rows) } else { (rows, cols) };
    let at = |i: usize, j: usize| {
        if tall {
            src[j * cols + i]
        } else {
            src[i * cols + j]
        }
    };
    let norm = (src
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt() as f32)
        .max(ns.epsilon);
    let mut x: Vec<f32> = (0..m * n).map(|e| at(e / n, e % n) / norm).collect();
    let (a, b, c) = ns.coefficients;
    let mut gram = vec![0f32; m * m];
    let mut poly = vec![0f32; m * m];
    let mut next = vec![0f32; m * n];
    for _ in 0..ns.steps {
        // A = X X^T
        mm(
            m,
            m,
            n,
            (&x, n, 1),
            (&x, 1, n),
            (&mut gram, m),
            false,
            Threads::All,
        );
        // B = b A + c A A
        poly.copy_from_slice(&gram);
        mm_scaled(
            m,
            m,
            m,
            (&gram, m, 1),
            (&gram, m, 1),
            (&mut poly, m),
            Some(b),
            c,
            Threads::All,
        );
        // X = a X + B X
        next.copy_from_slice(&x);
        mm_scaled(
            m,
            n,
            m,
            (&poly, m, 1),
            (&x, n, 1),
            (&mut next, n),
            Some(a),
            1.0,
            Threads::All,
        );
        std::mem::swap(&mut x, &mut next);
    }
    let out = if tall {
        // Back to `[rows, cols]` = X^T.
        let mut t = vec![0f32; rows * cols];
        for (i, row) in x.chunks_exact(n).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                t[j * cols + i] = v;
            }
        }
        t
    } else {
        x
    };
    FlexTensor::from_data(TensorData::new(out, [rows, cols]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    /// The iteration as Burn's `Muon` composes it (`zeropower_via_newtonschulz`).
    fn composed(g: Tensor<2>, ns: NewtonSchulz) -> Tensor<2> {
        let [rows, cols] = g.dims();
        let mut x = if rows > cols { g.transpose() } else { g };
        let norm = x
            .clone()
            .powf_scalar(2.0)
            .sum()
            .sqrt()
            .clamp_min(ns.epsilon)
            .unsqueeze();
        x = x.div(norm);
        let (a, b, c) = ns.coefficients;
        for _ in 0..ns.steps {
            let gram = x.clone().matmul(x.clone().transpose());
            let poly = gram.clone().mul_scalar(b) + gram.clone().matmul(gram).mul_scalar(c);
            x = x.clone().mul_scalar(a) + poly.matmul(x);
        }
        if rows > cols { x.transpose() } else { x }
    }

    #[test]
    fn fused_newton_schulz_equals_the_composed_iteration() {
        let device = Device::flex();
        let ns = NewtonSchulz {
            coefficients: (3.4445, -4.775, 2.0315),
            steps: 5,
            epsilon: 1e-7,
        };
        // Wide, tall, square, and a transposed (strided) input.
        for (rows, cols) in [(24, 80), (96, 40), (64, 64), (1, 7)] {
            let g = Tensor::<2>::random([rows, cols], Distribution::Normal(0.0, 0.3), &device);
            let want = composed(g.clone(), ns)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            let got = newton_schulz(g.clone(), ns)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            let worst = want
                .iter()
                .zip(&got)
                .map(|(w, g)| (w - g).abs())
                .fold(0f32, f32::max);
            assert!(worst < 2e-5, "[{rows}, {cols}]: max |diff| {worst}");
            // Orthogonalising the transpose gives the transposed result.
            let t = newton_schulz(g.transpose(), ns);
            let back = t.transpose().into_data().try_to_vec::<f32>().unwrap();
            let worst_t = back
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst_t < 2e-5, "transposed [{cols}, {rows}]: {worst_t}");
        }
    }
}
