//! Seeded, device-independent weight initialisation.
//!
//! Burn's initialisers draw from the device's own RNG, so flex, ndarray and wgpu would start
//! from different weights. Here every parameter is drawn on the host from a ChaCha stream keyed
//! by `(seed, parameter key)`, which gives the same initial model on every device and in every
//! layer order: the basis of cross-device loss comparisons and exact resume.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{DType, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::Qwen3ForCausalLM;

struct Initialiser {
    seed: u64,
    /// Storage of the 2-D parameters (f32, or bf16 for frozen LoRA bases).
    matrices: DType,
    std: f64,
    names: Vec<String>,
    containers: Vec<String>,
}

/// FNV-1a, to turn a parameter key into a stream id.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `n` samples of N(0, std^2) by Box-Muller.
pub(crate) fn normal_samples(rng: &mut ChaCha8Rng, n: usize, std: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let theta = 2.0 * std::f64::consts::PI * u2;
        out.push((r * theta.cos()) as f32);
        out.push((r * theta.sin()) as f32);
    }
    out.truncate(n);
    out
}

impl ModuleMapper for Initialiser {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.names.push(name.to_string());
        self.containers.push(container_type.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.names.pop();
        self.containers.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let key = self.names.join(".");
        let shape = param.lazy_shape();
        let n = shape.num_elements();
        let container = self.containers.last().map(String::as_str).unwrap_or("");
        let leaf = self.names.last().map(String::as_str).unwrap_or("");
        // HF `_init_weights`: normal(0, initializer_range) for linear and embedding weights,
        // zeros for biases, ones for RMSNorm gains.
        let values = match (container, leaf) {
            ("Struct:RmsNorm", _) => vec![1.0f32; n],
            (_, "bias") | (_, "routing_bias") => vec![0.0f32; n],
            _ => {
                let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ fnv1a(&key));
                normal_samples(&mut rng, n, self.std)
            }
        };
        let device = param.lazy_device();
        let mut tensor = Tensor::<D>::from_data(TensorData::new(values, shape), &device);
        if D == 2 && self.matrices != DType::F32 {
            // One parameter at a time: the f32 copy is freed before the next is drawn.
            tensor = tensor.cast(self.matrices);
        }
        let id = param.id;
        param.transform_for_load(tensor, id)
    }
}

/// Re-draw every parameter of `model` from `seed` (identical on every device).
pub fn init_weights(model: Qwen3ForCausalLM, seed: u64) -> Qwen3ForCausalLM {
    init_weights_as(model, seed, DType::F32)
}

/// [`init_weights`] with the matrices (every 2-D parameter: projections, experts, routers,
/// embedding, LM head) stored as `matrices`, each cast as it is drawn, so that a bf16 model
/// never holds its f32 copy whole; norms and biases stay f32. The values are the f32 draws
/// rounded to nearest.
pub fn init_weights_as(model: Qwen3ForCausalLM, seed: u64, matrices: DType) -> Qwen3ForCausalLM {
    let std = model.config.initializer_range;
    model.map(&mut Initialiser {
        seed,
        matrices,
        std,
        names: Vec::new(),
        containers: Vec::new(),
    })
}

/// Draws the `a` factor of every LoRA adapter of a model.
struct AdapterInitialiser {
    seed: u64,
    names: Vec<String>,
    containers: Vec<String>,
}

impl ModuleMapper for AdapterInitialiser {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.names.push(name.to_string());
        self.containers.push(container_type.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.names.pop();
        self.containers.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let container = self.containers.last().map(String::as_str).unwrap_or("");
        let leaf = self.names.last().map(String::as_str).unwrap_or("");
        if container != "Struct:LoraAdapter" || leaf != "a" || D != 2 {
            return param;
        }
        // Burn's LoRA draws `a: [d_in, rank]` from N(0, 1/rank) with the device's own RNG, unseeded
        // on the CPU backends; the same law here, from the run's seed and the adapter's path.
        let shape = param.lazy_shape();
        let rank = shape.dims::<D>()[D - 1].max(1);
        let key = format!("lora:{}", self.names.join("."));
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ fnv1a(&key));
        let values = normal_samples(&mut rng, shape.num_elements(), 1.0 / rank as f64);
        let device = param.lazy_device();
        let tensor = Tensor::<D>::from_data(TensorData::new(values, shape), &device);
        let id = param.id;
        param.transform_for_load(tensor, id)
    }
}

/// Re-draw the `a` factor of every LoRA adapter of `model` from `seed`, as Burn's LoRA draws it
/// (N(0, 1/rank); `b` stays zero), so that a LoRA run starts from the same adapters in every
/// process and on every device.
pub fn init_lora_adapters(model: Qwen3ForCausalLM, seed: u64) -> Qwen3ForCausalLM {
    model.map(&mut AdapterInitialiser {
        seed,
        names: Vec::new(),
        containers: Vec::new(),
    })
}
