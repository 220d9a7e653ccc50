//! RMSNorm with HF Qwen3 semantics.

use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{DType, Device, Tensor};

/// Root-mean-square norm over the last dimension: `x * rsqrt(mean(x^2) + eps) * weight`.
///
/// The statistics are computed in f32 whatever the input dtype, then the normalised value is
/// cast back before the multiplication by `weight` (`Qwen3RMSNorm`). The parameter is called
/// `weight`, as in the HF checkpoint.
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// Per-channel gain, initialised to ones.
    pub weight: Param<Tensor<1>>,
    /// Added to the mean square before the square root.
    pub eps: f64,
}

impl RmsNorm {
    /// A norm over `size` channels with gain one.
    pub fn new(size: usize, eps: f64, device: &Device) -> Self {
        Self {
            weight: Initializer::Ones.init([size], device),
            eps,
        }
    }

    /// Normalise the last dimension.
    ///
    /// # Shapes
    /// - `x`: `[..., size]` -> `[..., size]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        if let Some(y) = qwen_burn_kernels::rms_norm(&x, &self.weight.val(), self.eps) {
            return y;
        }
        let x32 = if dtype == DType::F32 {
            x
        } else {
            x.cast(DType::F32)
        };
        let variance = x32.clone().square().mean_dim(D - 1);
        let normed = x32 * (variance + self.eps).sqrt().recip();
        let normed = if dtype == DType::F32 {
            normed
        } else {
            normed.cast(dtype)
        };
        normed * self.weight.val().unsqueeze()
    }
}
