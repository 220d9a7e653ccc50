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
use rayon::prelude::*;

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

/// Samples per task of [`normal_samples`] (an even number: a task starts on a Box-Muller pair).
const SAMPLES_PER_TASK: usize = 1 << 16;

/// ChaCha words one Box-Muller pair consumes: two `f64`, each drawn from one `u64`.
const WORDS_PER_PAIR: u128 = 4;

/// `n` samples of N(0, std^2) by Box-Muller from the ChaCha8 stream seeded with `seed`: pair
/// `p` (samples `2p` and `2p + 1`) from the stream's words `4p..4p + 4`.
///
/// Tasks of [`SAMPLES_PER_TASK`] run on rayon's threads, each from its own copy of the stream
/// set to its first pair's word ([`ChaCha8Rng::set_word_pos`]): the same numbers as one pass
/// over the stream (`tests::tasks_draw_the_numbers_of_one_pass`), on every thread count. Most
/// of the time goes to libm's `sin`, `cos` and `log`; a Qwen3-1.7B shape draws 1.7e9 samples
/// (`benches/README.md`).
pub(crate) fn normal_samples(seed: u64, n: usize, std: f64) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    let task = |(t, chunk): (usize, &mut [f32])| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let first_pair = (t * SAMPLES_PER_TASK / 2) as u128;
        rng.set_word_pos(first_pair * WORDS_PER_PAIR);
        box_muller(&mut rng, chunk, std);
    };
    if n <= SAMPLES_PER_TASK {
        out.chunks_mut(SAMPLES_PER_TASK).enumerate().for_each(task);
    } else {
        out.par_chunks_mut(SAMPLES_PER_TASK)
            .enumerate()
            .for_each(task);
    }
    out
}

/// Fill `out` with N(0, std^2) samples from `rng`'s next pairs (an odd length drops the last
/// pair's second sample).
fn box_muller(rng: &mut ChaCha8Rng, out: &mut [f32], std: f64) {
    for pair in out.chunks_mut(2) {
        let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let theta = 2.0 * std::f64::consts::PI * u2;
        pair[0] = (r * theta.cos()) as f32;
        if let Some(second) = pair.get_mut(1) {
            *second = (r * theta.sin()) as f32;
        }
    }
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
            _ => normal_samples(self.seed ^ fnv1a(&key), n, self.std),
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
        let values = normal_samples(
            self.seed ^ fnv1a(&key),
            shape.num_elements(),
            1.0 / rank as f64,
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: one pass over the stream, a pair at a time.
    fn one_pass(seed: u64, n: usize, std: f64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = Vec::with_capacity(n + 1);
        while out.len() < n {
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random::<f64>();
            let r = (-2.0 * u1.ln()).sqrt() * std;
            let theta = 2.0 * std::f64::consts::PI * u2;
            out.push((r * theta.cos()) as f32);
            out.push((r * theta.sin()) as f32);
        }
        out.truncate(n);
        out
    }

    #[test]
    fn tasks_draw_the_numbers_of_one_pass() {
        // One task, a task boundary, an odd length in the last task, several tasks.
        let t = SAMPLES_PER_TASK;
        for (seed, n) in [(7, 0), (7, 1), (7, 5), (3, t), (3, t + 1), (11, 3 * t + 7)] {
            let got = normal_samples(seed, n, 0.02);
            let want = one_pass(seed, n, 0.02);
            assert_eq!(got.len(), n);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "seed {seed}, {n} samples: tasks differ from one pass");
        }
    }

    #[test]
    fn another_seed_draws_other_numbers() {
        let (a, b) = (normal_samples(1, 64, 1.0), normal_samples(2, 64, 1.0));
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    }
}
