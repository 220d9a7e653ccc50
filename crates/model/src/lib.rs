//! Qwen3 and Qwen3-MoE in Burn, with the semantics of HF transformers.
//!
//! Files in reading order: [`config`] (HF `config.json`), [`rms_norm`], [`rope`] (rotate-half
//! RoPE and its scalings), [`attention`] (GQA with QK-norm), [`mlp`] (SwiGLU), [`moe`] (sparse
//! experts and router losses), [`block`], [`model`], [`kv_cache`], [`loss`], [`weights`] (HF
//! safetensors import/export), [`init`], [`generate`] (with [`generation_config`]), [`device`].
//!
//! One model code runs on every Burn backend: the device is a run-time value
//! ([`device::device_from_name`]). On Flex the hot operations run the fused kernels of the
//! `qwen-burn-kernels` crate, each behind the composed Burn ops it replaces.

pub mod attention;
pub mod block;
pub mod config;
pub mod continuation;
pub mod device;
#[cfg(feature = "wgpu")]
mod device_probe;
pub mod documents;
pub mod error;
pub mod export;
pub mod generate;
pub mod generate_group;
pub mod generation_config;
pub mod hub;
pub mod init;
pub mod kv_cache;
pub mod loss;
pub mod memory;
pub mod mlp;
pub mod model;
pub mod moe;
pub mod projection;
pub mod rms_norm;
pub mod rope;
pub mod weights;

pub use config::{BalanceLoss, ModelType, MoeConfig, Qwen3Config, RopeScaling};
pub use continuation::{Continuation, PrefixCache, generate_continuing};
pub use device::{BackendKind, DeviceSet, device_from_name};
pub use documents::Documents;
pub use error::{ModelError, Result};
pub use generate::{Generation, SamplingConfig, generate};
pub use generate_group::{GroupCompletion, generate_group, generate_groups};
pub use generation_config::{GenerationConfig, SamplingDefaults};
pub use kv_cache::KvCache;
pub use model::{LayerInputs, ModelOutput, Qwen3ForCausalLM};
pub use moe::{
    RouterOutput, RouterStats, assignment_loss, balancing_loss, load_balancing_loss, router_z_loss,
    selection_counts,
};
/// Keep frozen bf16 weights packed for the bf16 kernel while the guard lives (inference).
pub use qwen_burn_kernels::{
    BF16_KERNEL_VAR, Bf16Path, PackedWeights, bf16_path, chosen_bf16_path, keep_packed_weights,
};
pub use weights::SafetensorsCheckpoint;
