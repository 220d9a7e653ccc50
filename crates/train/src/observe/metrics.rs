//! The FLOP accounting behind MFU.

use qwen_burn_model::Qwen3Config;

/// Training FLOPs per token: `6 * active params + 12 * layers * heads * head_dim * seq`
/// (Kaplan et al. 6N plus the attention term of PaLM appendix B).
pub fn train_flops_per_token(config: &Qwen3Config, seq_len: usize) -> f64 {
    6.0 * config.active_params_per_token() as f64
        + 3.0 * config.attention_flops_per_token(seq_len) as f64
}

/// LoRA training FLOPs per token: the frozen model's forward and input-gradient backward
/// (`4 * active params`, no weight gradients), the attention term, and `6 *` the adapters.
/// For MoE the adapters of every expert are counted (an upper bound: a token uses `k`).
pub fn lora_flops_per_token(config: &Qwen3Config, seq_len: usize, adapter_params: usize) -> f64 {
    4.0 * config.active_params_per_token() as f64
        + 3.0 * config.attention_flops_per_token(seq_len) as f64
        + 6.0 * adapter_params as f64
}
