//! Fuzz tests of the run-config parsers: the TOML file ([`RunConfig::load`]), the parsed table
//! ([`RunConfig::from_table`]) and `--set` overrides ([`apply_overrides`]).
//!
//! Each parser runs 10,000 cases from mutated shipped configs (see the `qwen-burn-fuzz` crate) and each
//! case checks that the parser returns (no panic, no abort), that its peak allocation stays
//! under `A * input_len + B`, and that an error names the file or a key (see [`names_key`]).
//! What a parsed config means is not checked here: the config tests do that.

use qwen_burn_fuzz as support;

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use qwen_burn_train::config::{RunConfig, apply_overrides};
use qwen_burn_train::error::TrainError;
use support::{Bound, Bytes, Dictionary, MIB, Tally};

#[global_allocator]
static ALLOC: support::Counting = support::Counting;

/// A run config is a few KiB of TOML, parsed into a `toml::Table` (and the model table into
/// JSON): tens of bytes per input byte. 64 per byte plus 8 MiB admits that and rejects any
/// allocation sized by a value rather than the input.
const TOML_BOUND: Bound = Bound {
    per_byte: 64,
    base: 8 * MIB,
};

const SEEDS: &[&str] = &[
    include_str!("../../../configs/tiny.toml"),
    include_str!("../../../configs/tiny_moe.toml"),
    include_str!("../../../configs/finetune.toml"),
    include_str!("../../../configs/qwen3-0.6b.toml"),
    include_str!("../../../configs/bench-dense.toml"),
    include_str!("../../../configs/bench-lora-0.6b.toml"),
    include_str!("../../../configs/bench-lora-4b.toml"),
];

/// Section and key names of run configs (and of the HF `[model]` table), and a few unknown.
const KEYS: &[&str] = &[
    "model",
    "data",
    "optimizer",
    "schedule",
    "training",
    "checkpoint",
    "logging",
    "lora",
    "eval",
    "tasks",
    "limit",
    "shots",
    "from",
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rope_scaling",
    "num_experts",
    "torch_dtype",
    "architectures",
    "kind",
    "inputs",
    "val_inputs",
    "tokenizer",
    "cache_dir",
    "val_fraction",
    "text_field",
    "sampling",
    "pack",
    "document_mask",
    "prefetch",
    "lr",
    "beta1",
    "eps",
    "grad_clip",
    "warmup_steps",
    "min_lr",
    "decay",
    "seed",
    "batch_size",
    "seq_len",
    "grad_accum",
    "max_steps",
    "device",
    "on_nonfinite",
    "parallel",
    "fused_kernels",
    "activation_checkpointing",
    "interval",
    "keep_last",
    "peak_tflops",
    "tensorboard",
    "rank",
    "alpha",
    "targets",
    "base_dtype",
    "bogus",
];

fn dictionary() -> Arc<Dictionary> {
    Arc::new(Dictionary {
        seeds: SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        extremes: support::TOML_EXTREMES,
        keys: KEYS.iter().map(|k| k.to_string()).collect(),
    })
}

/// An error names a key: a `config` error whose key is a dotted `section.key`, a section, or
/// the offending override. An empty key passes only where the empty string is itself the name
/// at fault (TOML allows `"" = 1`: "config ``: unknown section"); an override with no key at
/// all is reported under `--set` with the override quoted (see [`set_override_without_a_key`]).
fn names_key(err: &TrainError) -> bool {
    match err {
        TrainError::Config { key, reason } => {
            !key.is_empty() || !reason.starts_with("expected `section.key=value`")
        }
        _ => false,
    }
}

fn check_names_key(err: &TrainError) -> Result<(), TestCaseError> {
    prop_assert!(names_key(err), "error names no key: {err:?} ({err})");
    Ok(())
}

/// Keys of the shipped configs, so that most overrides reach value validation.
const PATHS: &[&str] = &[
    "model.vocab_size",
    "model.hidden_size",
    "model.num_attention_heads",
    "model.num_key_value_heads",
    "model.head_dim",
    "model.rms_norm_eps",
    "model.rope_theta",
    "model.rope_scaling",
    "model.num_experts",
    "model.from",
    "data.kind",
    "data.inputs",
    "data.val_fraction",
    "data.sampling",
    "data.pack",
    "data.packing",
    "optimizer.lr",
    "optimizer.beta2",
    "optimizer.eps",
    "optimizer.grad_clip",
    "schedule.warmup_steps",
    "schedule.min_lr",
    "schedule.decay",
    "schedule.decay_fraction",
    "schedule.decay_shape",
    "training.seed",
    "training.batch_size",
    "training.seq_len",
    "training.max_steps",
    "training.device",
    "training.sample_temperature",
    "training.on_nonfinite",
    "checkpoint.keep_last",
    "logging.interval",
    "logging.peak_tflops.flex",
    "lora.rank",
    "lora.alpha",
    "lora.targets",
];

/// `--set` items: `section.key=value` from known names and extreme values, and malformed ones.
fn override_item() -> impl Strategy<Value = String> {
    let name = || prop::sample::select(KEYS.to_vec());
    let value = prop_oneof![
        4 => prop::sample::select(support::TOML_EXTREMES.to_vec()).prop_map(str::to_string),
        1 => "[ -~]{0,12}",
    ];
    prop_oneof![
        8 => (prop::sample::select(PATHS.to_vec()), value.clone())
            .prop_map(|(p, v)| format!("{p}={v}")),
        4 => (name(), name(), value.clone()).prop_map(|(s, k, v)| format!("{s}.{k}={v}")),
        2 => (name(), name(), name(), value.clone())
            .prop_map(|(s, k, j, v)| format!("{s}.{k}.{j}={v}")),
        1 => (name(), value.clone()).prop_map(|(k, v)| format!("{k}={v}")),
        1 => "[ -~]{0,24}",
        1 => prop::sample::select(vec![
            ".=", "a.=1", ".a=1", "model..x=1", "model.from", " model . from = 'x' ", "a.b",
        ])
        .prop_map(str::to_string),
    ]
}

#[test]
fn run_config_toml_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    let strategy = (
        support::mutated(dictionary(), support::edit().boxed()),
        proptest::collection::vec(override_item(), 0..3),
    );
    let tally = Tally::default();
    support::run(
        "run-config TOML (RunConfig::load)",
        strategy,
        &tally,
        |(Bytes(input), overrides)| {
            std::fs::write(&path, &input).unwrap();
            let len = input.len() + overrides.iter().map(String::len).sum::<usize>();
            let (result, peak) = support::measure(&input, || RunConfig::load(&path, &overrides));
            tally.add(result.is_ok(), len, peak);
            TOML_BOUND.check("run config", len, peak)?;
            if let Err(e) = &result {
                let names_file = e.to_string().contains(&path.display().to_string());
                prop_assert!(
                    names_file || names_key(e),
                    "error names neither the file nor a key: {e:?} ({e})"
                );
            }
            Ok(())
        },
    );
}

/// `from_table` on the tables that value, key and nesting edits produce (the inputs they leave
/// unparsable are skipped here; the file test above covers the TOML parser).
#[test]
fn run_config_table() {
    let tally = Tally::default();
    support::run(
        "run-config table (RunConfig::from_table)",
        support::mutated_with(dictionary(), support::value_edit().boxed(), 0),
        &tally,
        |Bytes(input)| {
            let Ok(text) = std::str::from_utf8(&input) else {
                return Ok(());
            };
            let Ok(table) = text.parse::<toml::Table>() else {
                return Ok(());
            };
            let (result, peak) = support::measure(&input, || RunConfig::from_table(table));
            tally.add(result.is_ok(), input.len(), peak);
            TOML_BOUND.check("run-config table", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_key(e)?;
            }
            Ok(())
        },
    );
}

#[test]
fn set_overrides() {
    let tables: Vec<toml::Table> = SEEDS.iter().map(|s| s.parse().unwrap()).collect();
    let strategy = (
        0..tables.len(),
        proptest::collection::vec(override_item(), 1..5),
    );
    let tally = Tally::default();
    support::run(
        "--set overrides (apply_overrides, RunConfig::from_table)",
        strategy,
        &tally,
        |(seed, overrides)| {
            let mut table = tables[seed].clone();
            let joined = overrides.join("\n");
            let (result, peak) = support::measure(joined.as_bytes(), || {
                apply_overrides(&mut table, &overrides)?;
                RunConfig::from_table(table)
            });
            tally.add(result.is_ok(), joined.len(), peak);
            TOML_BOUND.check("--set", joined.len(), peak)?;
            if let Err(e) = &result {
                check_names_key(e)?;
            }
            Ok(())
        },
    );
}

/// `--set ""`, `--set =1` and the like name the override as given (key `--set`).
#[test]
fn set_override_without_a_key() {
    let table: toml::Table = SEEDS[0].parse().unwrap();
    for item in ["", "=", "=1", " = 1", "=nan"] {
        let mut t = table.clone();
        let e = apply_overrides(&mut t, &[item.to_string()]).unwrap_err();
        assert!(names_key(&e), "`--set {item:?}`: {e}");
        assert!(
            e.to_string().contains(&format!("`{item}`")),
            "the override is not quoted: {e}"
        );
    }
}

/// The keys whose value is one of a few names (an enum).
const CHOICE_PATHS: &[&str] = &[
    "data.kind",
    "data.sampling",
    "optimizer.kind",
    "optimizer.muon.adjust_lr",
    "schedule.decay",
    "schedule.decay_shape",
    "training.on_nonfinite",
    "training.parallel",
    "training.activation_checkpointing",
    "lora.base_dtype",
];

/// A bool or a number where a named choice belongs is an error naming the key, its values (in
/// backticks) and the type given, never serde's "unit variant" wording.
#[test]
fn named_choices_given_a_bool_or_number_name_their_values() {
    let table: toml::Table = include_str!("../../../configs/finetune.toml")
        .parse()
        .unwrap();
    let value = prop_oneof![
        any::<bool>().prop_map(|b| (b.to_string(), "a boolean")),
        any::<i64>().prop_map(|i| (i.to_string(), "an integer")),
        (-1e9f64..1e9).prop_map(|f| (format!("{f:?}"), "a float")),
    ];
    let strategy = (prop::sample::select(CHOICE_PATHS.to_vec()), value);
    let tally = Tally::default();
    support::run(
        "named choices given a bool or a number",
        strategy,
        &tally,
        |(path, (value, given))| {
            let mut t = table.clone();
            let item = format!("{path}={value}");
            let result = apply_overrides(&mut t, std::slice::from_ref(&item))
                .and_then(|()| RunConfig::from_table(t));
            tally.add(result.is_ok(), item.len(), 0);
            let Err(e) = result else {
                return Err(TestCaseError::fail(format!("`--set {item}` was accepted")));
            };
            let text = e.to_string();
            prop_assert!(
                text.contains(path) && text.contains("expected one of `") && text.contains(given),
                "`--set {item}`: {text}"
            );
            prop_assert!(!text.contains("unit variant"), "`--set {item}`: {text}");
            Ok(())
        },
    );
}
