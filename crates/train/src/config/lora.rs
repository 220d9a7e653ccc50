//! The `[lora]` section of a run config.

use serde::{Deserialize, Serialize};

/// A projection LoRA can adapt (`lora.targets`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    /// `self_attn.q_proj`.
    QProj,
    /// `self_attn.k_proj`.
    KProj,
    /// `self_attn.v_proj`.
    VProj,
    /// `self_attn.o_proj`.
    OProj,
    /// `mlp.gate_proj` (also of each expert).
    GateProj,
    /// `mlp.up_proj`.
    UpProj,
    /// `mlp.down_proj`.
    DownProj,
}

impl LoraTarget {
    /// All seven projections, in HF order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    /// The module name, as in HF parameter paths.
    pub fn as_str(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }
}

/// `[lora]`: train low-rank adapters on the chosen projections instead of all weights. `rank`,
/// `alpha` and `targets` are required.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Adapter rank. Required.
    pub rank: usize,
    /// Scale numerator (delta = alpha / rank * A B). Required.
    pub alpha: f64,
    /// Projections to adapt. Required.
    pub targets: Vec<LoraTarget>,
    /// Storage of the frozen matrices (projections, embedding, LM head): `"f32"` (default) or
    /// `"bf16"`, half the bytes. The frozen matrices' products, and the attention's, take bf16
    /// operands with f32 sums (on the bf16 kernels where the CPU has them); adapters, norms,
    /// optimizer state and every gradient stay f32.
    #[serde(default, skip_serializing_if = "BaseDtype::is_f32")]
    pub base_dtype: BaseDtype,
}

/// `lora.base_dtype`: how the frozen base matrices of a LoRA run are stored.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BaseDtype {
    /// f32, as trained.
    #[default]
    F32,
    /// bf16: each weight rounded to nearest once, at load or init.
    Bf16,
}

impl BaseDtype {
    /// f32 (the default, left out of saved configs so that older checkpoints compare equal).
    pub fn is_f32(&self) -> bool {
        *self == BaseDtype::F32
    }

    /// The tensor dtype.
    pub fn dtype(self) -> burn::tensor::DType {
        match self {
            BaseDtype::F32 => burn::tensor::DType::F32,
            BaseDtype::Bf16 => burn::tensor::DType::BF16,
        }
    }
}
