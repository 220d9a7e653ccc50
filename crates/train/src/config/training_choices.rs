//! The named choices of `[training]` that change how a step is computed.

use serde::{Deserialize, Serialize};

/// `training.activation_checkpointing`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ActivationCheckpointing {
    /// Keep every activation.
    #[default]
    None,
    /// Recompute each decoder layer in the backward from its kept input.
    Layers,
}

/// `training.reproducible`: what a run repeats bit for bit.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Reproducible {
    /// The same binary, config and seed give the same weights, at any thread count. The
    /// micro-batch split (`batch_size x grad_accum`, replicas) changes the float rounding of a
    /// step's products and sums, though not its data.
    #[default]
    Rerun,
    /// Also the same weights under any split of the global batch: every sequence's forward and
    /// backward run alone (a micro-batch of one row), and the sequences' gradients are added in
    /// their order in the global batch, whichever micro-batch or replica computed them.
    Bitwise,
}

/// `training.precision`: how the fused kernels' matrix products multiply.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// f32 operands and accumulation.
    #[default]
    F32,
    /// Mixed precision, as `torch.autocast(dtype=torch.bfloat16)` on CPU: the products of the
    /// projections, the LM head, the MoE experts and the attention (values and gradients) take
    /// bf16-rounded operands and accumulate in f32; weights, optimizer state, the softmax,
    /// norms, losses and reductions stay f32.
    Bf16,
}

impl Precision {
    /// The kernels' setting.
    pub fn kernels(self) -> qwen_burn_kernels::Precision {
        match self {
            Precision::F32 => qwen_burn_kernels::Precision::F32,
            Precision::Bf16 => qwen_burn_kernels::Precision::Bf16,
        }
    }
}
