//! Fuzz tests of the model crate's parsers of user files: HF `config.json`
//! ([`Qwen3Config::from_file`], [`Qwen3Config::from_json`]), `generation_config.json`
//! ([`GenerationConfig::from_file`]) and safetensors headers ([`SafetensorsCheckpoint::open`]
//! and [`SafetensorsCheckpoint::read_f32`], single files and sharded indexes).
//!
//! Each parser runs 10,000 cases from mutated valid seeds (see the `qwen-burn-fuzz` crate) and each case
//! checks that the parser returns (no panic, no abort), that its peak allocation stays under
//! `A * input_len + B`, and that an error names the file it read (for `from_json`: a field).

use qwen_burn_fuzz as support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use qwen_burn_model::{GenerationConfig, ModelError, Qwen3Config, SafetensorsCheckpoint};
use safetensors::tensor::{Dtype, TensorView};
use support::{Bound, Bytes, Dictionary, Edit, MIB, Tally};

#[global_allocator]
static ALLOC: support::Counting = support::Counting;

/// `config.json` and `generation_config.json` hold a few KiB of JSON; parsing builds a
/// `serde_json::Value` (tens of bytes per input byte) and a config. 64 bytes per input byte
/// plus 8 MiB admits that and rejects any allocation sized by a value rather than the input.
const JSON_BOUND: Bound = Bound {
    per_byte: 64,
    base: 8 * MIB,
};

/// Safetensors: the header is parsed into a map (as JSON above) and `read_f32` returns at most
/// 2 f32 bytes per file byte (F16/BF16 widened), so the same bound holds.
const SAFETENSORS_BOUND: Bound = JSON_BOUND;

const CONFIG_SEEDS: &[&str] = &[
    include_str!("../fixtures/dense/config.json"),
    include_str!("../fixtures/dense_legacy_tied/config.json"),
    include_str!("../fixtures/moe/config.json"),
    include_str!("../fixtures/moe_norm_false/config.json"),
    include_str!("../fixtures/rope_dynamic/config.json"),
    include_str!("../fixtures/rope_linear/config.json"),
    include_str!("../fixtures/rope_llama3/config.json"),
    include_str!("../fixtures/yarn/config.json"),
    include_str!("../fixtures/sharded_bf16/config.json"),
];

/// HF `config.json` keys (ours and legacy spellings), and a few unknown ones.
const CONFIG_KEYS: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rope_type",
    "type",
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "tie_word_embeddings",
    "attention_bias",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "decoder_sparse_step",
    "mlp_only_layers",
    "norm_topk_prob",
    "router_aux_loss_coef",
    "router_capacity_factor",
    "router_centering",
    "router_assignment_loss_coef",
    "torch_dtype",
    "dtype",
    "architectures",
    "layer_types",
    "use_sliding_window",
    "sliding_window",
    "bogus",
    "",
];

const GENERATION_SEEDS: &[&str] = &[
    include_str!("../fixtures/dense/generation_config.json"),
    include_str!("../fixtures/moe/generation_config.json"),
    include_str!("../fixtures/sharded_bf16/generation_config.json"),
    // What Qwen3 chat checkpoints ship.
    r#"{
  "bos_token_id": 151643,
  "do_sample": true,
  "eos_token_id": [
    151645,
    151643
  ],
  "pad_token_id": 151643,
  "temperature": 0.6,
  "top_k": 20,
  "top_p": 0.95,
  "max_new_tokens": 256,
  "repetition_penalty": 1.0,
  "num_beams": 1,
  "transformers_version": "4.51.0"
}
"#,
    r#"{"eos_token_id": 2, "do_sample": false, "no_repeat_ngram_size": 3, "length_penalty": 1.5}"#,
];

const GENERATION_KEYS: &[&str] = &[
    "eos_token_id",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "max_new_tokens",
    "bos_token_id",
    "pad_token_id",
    "num_beams",
    "num_return_sequences",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "transformers_version",
    "bogus",
];

fn dictionary(seeds: &[&str], keys: &[&str]) -> Arc<Dictionary> {
    Arc::new(Dictionary {
        seeds: seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        extremes: support::JSON_EXTREMES,
        keys: keys.iter().map(|k| k.to_string()).collect(),
    })
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

/// The error names the file: its full path is in the message.
fn check_names_file(err: &ModelError, path: &Path) -> Result<(), TestCaseError> {
    let message = err.to_string();
    prop_assert!(
        message.contains(&path.display().to_string()),
        "error does not name {}: {message}",
        path.display()
    );
    Ok(())
}

#[test]
fn config_json_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let dict = dictionary(CONFIG_SEEDS, CONFIG_KEYS);
    let tally = Tally::default();
    support::run(
        "config.json (Qwen3Config::from_file)",
        support::mutated(dict, support::edit().boxed()),
        &tally,
        |Bytes(input)| {
            write(&path, &input);
            let (result, peak) = support::measure(&input, || Qwen3Config::from_file(&path));
            tally.add(result.is_ok(), input.len(), peak);
            JSON_BOUND.check("config.json", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &path)?;
            }
            Ok(())
        },
    );
}

/// JSON pointers of every node of `value`, in depth-first order.
fn pointers(value: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(v, p, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(v, p, out);
            }
        }
        _ => {}
    }
}

/// An edit of a parsed `config.json`: the node at an index (depth-first) gets a new value, is
/// removed, or moves under another key.
#[derive(Clone, Debug)]
enum ValueEdit {
    Replace(usize, usize),
    Remove(usize),
    Rename(usize, usize),
}

fn apply_value_edit(
    value: &mut serde_json::Value,
    edit: &ValueEdit,
    extremes: &[serde_json::Value],
) {
    let mut all = Vec::new();
    pointers(value, String::new(), &mut all);
    let pick = |n: usize| all.get(n % all.len().max(1)).cloned();
    let split = |p: &str| {
        let (parent, last) = p.rsplit_once('/').unwrap_or(("", p));
        (
            parent.to_string(),
            last.replace("~1", "/").replace("~0", "~"),
        )
    };
    match *edit {
        ValueEdit::Replace(n, k) => {
            if let Some(node) = pick(n).and_then(|p| value.pointer_mut(&p)) {
                *node = extremes[k % extremes.len()].clone();
            }
        }
        ValueEdit::Remove(n) | ValueEdit::Rename(n, _) => {
            let Some((parent, last)) = pick(n).map(|p| split(&p)) else {
                return;
            };
            let Some(serde_json::Value::Object(map)) = value.pointer_mut(&parent) else {
                return;
            };
            let Some(old) = map.remove(&last) else {
                return;
            };
            if let ValueEdit::Rename(_, k) = *edit {
                map.insert(CONFIG_KEYS[k % CONFIG_KEYS.len()].to_string(), old);
            }
        }
    }
}

/// `from_json` on parsed seeds edited as JSON values: nodes replaced with extreme values (huge
/// and negative integers, 1e308, -0.0, fractions, empty strings, wrong types, nesting to
/// serde_json's depth limit), removed, or renamed to other keys. An error must be
/// `InvalidConfig` naming a field: a key of `config.json` (dotted when nested), or `config` for
/// the whole object; the field is empty only when the offending key is the empty string, which
/// the reason then quotes.
#[test]
fn config_json_value() {
    let seeds: Vec<serde_json::Value> = CONFIG_SEEDS
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect();
    let mut extremes: Vec<serde_json::Value> = support::JSON_EXTREMES
        .iter()
        .filter_map(|v| serde_json::from_str(v).ok())
        .collect();
    for depth in [2, 32, 126] {
        extremes.push(
            serde_json::from_str(&format!("{}1{}", "[".repeat(depth), "]".repeat(depth))).unwrap(),
        );
    }
    let edit = prop_oneof![
        6 => (any::<usize>(), any::<usize>()).prop_map(|(n, k)| ValueEdit::Replace(n, k)),
        2 => any::<usize>().prop_map(ValueEdit::Remove),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(n, k)| ValueEdit::Rename(n, k)),
    ];
    let strategy = (
        0..seeds.len(),
        proptest::collection::vec(edit, 1..6),
        any::<bool>(),
    );
    let tally = Tally::default();
    support::run(
        "config.json (Qwen3Config::from_json)",
        strategy,
        &tally,
        |(seed, edits, strict)| {
            let mut value = seeds[seed].clone();
            for e in &edits {
                apply_value_edit(&mut value, e, &extremes);
            }
            let text = value.to_string();
            let (result, peak) =
                support::measure(text.as_bytes(), || Qwen3Config::from_json(&value, strict));
            tally.add(result.is_ok(), text.len(), peak);
            JSON_BOUND.check("config.json value", text.len(), peak)?;
            match result {
                Ok(_) => {}
                Err(ModelError::InvalidConfig { field, reason })
                    if !field.is_empty() || reason.contains("``") => {}
                Err(e) => prop_assert!(false, "error names no field: {e:?}"),
            }
            Ok(())
        },
    );
}

#[test]
fn generation_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("generation_config.json");
    let dict = dictionary(GENERATION_SEEDS, GENERATION_KEYS);
    let tally = Tally::default();
    support::run(
        "generation_config.json (GenerationConfig::from_file)",
        support::mutated(dict, support::edit().boxed()),
        &tally,
        |Bytes(input)| {
            write(&path, &input);
            let (result, peak) = support::measure(&input, || {
                GenerationConfig::from_file(&path).map(|c| c.sampling())
            });
            tally.add(result.is_ok(), input.len(), peak);
            JSON_BOUND.check("generation_config.json", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &path)?;
            }
            Ok(())
        },
    );
}

/// Key, dtype, shape and bytes of a tensor of a seed file.
type SeedTensor<'a> = (&'a str, Dtype, Vec<usize>, &'a [u8]);

mod safetensors_files;

/// The harness itself: the counting allocator sees a large allocation made while measuring,
/// and the bound rejects it.
#[test]
fn allocation_bound_catches_a_large_allocation() {
    let input = [0u8; 1000];
    let ((), peak) = support::measure(&input, || {
        let big = vec![1u8; 100 * MIB];
        assert_eq!(big.iter().map(|&b| b as usize).sum::<usize>(), 100 * MIB);
    });
    assert!(peak >= 100 * MIB, "peak {peak}");
    assert!(JSON_BOUND.check("self-test", input.len(), peak).is_err());
    let ((), small) = support::measure(&input, || drop(vec![1u8; 1000]));
    assert!(small < 100 * MIB && JSON_BOUND.check("self-test", input.len(), small).is_ok());
}
