//! The memory a training run will need, estimated from its config before anything is built
//! (see `qwen_burn_model::memory` for the limit it is checked against).
//!
//! The estimate is deliberately a floor, not a forecast: parameters; for full training their
//! gradients and AdamW's two moments; and the activations that one micro-batch's backward pass
//! keeps. What it leaves out (allocator slack, temporaries, the data pipeline) only makes a real
//! run larger, so a refused run would certainly not have fit, while an accepted one may still
//! run out.

use qwen_burn_model::memory::{Estimate, human};
use qwen_burn_model::{BackendKind, Qwen3Config};

use crate::config::RunConfig;
use crate::error::Result;

/// Bytes of one f32 value.
const F32: u128 = 4;

/// The estimate of training `model` as `config` says on a device of `kind`. Accelerators hold
/// the training state in their own memory, which is not checked here; the host still holds the
/// parameters once while loading.
pub fn training_estimate(config: &RunConfig, model: &Qwen3Config, kind: BackendKind) -> Estimate {
    let mut estimate = model.parameter_estimate();
    if !kind.is_cpu() {
        return estimate;
    }
    let params: u128 = estimate.total();
    if config.lora.is_none() {
        estimate.push(params, "gradients (one per parameter)");
        estimate.push(2 * params, "AdamW moments (two per parameter)");
    }
    let n = |x: usize| x as u128;
    let t = &config.training;
    let tokens = n(t.batch_size) * n(t.seq_len);
    let (h, hd) = (n(model.hidden_size), n(model.head_dim));
    let (hq, hkv) = (n(model.num_attention_heads), n(model.num_key_value_heads));
    let inner = match &model.moe {
        Some(moe) if model.num_hidden_layers > 0 && model.is_moe_layer(0) => {
            n(moe.num_experts_per_tok) * n(moe.moe_intermediate_size)
        }
        _ => n(model.intermediate_size),
    };
    // Saved for the backward, per token and layer: the block input, two norm outputs, the
    // attention output and the MLP output (5 x hidden), q/k/v and the attention result, and the
    // MLP's gate, up and product.
    let per_layer = 5 * h + 2 * hq * hd + 2 * hkv * hd + 3 * inner;
    estimate.push(
        tokens * n(model.num_hidden_layers) * per_layer * F32,
        "activations (training.batch_size x training.seq_len x num_hidden_layers x hidden_size)",
    );
    estimate.push(
        2 * tokens * n(model.vocab_size) * F32,
        "logits and their gradient (training.batch_size x training.seq_len x vocab_size)",
    );
    let fused_attention = kind == BackendKind::Flex && t.fused_kernels;
    if !fused_attention {
        // The composed attention keeps its scores and probabilities: heads x seq_len per token.
        estimate.push(
            2 * tokens * n(t.seq_len) * hq * n(model.num_hidden_layers) * F32,
            "attention scores (training.batch_size x training.seq_len^2 x num_attention_heads \
             x num_hidden_layers, composed attention)",
        );
    }
    estimate
}

/// One line for a run's header: the estimate's total and its terms, the model's parameters
/// summed as "weights", e.g. `memory estimate (a floor): 310.2 MiB = weights 16.5 MiB +
/// gradients 16.5 MiB + ...`.
pub fn training_memory_line(config: &RunConfig, model: &Qwen3Config, kind: BackendKind) -> String {
    let estimate = training_estimate(config, model, kind);
    let weights = model.parameter_estimate().parts.len();
    let mut terms = vec![format!(
        "weights {}",
        human(estimate.parts[..weights].iter().map(|p| p.bytes).sum())
    )];
    for part in &estimate.parts[weights..] {
        // The term's name without the config fields it grows with.
        let name = part.what.split(" (").next().unwrap_or(&part.what);
        terms.push(format!("{name} {}", human(part.bytes)));
    }
    let scope = if kind.is_cpu() {
        ""
    } else {
        " (host side: the device's own memory is not estimated)"
    };
    format!(
        "memory estimate (a floor){scope}: {} = {}",
        human(estimate.total()),
        terms.join(" + ")
    )
}

/// Refuse a run whose estimate exceeds the memory limit.
pub fn check_training_memory(
    config: &RunConfig,
    model: &Qwen3Config,
    kind: BackendKind,
) -> Result<()> {
    training_estimate(config, model, kind)
        .check("training")
        .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_line_adds_up_its_terms() {
        let table: toml::Table = crate::config::MINIMAL.parse().unwrap();
        let config = RunConfig::from_table(table).unwrap();
        let model = crate::resume::model_config_of(&config).unwrap();
        let line = training_memory_line(&config, &model, BackendKind::Flex);
        let estimate = training_estimate(&config, &model, BackendKind::Flex);
        assert!(
            line.starts_with(&format!(
                "memory estimate (a floor): {} = weights",
                human(estimate.total())
            )),
            "{line}"
        );
        for term in [
            "gradients",
            "AdamW moments",
            "activations",
            "logits and their gradient",
        ] {
            assert!(line.contains(term), "{term}: {line}");
        }
        // Weights, then one term per training term: nothing dropped, nothing counted twice.
        let weights: u128 = model.parameter_estimate().total();
        let rest: u128 = estimate.parts[model.parameter_estimate().parts.len()..]
            .iter()
            .map(|p| p.bytes)
            .sum();
        assert_eq!(weights + rest, estimate.total());
        let terms = estimate.parts.len() - model.parameter_estimate().parts.len();
        assert_eq!(line.matches(" + ").count(), terms, "{line}");
        assert!(
            line.contains(&format!("weights {}", human(weights))),
            "{line}"
        );
    }
}
