//! SwiGLU feed-forward network.

use burn::module::Module;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::activation::silu;
use burn::tensor::{Device, Tensor};

use crate::projection::{project, project_batched};

/// `down_proj(silu(gate_proj(x)) * up_proj(x))`, no biases (`Qwen3MLP`).
#[derive(Module, Debug)]
pub struct Mlp {
    /// `[hidden, inner]` (Burn layout; HF stores `[inner, hidden]`).
    pub gate_proj: Linear,
    /// `[hidden, inner]`.
    pub up_proj: Linear,
    /// `[inner, hidden]`.
    pub down_proj: Linear,
}

impl Mlp {
    /// A SwiGLU block `hidden -> inner -> hidden` with HF's normal(0, std) init.
    pub fn new(hidden: usize, inner: usize, std: f64, device: &Device) -> Self {
        Self {
            gate_proj: linear(hidden, inner, false, std, device),
            up_proj: linear(hidden, inner, false, std, device),
            down_proj: linear(inner, hidden, false, std, device),
        }
    }

    /// # Shapes
    /// - `x`: `[..., hidden]` -> `[..., hidden]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.forward_with(x, project)
    }

    /// [`Self::forward`] through [`project_batched`]: a single row sums as it would among
    /// others (a MoE expert that gets one token of a forward of several).
    pub fn forward_batched<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.forward_with(x, project_batched)
    }

    fn forward_with<const D: usize>(
        &self,
        x: Tensor<D>,
        project: fn(&Linear, Tensor<D>) -> Tensor<D>,
    ) -> Tensor<D> {
        let (gate, up) = (
            project(&self.gate_proj, x.clone()),
            project(&self.up_proj, x),
        );
        let hidden = match qwen_burn_kernels::swiglu(&gate, &up) {
            Some(h) => h,
            None => silu(gate) * up,
        };
        project(&self.down_proj, hidden)
    }
}

/// A Burn `Linear` (weight `[d_in, d_out]`) initialised like HF: normal(0, std), zero bias.
pub(crate) fn linear(d_in: usize, d_out: usize, bias: bool, std: f64, device: &Device) -> Linear {
    let mut layer = LinearConfig::new(d_in, d_out)
        .with_bias(false)
        .with_initializer(Initializer::Normal { mean: 0.0, std })
        .init(device);
    if bias {
        layer.bias = Some(Initializer::Zeros.init([d_out], device));
    }
    layer
}
