//! Writing a model as HF transformers' `save_pretrained` does: `config.json` (with
//! `torch_dtype`), and the weights in one `model.safetensors`, or above a size threshold in
//! shards `model-0000i-of-0000n.safetensors` with a `model.safetensors.index.json` mapping each
//! tensor to its shard (`metadata.total_size` in bytes). Every file goes to a temporary name and
//! is renamed, so a crash never leaves a half-written file under a final name; the index (or
//! the single file) is written last.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::error::{ModelError, Result};
use crate::model::Qwen3ForCausalLM;
use crate::weights::is_ours_only;

/// transformers' default `max_shard_size` ("5GB", decimal).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// The index file of a sharded model.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Write `model` into `dir` with shards of at most `max_shard_bytes` (a tensor larger than that
/// gets a shard of its own). Returns the weight files written (shards and index, or the single
/// file), for the caller to remove what an earlier model left there.
pub fn save_pretrained(
    model: &Qwen3ForCausalLM,
    dir: &Path,
    max_shard_bytes: u64,
) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io("create directory", dir, e))?;
    let mut tensors = model.hf_state_dict()?;
    if let Some((key, _, _)) = tensors
        .iter()
        .find(|(k, _, values)| is_ours_only(k) && values.iter().any(|v| *v != 0.0))
    {
        return Err(ModelError::Export(format!(
            "`{key}` (aux-loss-free routing bias) is non-zero and HF Qwen3-MoE has no such \
             parameter, so transformers would route differently; export with the bias dropped \
             only if that is acceptable"
        )));
    }
    tensors.retain(|(k, _, _)| !is_ours_only(k));
    // Shards in state-dict order, as transformers fills them.
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut size = 0u64;
    for (i, (_, _, values)) in tensors.iter().enumerate() {
        let bytes = 4 * values.len() as u64;
        if size > 0 && size + bytes > max_shard_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        shards.last_mut().expect("one shard").push(i);
        size += bytes;
    }
    let n = shards.len();
    let names: Vec<String> = if n == 1 {
        vec!["model.safetensors".into()]
    } else {
        (1..=n)
            .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
            .collect()
    };
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (shard, name) in shards.iter().zip(&names) {
        let bytes: Vec<(&str, &[usize], Vec<u8>)> = shard
            .iter()
            .map(|&i| {
                let (k, shape, values) = &tensors[i];
                (
                    k.as_str(),
                    shape.as_slice(),
                    values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                )
            })
            .collect();
        let views = bytes
            .iter()
            .map(|(k, shape, data)| {
                total += data.len() as u64;
                weight_map.insert(k.to_string(), name.clone());
                TensorView::new(Dtype::F32, shape.to_vec(), data)
                    .map(|v| (k.to_string(), v))
                    .map_err(|e| ModelError::Export(format!("tensor `{k}`: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let tmp = dir.join(format!("{name}.tmp"));
        safetensors::serialize_to_file(views, Some(metadata), &tmp).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            ModelError::Safetensors {
                path: tmp.clone(),
                reason: e.to_string(),
            }
        })?;
        let path = dir.join(name);
        std::fs::rename(&tmp, &path).map_err(|e| ModelError::io("rename", &path, e))?;
    }
    let mut written = names;
    if n > 1 {
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        let path = dir.join(INDEX_FILE);
        let tmp = dir.join(format!("{INDEX_FILE}.tmp"));
        std::fs::write(&tmp, format!("{index:#}\n"))
            .map_err(|e| ModelError::io("write", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| ModelError::io("rename", &path, e))?;
        written.push(INDEX_FILE.into());
    }
    model.config.save(dir)?;
    Ok(written)
}

impl Qwen3ForCausalLM {
    /// Write `config.json` and the safetensors that HF transformers loads with the same
    /// logits, sharded above [`DEFAULT_MAX_SHARD_BYTES`] (see [`save_pretrained`]).
    pub fn save_pretrained(&self, dir: &Path) -> Result<Vec<String>> {
        save_pretrained(self, dir, DEFAULT_MAX_SHARD_BYTES)
    }
}
