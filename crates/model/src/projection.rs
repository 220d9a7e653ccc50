//! Linear projections, with LoRA adapters in factored form.
//!
//! Burn's `Param::val` on a LoRA-adapted weight materialises `W + s * (A @ B)`: every forward
//! then builds a `[d_in, d_out]` copy of the weight, and the backward computes the full weight
//! gradient of that copy before projecting it onto `A` and `B`, which costs as much as full
//! fine-tuning. [`project`] computes `x @ W + s * ((x @ A) @ B)` instead, like PEFT: the frozen
//! `W` gets no gradient (only `x`'s), and the adapters see only rank-`r` intermediates. On Flex,
//! over a bf16 base, the whole projection is one op ([`lora_projection`]): the adapter's share
//! is added into the frozen product's buffer, and its input gradient into the frozen one's.
//! Merging (`Module::materialize`) stays for export and inference.

use burn::nn::Linear;
use burn::tensor::module::linear;
use burn::tensor::{DType, Tensor};

use qwen_burn_kernels::{Precision, linear_rows, lora_projection, row_matmul};

pub(crate) use qwen_burn_kernels::widened;

/// `x @ W + b` of a Burn `Linear` (weight `[d_in, d_out]`), with an attached LoRA adapter
/// applied in factored form.
///
/// # Shapes
/// - `x`: `[..., d_in]` -> `[..., d_out]`
///
/// A single row (decoding one token) goes to [`row_matmul`], the multithreaded matrix-vector
/// kernel.
pub fn project<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    project_with(layer, x, true)
}

/// [`project`] without the matrix-vector kernel for a single row: the product then sums in the
/// order it takes for any number of rows. A MoE layer's experts use it when the forward holds
/// more than one token (an expert that gets one token of many), so that a token's output does
/// not depend on how many others share its expert (issue 40, L1).
pub fn project_batched<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    project_with(layer, x, false)
}

fn project_with<const D: usize>(layer: &Linear, x: Tensor<D>, matvec: bool) -> Tensor<D> {
    let bias = layer.bias.as_ref().map(|b| b.val());
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    match layer.weight.adapter() {
        None if rows == 1 && matvec => {
            let k = dims[D - 1];
            let y = plus_bias(row_matmul(x.reshape([1, k]), layer.weight.val()), bias);
            let mut out = dims;
            out[D - 1] = y.dims()[1];
            y.reshape(out)
        }
        None => matmul(x, layer.weight.val(), bias),
        Some(adapter) => {
            let (w, a, b) = (layer.weight.base(), adapter.a.val(), adapter.b.val());
            match lora_projection(&x, &w, &a, &b, adapter.scale as f32) {
                Some(y) => plus_bias(y, bias),
                None => {
                    // The scale goes on the rank-r intermediate, the smallest tensor of the
                    // three.
                    let low = matmul(x.clone(), a, None).mul_scalar(adapter.scale);
                    matmul(x, w, bias) + matmul(low, b, None)
                }
            }
        }
    }
}

/// The precision of the products that read `layer`'s outputs (the attention's): bf16 where the
/// layer's stored (frozen) weight is bf16, as a bf16 model computes in PEFT and HF, else this
/// thread's ([`qwen_burn_kernels::precision`]).
pub(crate) fn products_precision(layer: &Linear) -> Precision {
    if layer.weight.base().dtype() == DType::BF16 {
        Precision::Bf16
    } else {
        qwen_burn_kernels::precision()
    }
}

/// `x @ w + b`: the fused projection kernel on Flex ([`linear_rows`], which reads a frozen bf16
/// `w` as it is stored), Burn's `linear` on `w` in f32 elsewhere.
fn matmul<const D: usize>(x: Tensor<D>, w: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<D> {
    match linear_rows(&x, &w) {
        Some(y) => plus_bias(y, bias),
        None => linear(x, widened(w), bias),
    }
}

/// `y + b` over the last axis, when there is a bias.
fn plus_bias<const D: usize>(y: Tensor<D>, bias: Option<Tensor<1>>) -> Tensor<D> {
    match bias {
        Some(b) => y + b.unsqueeze(),
        None => y,
    }
}
