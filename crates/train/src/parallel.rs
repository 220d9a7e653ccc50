//! Data parallelism: one model replica per device, each on its share of the step's
//! micro-batches, gradients summed on the first device, one optimizer step there, weights
//! forked back to the others. This is Burn's "MultiDevice / optimizer on the main device"
//! scheme (`burn-train` `ExecutionStrategy::MultiDevice`), written for our step-checkpointed
//! loop; it works on every backend.
//!
//! Two uses:
//! - several GPUs: `--device cuda:0,cuda:1` (or wgpu devices);
//! - one CPU device named twice (`--device flex,flex`): two threads each run a micro-batch. On a
//!   2-core machine this keeps both cores busy through the many single-threaded element-wise
//!   ops of a small model (see benches/README.md).
//!
//! The result equals gradient accumulation over the same micro-batches on one device: the
//! cross-entropy is normalised by the whole step's target count (tests/parallel.rs).
//!
//! Burn 0.22.1 also has a true all-reduce DDP (`burn::tensor::distributed::all_reduce`, NCCL,
//! CUDA only, one node), driven by burn-train's epoch-based `ExecutionStrategy::ddp`. It is not
//! used here: this trainer is step-checkpointed (burn-train checkpoints per epoch only), the
//! CUDA backend cannot be built on the development machine (it downloads LLVM at build time), so
//! an NCCL path could be neither compiled nor tested here, and for 2-8 GPUs on one node the
//! gather-to-main scheme costs one extra weight broadcast per step.

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::Device;
use qwen_burn_data::Batch;
use qwen_burn_model::{DeviceSet, Qwen3ForCausalLM};

use crate::error::{Result, TrainError};
use crate::step::{StepStats, StepSync, count_targets, forward_backward_part};

/// The devices of a run; the first holds the master weights and the optimizer.
#[derive(Debug, Clone)]
pub struct Replicas {
    devices: Vec<Device>,
}

impl Replicas {
    /// Autodiff devices, first = main.
    pub fn new(devices: Vec<Device>) -> Self {
        assert!(!devices.is_empty(), "at least one device");
        Self { devices }
    }

    /// Autodiff replicas of a device list, for steps of `grad_accum` micro-batches, which must
    /// split evenly over them.
    pub fn for_set(devices: &DeviceSet, grad_accum: usize) -> Result<Self> {
        if !grad_accum.is_multiple_of(devices.len()) {
            return Err(TrainError::config(
                "training.grad_accum",
                format!(
                    "must be a multiple of the number of devices ({}) so each device gets whole micro-batches",
                    devices.len()
                ),
            ));
        }
        Ok(Self::new(
            devices
                .devices()
                .iter()
                .map(|d| d.clone().autodiff())
                .collect(),
        ))
    }

    /// The main device.
    pub fn main(&self) -> &Device {
        &self.devices[0]
    }

    /// How many replicas.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Always false (there is at least the main device).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Forward + backward of a step's micro-batches, split evenly over the devices (in order:
    /// device i takes the i-th contiguous share). Gradients end up on the main device.
    pub fn step(
        &self,
        model: &Qwen3ForCausalLM,
        batches: &[Batch],
    ) -> Result<(GradientsParams, StepStats)> {
        let total_targets = batches.iter().map(count_targets).sum::<usize>();
        let total_micro = batches.len();
        if self.devices.len() == 1 {
            return forward_backward_part(
                model,
                batches,
                self.main(),
                total_targets,
                total_micro,
                None,
            );
        }
        if !batches.len().is_multiple_of(self.devices.len()) {
            return Err(TrainError::config(
                "training.grad_accum",
                format!(
                    "{} micro-batches per step cannot be split evenly over {} devices",
                    batches.len(),
                    self.devices.len()
                ),
            ));
        }
        let share = batches.len() / self.devices.len();
        // `global_batch` balancing: the replicas sum their expert counts before any backward.
        let sync = StepSync::new(self.devices.len());
        let sync = &sync;
        let results: Vec<Result<(GradientsParams, StepStats)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .devices
                .iter()
                .zip(batches.chunks(share))
                .enumerate()
                .map(|(i, (device, part))| {
                    // Every replica but the first gets its own parameter leaves (`fork`: same
                    // ParamIds, fresh autodiff nodes; on the main device the data is shared, not
                    // copied). Replicas sharing leaves would share one autodiff graph, which
                    // serialises their backward passes, and Burn 0.22.1's graph merging can
                    // deadlock when one thread merges while another runs backward (seen here).
                    let replica = if i == 0 {
                        model.clone()
                    } else {
                        model.clone().fork(device)
                    };
                    scope.spawn(move || {
                        forward_backward_part(
                            &replica,
                            part,
                            device,
                            total_targets,
                            total_micro,
                            Some(sync),
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(TrainError::Other("a replica thread panicked".into()))
                    })
                })
                .collect()
        });
        let mut accumulator = GradientsAccumulator::<Qwen3ForCausalLM>::new();
        let mut stats: Option<StepStats> = None;
        for result in results {
            let (grads, part) = result?;
            accumulator.accumulate(model, grads.to_device(self.main(), model));
            stats = Some(match stats {
                None => part,
                Some(s) => s.merge(part),
            });
        }
        Ok((accumulator.grads(), stats.expect("at least one device")))
    }
}
