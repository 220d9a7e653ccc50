//! The memory a training run will need, estimated from its config before anything is built
//! (see `qwen_burn_model::memory` for the limit it is checked against).
//!
//! The estimate is deliberately a floor, not a forecast: parameters; for full training their
//! gradients and AdamW's two moments (for LoRA, the adapters' own); and the activations that one
//! micro-batch's backward pass keeps. What it leaves out (allocator slack, temporaries, the data
//! pipeline) only makes a real run larger, so a refused run would certainly not have fit, while
//! an accepted one may still run out. A refusal names the options that would make the run fit.

use qwen_burn_model::memory::{Estimate, human, memory_limit};
use qwen_burn_model::{BackendKind, Qwen3Config};

use crate::config::{
    ActivationCheckpointing, BaseDtype, DataKind, LoraConfig, LoraTarget, Precision, RunConfig,
};
use crate::error::{Result, TrainError};

/// Bytes of one f32 value.
const F32: u128 = 4;

/// Rows of the fused LM head + loss's chunk at most (`linear_cross_entropy`'s `chunk_rows`).
const HEAD_CHUNK_ROWS: u128 = 512;

/// The estimate of training `model` as `config` says on a device of `kind`. Accelerators hold
/// the training state in their own memory, which is not checked here; the host still holds the
/// parameters once while loading.
pub fn training_estimate(config: &RunConfig, model: &Qwen3Config, kind: BackendKind) -> Estimate {
    let mut estimate = model.parameter_estimate();
    if config
        .lora
        .as_ref()
        .is_some_and(|l| l.base_dtype == BaseDtype::Bf16)
    {
        // Every matrix in bf16; only the norms (a vanishing share) stay f32.
        for part in &mut estimate.parts {
            if !part.what.starts_with("norms") {
                part.bytes /= 2;
                part.what = format!("{} in bf16", part.what);
            }
        }
    }
    if !kind.is_cpu() {
        return estimate;
    }
    let params: u128 = estimate.total();
    let n = |x: usize| x as u128;
    match &config.lora {
        None => {
            estimate.push(params, "gradients (one per parameter)");
            estimate.push(2 * params, "AdamW moments (two per parameter)");
        }
        Some(lora) => estimate.push(
            4 * adapter_elements(lora, model) * F32,
            "LoRA adapters with their gradients and AdamW moments (lora.rank x lora.targets)",
        ),
    }
    let t = &config.training;
    // Rows a micro-batch trains: a prompt becomes `rl.group_size` completions, a preference
    // pair its chosen and its rejected row.
    let (per_item, items) = match config.data.kind {
        DataKind::Prompts => (
            n(config.rl.group_size),
            "training.batch_size x rl.group_size",
        ),
        DataKind::Preference => (2, "training.batch_size x 2 rows a pair"),
        DataKind::Text | DataKind::Sft => (1, "training.batch_size"),
    };
    let tokens = n(t.batch_size) * per_item * n(t.seq_len);
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
    if t.activation_checkpointing == ActivationCheckpointing::Layers {
        // Each layer's input, and one layer's activations at a time in the backward.
        estimate.push(
            tokens * (n(model.num_hidden_layers) * h + per_layer) * F32,
            format!(
                "activations ({items} x training.seq_len x (num_hidden_layers x hidden_size + \
                 one layer's), training.activation_checkpointing = \"layers\")"
            ),
        );
    } else {
        estimate.push(
            tokens * n(model.num_hidden_layers) * per_layer * F32,
            format!("activations ({items} x training.seq_len x num_hidden_layers x hidden_size)"),
        );
    }
    let fused = kind == BackendKind::Flex && t.fused_kernels;
    if fused {
        // The fused head + loss never forms the `[tokens, vocab]` logits: one row chunk.
        estimate.push(
            tokens.min(HEAD_CHUNK_ROWS) * n(model.vocab_size) * F32,
            format!(
                "logits of one row chunk ({items} x training.seq_len, at most 512 rows, x \
                 vocab_size: the fused LM head and loss)"
            ),
        );
        // At mixed precision on the bf16 kernel, an f32 table met by several row chunks is
        // packed once in each of its two layouts (`linear_cross_entropy`).
        let f32_table = config
            .lora
            .as_ref()
            .is_none_or(|l| l.base_dtype != BaseDtype::Bf16);
        if t.precision == Precision::Bf16
            && f32_table
            && tokens > HEAD_CHUNK_ROWS
            && qwen_burn_kernels::bf16_path().has_kernel()
        {
            estimate.push(
                2 * n(model.vocab_size) * h * 2,
                "the LM head packed for the bf16 kernel (vocab_size x hidden_size in bf16, \
                 twice: training.precision = \"bf16\")",
            );
        }
    } else {
        estimate.push(
            2 * tokens * n(model.vocab_size) * F32,
            format!("logits and their gradient ({items} x training.seq_len x vocab_size)"),
        );
        // The composed attention keeps its scores and probabilities: heads x seq_len per token.
        estimate.push(
            2 * tokens * n(t.seq_len) * hq * n(model.num_hidden_layers) * F32,
            format!(
                "attention scores ({items} x training.seq_len^2 x num_attention_heads x \
                 num_hidden_layers, composed attention)"
            ),
        );
    }
    estimate
}

/// Elements of the LoRA adapters: `rank x (d_in + d_out)` per adapted projection (of each
/// expert, in MoE layers).
fn adapter_elements(lora: &LoraConfig, model: &Qwen3Config) -> u128 {
    let n = |x: usize| x as u128;
    let (h, r) = (n(model.hidden_size), n(lora.rank));
    let q = n(model.num_attention_heads) * n(model.head_dim);
    let kv = n(model.num_key_value_heads) * n(model.head_dim);
    let (inner, copies) = match &model.moe {
        Some(moe) => (n(moe.moe_intermediate_size), n(moe.num_experts)),
        None => (n(model.intermediate_size), 1),
    };
    let per_layer: u128 = lora
        .targets
        .iter()
        .map(|t| match t {
            LoraTarget::QProj | LoraTarget::OProj => h + q,
            LoraTarget::KProj | LoraTarget::VProj => h + kv,
            LoraTarget::GateProj | LoraTarget::UpProj | LoraTarget::DownProj => {
                copies * (h + inner)
            }
        })
        .sum();
    n(model.num_hidden_layers) * r * per_layer
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

/// Refuse a run that cannot run on a device of `kind`: bf16 LoRA storage where the backend has
/// no bf16 tensors, or an estimate over the memory limit. The latter names the options that
/// would make it fit ([`what_would_fit`]).
pub fn check_training_memory(
    config: &RunConfig,
    model: &Qwen3Config,
    kind: BackendKind,
) -> Result<()> {
    if let Some(lora) = &config.lora
        && lora.base_dtype == BaseDtype::Bf16
        && !has_bf16(kind)
    {
        return Err(TrainError::config(
            "lora.base_dtype",
            format!(
                "\"bf16\" needs bf16 tensors, which the {kind:?} device does not have; use \
                 the flex device (the default) or cuda, or base_dtype = \"f32\""
            ),
        ));
    }
    let Err(refusal) = training_estimate(config, model, kind).check("training") else {
        return Ok(());
    };
    let Some((available, _)) = memory_limit()? else {
        return Err(refusal.into());
    };
    let options = what_would_fit(config, model, kind, u128::from(available));
    let options = if options.is_empty() {
        "none of LoRA, bf16 base weights, activation checkpointing or smaller batches would \
         make it fit"
            .to_string()
    } else {
        format!("it would fit with {}", options.join("; or "))
    };
    Err(TrainError::DoesNotFit {
        refusal: refusal.to_string(),
        options,
    })
}

/// Whether the backend of `kind` has bf16 tensors (`lora.base_dtype = "bf16"`).
fn has_bf16(kind: BackendKind) -> bool {
    !matches!(kind, BackendKind::Ndarray | BackendKind::Wgpu)
}

/// The config changes, one at a time, whose estimate fits in `available` bytes: LoRA instead of
/// full training, bf16 base weights, activation checkpointing, the largest
/// `training.batch_size` or `training.seq_len` that fits.
pub fn what_would_fit(
    config: &RunConfig,
    model: &Qwen3Config,
    kind: BackendKind,
    available: u128,
) -> Vec<String> {
    let fits = |c: &RunConfig| training_estimate(c, model, kind).total() <= available;
    let mut options = Vec::new();
    let bf16_ok = has_bf16(kind);
    match &config.lora {
        None => {
            let mut lora = LoraConfig {
                rank: 8,
                alpha: 16.0,
                targets: LoraTarget::ALL.to_vec(),
                base_dtype: BaseDtype::F32,
            };
            let mut c = config.clone();
            c.lora = Some(lora.clone());
            if fits(&c) {
                options.push(
                    "LoRA instead of full training ([lora] rank = 8, alpha = 16.0, targets = \
                     the seven projections)"
                        .to_string(),
                );
            } else if bf16_ok {
                lora.base_dtype = BaseDtype::Bf16;
                c.lora = Some(lora);
                if fits(&c) {
                    options.push(
                        "LoRA on bf16 base weights ([lora] rank = 8, alpha = 16.0, targets = the \
                         seven projections, base_dtype = \"bf16\")"
                            .to_string(),
                    );
                }
            }
        }
        Some(lora) if lora.base_dtype == BaseDtype::F32 && bf16_ok => {
            let mut c = config.clone();
            c.lora = Some(LoraConfig {
                base_dtype: BaseDtype::Bf16,
                ..lora.clone()
            });
            if fits(&c) {
                options.push("lora.base_dtype = \"bf16\"".to_string());
            }
        }
        Some(_) => {}
    }
    let t = &config.training;
    if t.activation_checkpointing == ActivationCheckpointing::None {
        let mut c = config.clone();
        c.training.activation_checkpointing = ActivationCheckpointing::Layers;
        if fits(&c) {
            options.push("training.activation_checkpointing = \"layers\"".to_string());
        }
    }
    let largest = |mut value: usize, set: &dyn Fn(&mut RunConfig, usize)| {
        let mut c = config.clone();
        while value > 1 {
            value /= 2;
            set(&mut c, value);
            if fits(&c) {
                return Some(value);
            }
        }
        None
    };
    if let Some(b) = largest(t.batch_size, &|c, v| c.training.batch_size = v) {
        options.push(format!(
            "training.batch_size = {b} (and training.grad_accum x {} for the same tokens per \
             step)",
            t.batch_size.div_ceil(b)
        ));
    }
    if let Some(s) = largest(t.seq_len, &|c, v| c.training.seq_len = v) {
        options.push(format!("training.seq_len = {s}"));
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_line_adds_up_its_terms() {
        let table: toml::Table = crate::config::MINIMAL.parse().unwrap();
        let config = RunConfig::from_table(table).unwrap();
        let model = crate::run::start::model_config_of(&config).unwrap();
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
            "logits of one row chunk",
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

    fn config_with(extra: &str) -> RunConfig {
        let mut table: toml::Table = crate::config::MINIMAL.parse().unwrap();
        let extra: toml::Table = extra.parse().unwrap();
        for (key, value) in extra {
            match (table.get_mut(&key), value) {
                (Some(toml::Value::Table(t)), toml::Value::Table(v)) => t.extend(v),
                (_, value) => {
                    table.insert(key, value);
                }
            }
        }
        RunConfig::from_table(table).unwrap()
    }

    /// A GRPO micro-batch trains `batch_size x group_size` rows and a preference one two rows a
    /// pair: the activation terms grow with the rows and name what they grow with.
    #[test]
    fn rl_groups_and_preference_pairs_count_their_rows() {
        let part = |extra: &str, term: &str| {
            let config = config_with(extra);
            let model = crate::run::start::model_config_of(&config).unwrap();
            training_estimate(&config, &model, BackendKind::Flex)
                .parts
                .into_iter()
                .find(|p| p.what.starts_with(term))
                .unwrap()
        };
        for term in ["activations", "logits of one row chunk"] {
            let text = part("", term);
            let rl = part(
                "[data]\nkind = \"prompts\"\n[rl]\ngroup_size = 8\n[[rl.rewards]]\nkind = \"exact_match\"\n",
                term,
            );
            assert_eq!(rl.bytes, 8 * text.bytes, "{}", rl.what);
            assert!(rl.what.contains("rl.group_size"), "{}", rl.what);
            let pairs = part("[data]\nkind = \"preference\"\n", term);
            assert_eq!(pairs.bytes, 2 * text.bytes, "{}", pairs.what);
        }
    }

    /// At mixed precision on the bf16 kernel, a head met by several row chunks is counted in its
    /// two packed layouts; not at f32, nor for a bf16 LoRA base (packed per chunk).
    #[test]
    fn mixed_precision_counts_the_packed_head() {
        let rows = "[training]\nbatch_size = 8\nseq_len = 128\n";
        let packed = |extra: &str| {
            let config = config_with(&format!("{rows}{extra}"));
            let model = crate::run::start::model_config_of(&config).unwrap();
            let part = training_estimate(&config, &model, BackendKind::Flex)
                .parts
                .into_iter()
                .find(|p| p.what.starts_with("the LM head packed"));
            (
                part.map(|p| p.bytes),
                4 * (model.vocab_size * model.hidden_size) as u128,
            )
        };
        let kernel = qwen_burn_kernels::bf16_path().has_kernel();
        let (bytes, expected) = packed("precision = \"bf16\"\n");
        assert_eq!(bytes, kernel.then_some(expected));
        assert_eq!(packed("").0, None);
        let lora = "precision = \"bf16\"\n[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q_proj\"]\nbase_dtype = \"bf16\"\n";
        assert_eq!(packed(lora).0, None);
    }

    /// Each option offered for a run over the limit does fit when applied, and the ones the
    /// issue names are offered: LoRA for full training, bf16 base weights for f32 LoRA.
    #[test]
    fn a_run_over_the_limit_is_offered_options_that_fit() {
        const MODEL: &str = "[model]\nhidden_size = 256\nintermediate_size = 768\n\
            num_hidden_layers = 4\nvocab_size = 4096\nhead_dim = 64\n\
            num_attention_heads = 4\nnum_key_value_heads = 2\n\
            [training]\nbatch_size = 8\nseq_len = 64\n";
        const LORA: &str = "[lora]\nrank = 8\nalpha = 16.0\n\
            targets = [\"q_proj\", \"v_proj\"]\n";
        let kind = BackendKind::Flex;
        let total = |c: &RunConfig| {
            let model = crate::run::start::model_config_of(c).unwrap();
            training_estimate(c, &model, kind).total()
        };
        let full = config_with(MODEL);
        let lora = config_with(&format!("{MODEL}{LORA}"));
        let bf16 = config_with(&format!("{MODEL}{LORA}base_dtype = \"bf16\"\n"));
        let (e_full, e_lora, e_bf16) = (total(&full), total(&lora), total(&bf16));
        assert!(
            e_bf16 < e_lora && e_lora < e_full,
            "{e_bf16} {e_lora} {e_full}"
        );
        let model = crate::run::start::model_config_of(&full).unwrap();

        let options = what_would_fit(&full, &model, kind, (e_lora + e_full) / 2);
        assert!(options[0].starts_with("LoRA instead"), "{options:?}");
        let options = what_would_fit(&lora, &model, kind, (e_bf16 + e_lora) / 2);
        assert_eq!(options[0], "lora.base_dtype = \"bf16\"", "{options:?}");
        // No bf16 on ndarray: not offered there.
        let ndarray = training_estimate(&lora, &model, BackendKind::Ndarray).total();
        let options = what_would_fit(&lora, &model, BackendKind::Ndarray, ndarray - 1);
        assert!(!options.iter().any(|o| o.contains("bf16")), "{options:?}");
        // A smaller batch: the largest halving that fits, and it does fit.
        let options = what_would_fit(&lora, &model, kind, e_lora - 1);
        let batch = options
            .iter()
            .find_map(|o| o.strip_prefix("training.batch_size = "))
            .expect("a smaller batch fits");
        let b: usize = batch.split(' ').next().unwrap().parse().unwrap();
        let mut smaller = lora.clone();
        smaller.training.batch_size = b;
        assert!(b < 8 && total(&smaller) < e_lora);
        // bf16 storage where the device has no bf16 tensors: refused, naming the field.
        let refused = check_training_memory(&bf16, &model, BackendKind::Ndarray).unwrap_err();
        assert!(refused.to_string().contains("lora.base_dtype"), "{refused}");
        // Nothing fits below the weights alone.
        assert!(what_would_fit(&full, &model, kind, 1).is_empty());
    }
}
