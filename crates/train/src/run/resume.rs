//! What a resume may change. `--resume` (and `--from-checkpoint`) accepts a
//! config whose architecture and data shape (`training.batch_size`, `training.seq_len`,
//! `data.kind`, `data.sampling`, `data.pack`, `data.packing`) match the checkpoint's; everything else (the
//! schedule horizon, loss coefficients, logging, ...) may change, and each change is printed.

use std::collections::BTreeMap;
use std::path::Path;

use qwen_burn_data::Packing;
use qwen_burn_model::Qwen3Config;

use crate::config::RunConfig;
use crate::error::{Result, TrainError};

/// Keys of the HF model config that are training hyperparameters, not architecture: they may
/// change on resume. `router_bias_update_rate` is one only while it stays non-zero (zero means
/// the model has no routing-bias parameter).
const MODEL_HYPERPARAMETERS: &[&str] = &[
    "router_aux_loss_coef",
    "router_z_loss_coef",
    "output_router_logits",
    "router_bias_update_rate",
    "router_capacity_factor",
    "router_centering",
    "router_assignment_loss_coef",
    "router_aux_loss_type",
    "initializer_range",
];

fn flatten(prefix: &str, value: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// `(key, old, new)` for every key whose value differs; `-` for a missing side.
fn changed(old: &serde_json::Value, new: &serde_json::Value) -> Vec<(String, String, String)> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten("", old, &mut a);
    flatten("", new, &mut b);
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let show = |m: &BTreeMap<String, String>| m.get(k).cloned().unwrap_or("-".into());
            (k.clone(), show(&a), show(&b))
        })
        .collect()
}

fn is_hyperparameter(key: &str, old: &str, new: &str) -> bool {
    let top = key.split('.').next().unwrap_or(key);
    if !MODEL_HYPERPARAMETERS.contains(&top) {
        return false;
    }
    // Switching aux-loss-free balancing on or off adds or removes a parameter.
    let off = |v: &str| v == "-" || v.parse::<f64>().is_ok_and(|x| x == 0.0);
    top != "router_bias_update_rate" || (!off(old) && !off(new))
}

/// Field-by-field architecture differences between a checkpoint and a config, one line each.
pub fn architecture_diff(old: &Qwen3Config, new: &Qwen3Config) -> Vec<String> {
    changed(&old.to_hf_json(), &new.to_hf_json())
        .into_iter()
        .filter(|(k, a, b)| !is_hyperparameter(k, a, b))
        .map(|(k, a, b)| format!("  {k}: checkpoint {a} vs config {b}"))
        .collect()
}

/// Run settings the checkpoint's data cursor is tied to: the sampler resumes at a position in
/// a stream of global batches (`batch_size x grad_accum` rows of `seq_len`) drawn in one mode,
/// so changing one of these cannot continue that stream. The split of the global batch into
/// `batch_size` and `grad_accum` may change: the data order does not depend on it.
const CURSOR_KEYS: &[&str] = &[
    "training.batch_size x training.grad_accum",
    "training.seq_len",
    "data.kind",
    "data.sampling",
    "data.pack",
    "data.packing",
];

/// [`CURSOR_KEYS`] as written, for a saved table that no longer parses.
const WRITTEN_CURSOR_KEYS: &[&str] = &[
    "training.batch_size",
    "training.grad_accum",
    "training.seq_len",
    "data.kind",
    "data.sampling",
    "data.pack",
    "data.packing",
];

/// The [`CURSOR_KEYS`] whose resolved values differ between the checkpoint's run table and
/// `config`, as `key: checkpoint A vs config B`. Resolved, so that a default written out (or
/// left out) is no change; a saved table that no longer parses is compared as written.
fn cursor_changes(saved_run: &toml::Table, config: &RunConfig) -> Vec<String> {
    let Ok(saved) = RunConfig::from_table(saved_run.clone()) else {
        return changed(&run_json(saved_run), &run_json(&config.table))
            .into_iter()
            .filter(|(k, _, _)| WRITTEN_CURSOR_KEYS.contains(&k.as_str()))
            .map(|(k, a, b)| format!("{k}: checkpoint {a} vs config {b}"))
            .collect();
    };
    let saved_packing = crate::config::data_keys::saved_packing(saved_run, &saved);
    let values = |c: &RunConfig, packing: Packing| {
        [
            (c.training.batch_size * c.training.grad_accum).to_string(),
            c.training.seq_len.to_string(),
            c.data.kind.as_str().to_string(),
            format!("{:?}", c.data.sampling).to_lowercase(),
            c.data.pack.to_string(),
            packing.to_string(),
        ]
    };
    CURSOR_KEYS
        .iter()
        .zip(
            values(&saved, saved_packing)
                .into_iter()
                .zip(values(config, config.data.packing)),
        )
        .filter(|(_, (a, b))| a != b)
        .map(|(k, (a, b))| format!("{k}: checkpoint {a} vs config {b}"))
        .collect()
}

/// The `[model]`-less run table as JSON, for comparisons.
fn run_json(t: &toml::Table) -> serde_json::Value {
    let mut t = t.clone();
    t.remove("model");
    crate::config::toml_to_json(&toml::Value::Table(t))
}

/// Notices for every non-architecture change between the checkpoint's run and this one.
fn change_notices(
    saved_model: &Qwen3Config,
    new_model: &Qwen3Config,
    saved_run: &toml::Table,
    new_run: &toml::Table,
) -> Vec<String> {
    let mut notices: Vec<String> = changed(&saved_model.to_hf_json(), &new_model.to_hf_json())
        .into_iter()
        .filter(|(k, a, b)| is_hyperparameter(k, a, b))
        .map(|(k, a, b)| {
            let effect = if k == "initializer_range" {
                " (no effect: the weights come from the checkpoint)"
            } else {
                " (applies from the next step)"
            };
            // The HF JSON leaves out our extra router settings when they are 0 (off).
            let show = |v: String| if v == "-" { "0".to_string() } else { v };
            format!("model.{k}: {} -> {}{effect}", show(a), show(b))
        })
        .collect();
    // The `[model]` table is compared above, as the resolved architecture.
    for (k, a, b) in changed(&run_json(saved_run), &run_json(new_run)) {
        let effect = match k.as_str() {
            "training.max_steps" => format!(
                " (the learning-rate schedule is re-planned over {b} steps; the steps already \
                 taken keep the rates they had)"
            ),
            "training.seed" => {
                " (no effect: the weights and the data order continue the checkpoint's)".into()
            }
            key if key.starts_with("data.") => {
                " (the batches from here on differ from the original run's)".into()
            }
            _ => String::new(),
        };
        notices.push(format!("{k}: {a} -> {b}{effect}"));
    }
    notices
}

/// The `run.toml` of a checkpoint.
pub(super) fn read_run_toml(dir: &Path) -> Result<toml::Table> {
    let path = dir.join("run.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io("read", &path, e))?;
    text.parse()
        .map_err(|e: toml::de::Error| TrainError::Parse {
            path: path.clone(),
            reason: e.to_string(),
        })
}

/// Check that the run of `config` may resume from checkpoint `dir`, and return a notice for
/// each setting that changed. An architecture change (or a LoRA change) is an error listing the
/// differences.
pub fn check_resume(dir: &Path, config: &RunConfig, model: &Qwen3Config) -> Result<Vec<String>> {
    let saved = Qwen3Config::from_file(&dir.join("config.json"))?;
    let diffs = architecture_diff(&saved, model);
    if !diffs.is_empty() {
        return Err(TrainError::ArchitectureChanged {
            path: dir.to_path_buf(),
            diffs: diffs.join("\n"),
        });
    }
    let state = super::checkpoint::load_state(dir)?;
    if state.lora != config.lora {
        return Err(TrainError::ArchitectureChanged {
            path: dir.to_path_buf(),
            diffs: format!(
                "  lora: checkpoint {:?} vs config {:?}",
                state.lora, config.lora
            ),
        });
    }
    let saved_run = read_run_toml(dir)?;
    if let Ok(saved) = RunConfig::from_table(saved_run.clone())
        && saved.optimizer.kind != config.optimizer.kind
    {
        return Err(TrainError::Checkpoint {
            path: dir.to_path_buf(),
            reason: format!(
                "continuing a checkpoint (--resume or --from-checkpoint) cannot change \
                 optimizer.kind from \"{}\" (the checkpoint's) to \"{}\": the optimizer state \
                 it holds is the other optimizer's; start a new run to change it",
                saved.optimizer.kind.as_str(),
                config.optimizer.kind.as_str()
            ),
        });
    }
    let fixed = cursor_changes(&saved_run, config);
    if !fixed.is_empty() {
        return Err(TrainError::Checkpoint {
            path: dir.to_path_buf(),
            reason: format!(
                "continuing a checkpoint (--resume or --from-checkpoint) cannot change {} (the \
                 checkpoint's data position is a place in a stream of rows of that shape and \
                 kind); start a new run to change it",
                fixed.join(", ")
            ),
        });
    }
    Ok(change_notices(&saved, model, &saved_run, &config.table))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn moe(patch: serde_json::Value) -> Qwen3Config {
        let mut v = json!({
            "model_type": "qwen3_moe", "vocab_size": 32, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
            "output_router_logits": true, "router_aux_loss_coef": 0.01,
            "router_bias_update_rate": 0.001,
        });
        for (k, x) in patch.as_object().unwrap() {
            v[k] = x.clone();
        }
        Qwen3Config::from_json(&v, true).unwrap()
    }

    #[test]
    fn loss_coefficients_are_hyperparameters_and_the_shape_is_architecture() {
        let base = moe(json!({}));
        let coefs = moe(
            json!({"router_aux_loss_coef": 0.02, "router_z_loss_coef": 0.001,
                               "router_bias_update_rate": 0.002}),
        );
        assert!(architecture_diff(&base, &coefs).is_empty());
        let notices = change_notices(&base, &coefs, &toml::Table::new(), &toml::Table::new());
        assert_eq!(notices.len(), 3, "{notices:?}");
        assert!(
            notices
                .iter()
                .any(|n| n.contains("router_aux_loss_coef: 0.01 -> 0.02"))
        );

        let wider = moe(json!({"hidden_size": 32}));
        let diff = architecture_diff(&base, &wider);
        assert_eq!(diff, vec!["  hidden_size: checkpoint 16 vs config 32"]);
        // Turning aux-loss-free balancing off removes the routing-bias parameters.
        let no_bias = moe(json!({"router_bias_update_rate": 0.0}));
        assert_eq!(architecture_diff(&base, &no_bias).len(), 1);
    }

    #[test]
    fn run_config_changes_are_listed_with_their_effect() {
        let m = moe(json!({}));
        let old: toml::Table = "[training]\nmax_steps = 6\n[logging]\ninterval = 1"
            .parse()
            .unwrap();
        let new: toml::Table = "[training]\nmax_steps = 10\n[logging]\ninterval = 1"
            .parse()
            .unwrap();
        let notices = change_notices(&m, &m, &old, &new);
        assert_eq!(notices.len(), 1);
        assert!(notices[0].starts_with("training.max_steps: 6 -> 10 (the learning-rate schedule"));
    }

    #[test]
    fn the_data_shape_is_compared_resolved_not_as_written() {
        let table = |extra: &str| -> toml::Table {
            format!(
                "[model]\nvocab_size = 64\nhidden_size = 16\nintermediate_size = 32\n\
                 num_hidden_layers = 1\nnum_attention_heads = 2\nhead_dim = 8\n\
                 [data]\ninputs = [\"x.txt\"]\ntokenizer = \"t.json\"\n{extra}\n\
                 [optimizer]\nlr = 1e-3\n[training]\nbatch_size = 2\nseq_len = 8\nmax_steps = 10\n"
            )
            .parse()
            .unwrap()
        };
        let saved = table("");
        // Defaults written out are no change.
        let same = RunConfig::from_table(table("sampling = \"random\"")).unwrap();
        assert!(cursor_changes(&saved, &same).is_empty());
        let mut other = table("sampling = \"epochs\"");
        other["training"]["batch_size"] = toml::Value::Integer(4);
        let other = RunConfig::from_table(other).unwrap();
        assert_eq!(
            cursor_changes(&saved, &other),
            [
                "training.batch_size x training.grad_accum: checkpoint 2 vs config 4",
                "data.sampling: checkpoint random vs config epochs"
            ]
        );
        // Another split of the same global batch is no change.
        let mut split = table("");
        split["training"]["batch_size"] = toml::Value::Integer(1);
        split["training"]
            .as_table_mut()
            .unwrap()
            .insert("grad_accum".into(), toml::Value::Integer(2));
        let split = RunConfig::from_table(split).unwrap();
        assert!(cursor_changes(&saved, &split).is_empty());
    }

    #[test]
    fn a_packed_sft_checkpoint_from_before_data_packing_packed_in_file_order() {
        let table = |extra: &str| -> toml::Table {
            format!(
                "[model]\nvocab_size = 64\nhidden_size = 16\nintermediate_size = 32\n\
                 num_hidden_layers = 1\nnum_attention_heads = 2\nhead_dim = 8\n\
                 [data]\nkind = \"sft\"\ninputs = [\"c.jsonl\"]\ntokenizer = \"t.json\"\n{extra}\n\
                 [optimizer]\nlr = 1e-3\n[training]\nbatch_size = 2\nseq_len = 8\nmax_steps = 10\n"
            )
            .parse()
            .unwrap()
        };
        // A new run records its packing in the table its checkpoints store.
        let new = RunConfig::from_table(table("")).unwrap();
        assert_eq!(
            new.table["data"]["packing"].as_str(),
            Some("best_fit_decreasing")
        );
        assert!(cursor_changes(&new.table, &new).is_empty());
        // An older checkpoint's table has no `data.packing`: its rows were packed in order.
        let old = table("");
        assert_eq!(
            cursor_changes(&old, &new),
            ["data.packing: checkpoint in_order vs config best_fit_decreasing"]
        );
        let in_order = RunConfig::from_table(table("packing = \"in_order\"")).unwrap();
        assert!(cursor_changes(&old, &in_order).is_empty());
        // Unpacked rows place nothing: the key is neither needed nor accepted.
        let unpacked = RunConfig::from_table(table("pack = false")).unwrap();
        assert!(
            !unpacked.table["data"]
                .as_table()
                .unwrap()
                .contains_key("packing")
        );
        assert!(cursor_changes(&table("pack = false"), &unpacked).is_empty());
        assert!(RunConfig::from_table(table("pack = false\npacking = \"in_order\"")).is_err());
    }
}
