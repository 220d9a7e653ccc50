//! HF safetensors import and export: the one place where Burn and HF layouts meet.
//!
//! Parameter paths of [`Qwen3ForCausalLM`] are the HF keys already (`model.layers.0.self_attn
//! .q_proj.weight`, `lm_head.weight`, ...), so the only mapping is the layout of linear weights:
//! Burn stores `[in, out]`, PyTorch `[out, in]`. Loading is strict: a missing tensor, an
//! unexpected tensor or a tensor of the wrong shape is an error that names the key and both
//! shapes. F32, F16 and BF16 files load (cast to f32); sharded checkpoints load through
//! `model.safetensors.index.json`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{DType, Device, Tensor, TensorData};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, SafeTensors};

use crate::config::Qwen3Config;
use crate::error::{ModelError, Result};
use crate::model::Qwen3ForCausalLM;

/// Keys a checkpoint may hold that carry no parameter (old HF rotary buffers).
fn is_ignorable(key: &str) -> bool {
    key.ends_with("rotary_emb.inv_freq")
}

/// A file name with no directory part (one normal path component).
fn is_plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    )
}

/// Parameters that exist in our model but never in HF checkpoints.
pub(crate) fn is_ours_only(key: &str) -> bool {
    key.ends_with(".routing_bias")
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    header_len: usize,
    metadata: Metadata,
}

/// The safetensors file(s) of an HF model directory, memory-mapped.
pub struct SafetensorsCheckpoint {
    shards: Vec<Shard>,
    /// key -> shard index
    keys: HashMap<String, usize>,
    desc: String,
}

/// The shard files a `model.safetensors.index.json` lists, sorted and without repeats.
pub fn index_shards(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| ModelError::io("read", index, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::ConfigParse {
            path: index.to_path_buf(),
            reason: e.to_string(),
        })?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::ConfigParse {
            path: index.to_path_buf(),
            reason: "missing object `weight_map`".into(),
        })?;
    let mut names = BTreeSet::new();
    for (key, value) in map {
        // Shards are files beside the index: a path elsewhere (`../x`, `/dev/stdin`) would let
        // a downloaded index make us open any file, a FIFO or a device.
        let name = value
            .as_str()
            .filter(|n| is_plain_file_name(n))
            .ok_or_else(|| ModelError::ConfigParse {
                path: index.to_path_buf(),
                reason: format!(
                    "weight_map entry `{key}` is {value}, expected the file name of a shard in \
                     the same directory"
                ),
            })?;
        names.insert(name.to_string());
    }
    Ok(names.into_iter().collect())
}

impl SafetensorsCheckpoint {
    /// Open `dir/model.safetensors`, or the shards listed in `dir/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let files: Vec<PathBuf> = if index.exists() {
            index_shards(&index)?
                .into_iter()
                .map(|n| dir.join(n))
                .collect()
        } else if single.exists() {
            vec![single]
        } else {
            return Err(ModelError::InvalidInput(format!(
                "no model.safetensors or model.safetensors.index.json in {}",
                dir.display()
            )));
        };
        let mut shards = Vec::new();
        let mut keys = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(|e| ModelError::io("open", &path, e))?;
            // SAFETY: the file is opened read-only and we never hand out references that outlive
            // the map; a concurrent writer could change bytes under us, as with any mmap reader.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io("map", &path, e))?;
            let (header_len, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Safetensors {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            for name in metadata.tensors().keys() {
                keys.insert(name.clone(), shards.len());
            }
            shards.push(Shard {
                path,
                mmap,
                header_len,
                metadata,
            });
        }
        Ok(Self {
            shards,
            keys,
            desc: dir.display().to_string(),
        })
    }

    /// All tensor names.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.keys.keys()
    }

    /// Read tensor `key` as f32 with its shape; `None` if absent.
    pub fn read_f32(&self, key: &str) -> Option<Result<(Vec<usize>, Vec<f32>)>> {
        let shard = &self.shards[*self.keys.get(key)?];
        let info = shard.metadata.info(key)?;
        let (start, end) = info.data_offsets;
        let base = 8 + shard.header_len;
        let Some(bytes) = shard.mmap.get(base + start..base + end) else {
            return Some(Err(ModelError::Safetensors {
                path: shard.path.clone(),
                reason: format!("tensor `{key}` points past the end of the file"),
            }));
        };
        let values: Vec<f32> = match info.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Some(Err(ModelError::UnsupportedDType {
                    key: key.to_string(),
                    dtype: format!("{other:?}"),
                    source_desc: self.desc.clone(),
                }));
            }
        };
        Some(Ok((info.shape.clone(), values)))
    }
}

/// One tensor in HF terms: key, HF-layout shape, f32 values.
pub type HfTensor = (String, Vec<usize>, Vec<f32>);

/// Tracks the HF key of the parameter being visited.
#[derive(Default)]
struct KeyPath {
    names: Vec<Option<String>>,
    containers: Vec<String>,
}

impl KeyPath {
    fn enter(&mut self, name: &str, container: &str) {
        // Enum variants (Dense / Sparse feed-forward) are not part of the HF key.
        let part = (!container.starts_with("Enum:")).then(|| name.to_string());
        self.names.push(part);
        self.containers.push(container.to_string());
    }

    fn exit(&mut self) {
        self.names.pop();
        self.containers.pop();
    }

    fn key(&self) -> String {
        self.names
            .iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Linear weights are `[in, out]` in Burn and `[out, in]` in HF.
    fn is_linear_weight(&self) -> bool {
        self.containers.last().is_some_and(|c| c == "Struct:Linear")
            && self.key().ends_with(".weight")
    }
}

struct Loader<'a> {
    checkpoint: &'a SafetensorsCheckpoint,
    /// Storage of the 2-D parameters, cast tensor by tensor as they load.
    matrices: DType,
    path: KeyPath,
    consumed: HashSet<String>,
    errors: Vec<ModelError>,
}

impl ModuleMapper for Loader<'_> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let key = self.path.key();
        if is_ours_only(&key) {
            return param;
        }
        let linear = self.path.is_linear_weight();
        let mut expected = param.lazy_shape().to_vec();
        if linear {
            expected.reverse();
        }
        let (shape, values) = match self.checkpoint.read_f32(&key) {
            None => {
                self.errors.push(ModelError::MissingTensor {
                    key,
                    expected,
                    source_desc: self.checkpoint.desc.clone(),
                });
                return param;
            }
            Some(Err(e)) => {
                self.errors.push(e);
                return param;
            }
            Some(Ok(read)) => read,
        };
        self.consumed.insert(key.clone());
        if shape != expected {
            self.errors.push(ModelError::ShapeMismatch {
                key,
                expected,
                found: shape,
                source_desc: self.checkpoint.desc.clone(),
            });
            return param;
        }
        let device = param.lazy_device();
        let mut tensor = Tensor::<D>::from_data(TensorData::new(values, shape), &device);
        if linear {
            // Materialise the transpose once so matmuls read a contiguous [in, out] weight.
            let dims = param.lazy_shape().to_vec();
            tensor = Tensor::from_data(tensor.transpose().into_data(), &device);
            debug_assert_eq!(tensor.dims().to_vec(), dims);
        }
        if D == 2 && self.matrices != DType::F32 {
            tensor = tensor.cast(self.matrices);
        }
        let id = param.id;
        param.transform_for_load(tensor, id)
    }
}

impl Qwen3ForCausalLM {
    /// Load an HF model directory (`config.json` + safetensors) onto `device`.
    pub fn from_pretrained(dir: &Path, device: &Device) -> Result<Self> {
        Self::from_pretrained_as(dir, device, DType::F32)
    }

    /// [`Self::from_pretrained`] with the matrices (2-D parameters) stored as `matrices`, each
    /// cast as it is read: a bf16 load never holds the f32 model whole. Norms stay f32.
    pub fn from_pretrained_as(dir: &Path, device: &Device, matrices: DType) -> Result<Self> {
        let config_path = dir.join("config.json");
        let config = Qwen3Config::from_file(&config_path)?;
        config.check_fits_in_memory(&format!("the model of {}", config_path.display()))?;
        let checkpoint = SafetensorsCheckpoint::open(dir)?;
        Self::new(&config, device).load_safetensors_as(&checkpoint, matrices)
    }

    /// Replace every parameter with the checkpoint's tensor, strictly.
    pub fn load_safetensors(self, checkpoint: &SafetensorsCheckpoint) -> Result<Self> {
        self.load_safetensors_as(checkpoint, DType::F32)
    }

    /// [`Self::load_safetensors`], the matrices stored as `matrices`.
    pub fn load_safetensors_as(
        self,
        checkpoint: &SafetensorsCheckpoint,
        matrices: DType,
    ) -> Result<Self> {
        let tied = self.config.tie_word_embeddings;
        let mut loader = Loader {
            checkpoint,
            matrices,
            path: KeyPath::default(),
            consumed: HashSet::new(),
            errors: Vec::new(),
        };
        let model = self.map(&mut loader);
        if let Some(first) = loader.errors.into_iter().next() {
            return Err(first);
        }
        let mut unexpected: Vec<String> = checkpoint
            .keys()
            .filter(|k| !loader.consumed.contains(*k) && !is_ignorable(k))
            // Tied models use embed_tokens; some hub files still ship a copy of lm_head.
            .filter(|k| !(tied && k.as_str() == "lm_head.weight"))
            .map(|k| match checkpoint.read_f32(k) {
                Some(Ok((shape, _))) => format!("{k} {shape:?}"),
                _ => k.clone(),
            })
            .collect();
        if !unexpected.is_empty() {
            unexpected.sort();
            return Err(ModelError::UnexpectedTensors {
                keys: unexpected.join(", "),
                source_desc: checkpoint.desc.clone(),
            });
        }
        Ok(model)
    }

    /// Every parameter under its HF key, in HF layout, as f32.
    pub fn hf_state_dict(&self) -> Result<Vec<HfTensor>> {
        let mut exporter = Exporter {
            path: KeyPath::default(),
            tensors: Vec::new(),
            error: None,
        };
        // bf16 matrices (a LoRA base) widen first: the adapters merge into f32 weights.
        self.clone()
            .with_matrices(DType::F32)
            .materialize()
            .visit(&mut exporter);
        match exporter.error {
            Some(e) => Err(e),
            None => Ok(exporter.tensors),
        }
    }

    /// Drop the routing bias values (aux-loss-free balancing) so the model can be exported.
    pub fn without_routing_bias(mut self) -> Self {
        for layer in &mut self.model.layers {
            if let crate::block::FeedForward::Sparse(moe) = &mut layer.mlp {
                moe.routing_bias = None;
            }
        }
        self
    }
}

struct Exporter {
    path: KeyPath,
    tensors: Vec<HfTensor>,
    error: Option<ModelError>,
}

impl ModuleVisitor for Exporter {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let key = self.path.key();
        let mut tensor = param.val();
        if self.path.is_linear_weight() {
            tensor = tensor.transpose();
        }
        let shape = tensor.dims().to_vec();
        match tensor.try_into_vec_as::<f32>() {
            Ok(values) => self.tensors.push((key, shape, values)),
            Err(e) => {
                self.error.get_or_insert(ModelError::TensorRead {
                    key,
                    reason: format!("{e:?}"),
                });
            }
        }
    }
}
