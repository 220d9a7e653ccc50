//! The reference log-probabilities of a preference run: computed once with the starting model,
//! kept in `RUN/reference_logps.json` with a fingerprint of the pairs they belong to.

use std::path::Path;

use burn::module::Module;
use qwen_burn_model::Qwen3ForCausalLM;
use sha2::{Digest, Sha256};

use super::pair_logps;
use crate::error::{Result, TrainError};
use crate::run::data::DataPipeline;

/// Pairs a reference forward scores at once.
const PAIRS_PER_FORWARD: usize = 8;

/// The file of a run's reference log-probabilities.
pub const REFERENCE_FILE: &str = "reference_logps.json";

/// `[chosen, rejected]` reference log-probabilities of every pair of `data` (training pairs,
/// then validation pairs): read from the run directory when they were computed for these pairs,
/// else computed with `model` (the starting model, without autodiff) and written there.
pub fn load_or_compute(
    model: &Qwen3ForCausalLM,
    data: &DataPipeline,
    run_dir: &Path,
) -> Result<Vec<[f64; 2]>> {
    let sets = data.preference().ok_or_else(|| {
        TrainError::config(
            "data.kind",
            "the preference objective needs preference data",
        )
    })?;
    let mut hash = Sha256::new();
    for set in [&sets.train, &sets.val] {
        hash.update((set.pairs.len() as u64).to_le_bytes());
        for pair in &set.pairs {
            for seq in [&pair.chosen, &pair.rejected] {
                hash.update((seq.prompt_len as u64).to_le_bytes());
                hash.update((seq.ids.len() as u64).to_le_bytes());
                seq.ids.iter().for_each(|id| hash.update(id.to_le_bytes()));
            }
        }
    }
    let fingerprint = hex::encode(hash.finalize());
    let path = run_dir.join(REFERENCE_FILE);
    if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io("read", &path, e))?;
        let bad = |reason: String| TrainError::Checkpoint {
            path: path.clone(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        if value["fingerprint"] != fingerprint.as_str() {
            return Err(bad(
                "was computed for other preference pairs than this run's data holds (the data \
                 or data.* changed since the run started); restore the data, or start a new run"
                    .into(),
            ));
        }
        let table: Vec<[f64; 2]> = serde_json::from_value(value["logps"].clone())
            .map_err(|e| bad(format!("`logps`: {e}")))?;
        // The values are f32 log-probabilities: rounding back to f32 undoes the last-bit error
        // of JSON's decimal round trip, so a resumed run reads exactly what it wrote.
        let table: Vec<[f64; 2]> = table
            .into_iter()
            .map(|[c, r]| [f64::from(c as f32), f64::from(r as f32)])
            .collect();
        if table.len() != sets.train.pairs.len() + sets.val.pairs.len() {
            return Err(bad("holds another number of pairs than the data".into()));
        }
        return Ok(table);
    }
    let device = model
        .devices()
        .first()
        .cloned()
        .ok_or_else(|| TrainError::Other("the reference model has no device".into()))?;
    let mut table = Vec::with_capacity(sets.train.pairs.len() + sets.val.pairs.len());
    for set in [&sets.train, &sets.val] {
        table.extend(pair_logps(
            model,
            set,
            sets.seq_len,
            sets.pad,
            PAIRS_PER_FORWARD,
            &device,
        )?);
    }
    let value = serde_json::json!({"fingerprint": fingerprint, "logps": table});
    crate::files::write_replacing(&path, value.to_string())?;
    Ok(table)
}
