//! The CPU fast path of qwen-burn's named operations: fused Flex kernels through Burn's backend
//! extensions (`#[backend_extension]`), each with a hand-written backward where it trains.
//!
//! The model crate calls these by name (attention, projection, norm, loss...) and falls back to
//! composed Burn ops where a kernel does not apply (another device, another dtype, the switch
//! off); the train crate calls the optimizer kernels. This crate depends on Burn only.
//!
//! Each operation has a default body composed of standard tensor ops (the reference, and what
//! every backend without a hand-written kernel runs) and a Flex kernel written in Rust.
//!
//! - [`row_matmul`]: `x @ w` for a single row `x`, the matrix-vector product of decoding.
//! - [`decode_attention`]: one query position over the KV cache buffers, in place.
//! - [`cross_entropy_rows`]: softmax cross-entropy and its gradient coefficient, one pass per row.
//! - [`linear_rows`]: the projections `x @ W`, one flattened product each way, transposes read
//!   through strides.
//! - [`linear_cross_entropy`]: the LM head and that loss fused, in row chunks, with both
//!   gradients (no `[n, vocab]` tensor).
//! - [`moe_experts`]: a MoE layer's gather, expert SwiGLU products and weighted scatter as one
//!   graph node, experts spread over the threads.
//! - [`causal_attention`] (flash-style, GQA without copies), [`rms_norm`], [`swiglu`],
//!   [`rope`]: training ops with a hand-written backward (Autodiff over Flex).
//! - [`adamw_update`]: one AdamW update of a parameter in one in-place pass, bit-identical to
//!   Burn's `AdamW`.
//! - [`newton_schulz`]: Muon's orthogonalisation, its matrix products with `addmm`'s scaling
//!   folded into `gemm`.
//! - [`exp::exp_f32`]: the vectorisable `exp` these kernels use.

/// `fn $name(args) -> R` that runs the `#[inline(always)]` function `$generic` compiled for
/// AVX-512, or AVX2 + FMA, when the CPU has them (detected at run time), else as built. The
/// kernels' loops are written plainly (lane arrays for reductions) so that each instance
/// vectorises for its features.
macro_rules! simd_dispatch {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $generic:ident
    ) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $generic($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $generic($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the feature was detected at run time.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the features were detected at run time.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $generic($($arg),*)
        }
    };
}

mod adamw;
mod attention;
mod bf16;
mod cross_entropy;
mod decode_attention;
pub mod exp;
mod linear;
mod linear_cross_entropy;
mod lora;
mod matvec;
mod mm;
mod moe_experts;
mod newton_schulz;
mod products;
mod rms_norm;
mod rope;
mod swiglu;

pub use adamw::{AdamWInputs, AdamWStep, adamw_update};
pub use attention::causal_attention;
#[doc(hidden)]
pub use bf16::{AmxWalk, set_amx_walk, set_task_packing};
pub use bf16::{
    BF16_KERNEL_VAR, Bf16KernelError, PackedWeights, Path as Bf16Path, bf16_path, chosen_bf16_path,
    detected_bf16_path, keep_packed_weights,
};
pub use cross_entropy::{cross_entropy_rows, cross_entropy_sum_reference};
pub use linear::{linear_rows, linear_rows_transposed};
pub use linear_cross_entropy::linear_cross_entropy;
pub use lora::lora_projection;
pub use moe_experts::moe_experts;
pub use newton_schulz::{NewtonSchulz, fused_newton_schulz_applies, newton_schulz};
pub use products::Precision;
pub use rms_norm::rms_norm;
pub use rope::rope;
pub use swiglu::swiglu;

use std::cell::Cell;
use std::sync::OnceLock;

thread_local! {
    /// The switch of the run on this thread, while [`with_fused_kernels`] holds one.
    static FUSED_HERE: Cell<Option<bool>> = const { Cell::new(None) };
    /// The precision of the fused products on this thread ([`with_precision`]).
    static PRECISION_HERE: Cell<Precision> = const { Cell::new(Precision::F32) };
}

/// The precision of the fused kernels' matrix products on this thread: the projections (values
/// and both gradients), the LM head with its loss, and the MoE experts. The attention tiles,
/// norms, losses, reductions and optimizer updates stay in f32 whatever it is. A product with a
/// bf16 weight (a frozen LoRA base, `--dtype bf16`) runs in bf16 on a CPU with the bf16 kernel
/// ([`bf16_path`]) at either precision.
pub fn precision() -> Precision {
    PRECISION_HERE.with(Cell::get)
}

/// Run `f` with the fused kernels on or off and their products at `precision` on this thread
/// ([`with_fused_kernels`] and [`with_precision`]).
pub fn with_kernels<R>(fused: bool, precision: Precision, f: impl FnOnce() -> R) -> R {
    with_fused_kernels(fused, || with_precision(precision, f))
}

/// Run `f` with the fused products at `precision` on this thread, then restore what was there
/// (as [`with_fused_kernels`]: a thread that `f` starts and that runs model code takes the
/// setting with it).
pub fn with_precision<R>(precision: Precision, f: impl FnOnce() -> R) -> R {
    struct Restore(Precision);
    impl Drop for Restore {
        fn drop(&mut self) {
            PRECISION_HERE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(PRECISION_HERE.with(|c| c.replace(precision)));
    f()
}

/// Whether the fused kernels run on this thread. Off, every op here takes the composed Burn path
/// it replaces. A run (`training.fused_kernels`) or a benchmark sets it for its own thread with
/// [`with_fused_kernels`]; elsewhere the environment decides for the process
/// (`QWEN_BURN_FUSED_KERNELS=0` turns them off), default on.
pub fn fused_kernels() -> bool {
    FUSED_HERE
        .with(Cell::get)
        .unwrap_or_else(fused_kernels_by_environment)
}

/// The process's default: off when `QWEN_BURN_FUSED_KERNELS=0`, else on.
pub fn fused_kernels_by_environment() -> bool {
    static FROM_ENV: OnceLock<bool> = OnceLock::new();
    *FROM_ENV.get_or_init(|| std::env::var("QWEN_BURN_FUSED_KERNELS").map_or(true, |v| v != "0"))
}

/// Run `f` with the fused kernels on or off on this thread, then restore what was there: two
/// runs in one process (tests, a sweep driver) each keep their own setting. A thread that `f`
/// starts and that runs model code takes the setting with it ([`with_fused_kernels`] again, as
/// the data-parallel replicas do). Work stolen by a waiting rayon worker runs nested inside this
/// call and restores the setting before it returns, so the scopes stay well nested.
pub fn with_fused_kernels<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FUSED_HERE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FUSED_HERE.with(|c| c.replace(Some(on))));
    f()
}
pub use decode_attention::decode_attention;
pub use matvec::row_matmul;

/// `w` in f32: weights stored in bf16 (frozen LoRA bases, bf16 inference) are widened where a
/// composed product needs f32 operands.
pub fn widened<const D: usize>(w: burn::tensor::Tensor<D>) -> burn::tensor::Tensor<D> {
    if w.dtype() == burn::tensor::DType::F32 {
        w
    } else {
        w.cast(burn::tensor::DType::F32)
    }
}

/// FLOP/s of a bf16 product `[n, n] @ [n, n]` (f32 operands rounded while packed, as mixed
/// precision runs them) on this CPU's bf16 kernel, the best of `repeats`: the peak that MFU of
/// bf16 products is against. `None` where the CPU has no bf16 kernel ([`bf16_path`]).
pub fn bf16_peak_flops(n: usize, repeats: usize) -> Option<f64> {
    use bf16::{Operand, mm_bf16};
    if !bf16_path().has_kernel() || n == 0 {
        return None;
    }
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i % 251) as f32 - 125.0) / 125.0)
        .collect();
    let mut c = vec![0.0f32; n * n];
    let mut best = f64::MAX;
    for _ in 0..repeats.max(1) + 1 {
        let start = std::time::Instant::now();
        let (x, w) = (Operand::F32(&a, n, 1), Operand::F32(&a, 1, n));
        mm_bf16(n, n, n, x, w, (&mut c, n), false, mm::Threads::All);
        best = best.min(start.elapsed().as_secs_f64());
    }
    Some(2.0 * (n as f64).powi(3) / best)
}

/// Run `f` on a thread of rayon's pool (at once if this already is one).
///
/// Flex's matmuls and the kernels here split their work with rayon. Called from a thread outside
/// the pool, each parallel call queues its work, wakes the workers and puts the caller to sleep
/// until they finish; from inside the pool the calling thread does its share and only the other
/// workers are woken. A decoding step makes about 200 such calls per token (Qwen3-0.6B), a
/// training step thousands, so the hand-offs add up (`benches/README.md`).
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::join(f, || ()).0
}

/// Whether the fused training kernels apply to tensors on `device`: Flex, with or without
/// autodiff, and the switch on.
pub fn flex_training(device: &burn::tensor::Device) -> bool {
    use burn::backend::DispatchDevice;
    let flex = match device.as_dispatch() {
        DispatchDevice::Flex(_) => true,
        DispatchDevice::Autodiff(inner) => {
            matches!(inner.clone().inner(), DispatchDevice::Flex(_))
        }
        _ => false,
    };
    flex && fused_kernels()
}

/// Whether the fused inference kernels apply to tensors on `device`: plain Flex (no autodiff)
/// and the switch on.
pub(crate) fn flex_inference(device: &burn::tensor::Device) -> bool {
    matches!(device.as_dispatch(), burn::backend::DispatchDevice::Flex(_)) && fused_kernels()
}

/// `t` contiguous from offset 0 (a cheap clone when it already is).
pub(crate) fn dense(t: &burn::backend::flex::FlexTensor) -> burn::backend::flex::FlexTensor {
    if t.is_contiguous() && t.layout().start_offset() == 0 {
        t.clone()
    } else {
        t.to_contiguous()
    }
}

/// A tensor's elements in row-major order as one slice: a view of its buffer when it is
/// contiguous at any offset (a `narrow` along the first axis, say), else of a contiguous copy.
pub(crate) struct Elements {
    tensor: burn::backend::flex::FlexTensor,
    range: std::ops::Range<usize>,
    /// Whether `tensor` is a copy made here (not worth keeping packed: the next call makes
    /// another).
    copied: bool,
}

impl Elements {
    pub(crate) fn of(t: &burn::backend::flex::FlexTensor) -> Self {
        let copied = !t.is_contiguous();
        let tensor = if copied { t.to_contiguous() } else { t.clone() };
        let start = tensor.layout().start_offset();
        let range = start..start + tensor.layout().num_elements();
        Self {
            tensor,
            range,
            copied,
        }
    }

    /// The f32 elements.
    pub(crate) fn f32(&self) -> &[f32] {
        &self.tensor.storage::<f32>()[self.range.clone()]
    }

    /// The elements of an f32 or bf16 weight.
    pub(crate) fn matrix(&self) -> products::Matrix<'_> {
        match self.tensor.dtype() {
            burn::tensor::DType::BF16 => {
                let w = &self.tensor.storage::<half::bf16>()[self.range.clone()];
                if !self.copied {
                    bf16::retain(&self.tensor, w);
                }
                products::Matrix::Bf16(w)
            }
            _ => products::Matrix::F32(self.f32()),
        }
    }
}

/// The values of an Int tensor (i64 or i32 here: targets, expert ids) as i64.
pub(crate) fn int_values(t: &burn::backend::flex::FlexTensor) -> Vec<i64> {
    let t = t.to_contiguous();
    match t.dtype() {
        burn::tensor::DType::I64 => t.storage::<i64>().to_vec(),
        burn::tensor::DType::I32 => t.storage::<i32>().iter().map(|&v| i64::from(v)).collect(),
        other => panic!("integer tensor expected (i64 or i32), got {other:?}"),
    }
}
