//! Data parallelism: one model replica per device, each on its share of the step's
//! micro-batches (in order: device i takes the i-th contiguous share), accumulating its own
//! gradients. Two strategies combine them (`training.parallel`):
//!
//! - `gather` (every backend): each replica's gradients are moved to the first device and
//!   summed there; one optimizer step there; the weights are forked back to the replicas next
//!   step. Burn's "MultiDevice, optimizer on the main device" scheme (`burn-train`
//!   `ExecutionStrategy::MultiDevice`). `flex,flex` runs two replicas as two threads on one CPU
//!   (same losses as `flex`; slower than one `flex` now that its kernels use every core).
//! - `ddp` (CUDA device lists; the default there): the replicas sum their accumulated
//!   gradients with Burn's collective all-reduce (`burn::tensor::distributed`, NCCL), so every
//!   replica ends the backward pass with the step's gradient and nothing is gathered through
//!   the main device. The reduction runs once per step, after the last micro-batch, on the
//!   accumulated gradients: Burn 0.22.1 marks a parameter for sync for one backward pass only
//!   and has no `no_sync`, so overlapping the reduction with the backward pass would reduce
//!   only one micro-batch of an accumulating step. Burn 0.22.1 implements collectives for CUDA
//!   only (other backends panic), so `ddp` on any other device list is refused before training.
//!   The optimizer still steps once, on the first device (identical gradients on every rank, so
//!   global-norm clipping, checkpoints by rank 0 and bit-exact resume hold as for `gather`);
//!   the replicas' weights are forked from it each step, which costs one weight broadcast per
//!   step. Per-replica optimizers (burn-train's DDP) would remove that broadcast.
//!
//! Both equal gradient accumulation over the same micro-batches on one device: the
//! objective's loss is normalised by the whole step's units (tests/parallel.rs), and
//! `global_batch` balancing counts experts over all replicas ([`StepSync`]).

use std::sync::Arc;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::distributed::{
    DistributedConfig, DistributedContext, ReduceOperation, all_reduce,
};
use burn::tensor::{Device, Tensor};
use qwen_burn_data::Batch;
use qwen_burn_model::{BackendKind, DeviceSet, Qwen3ForCausalLM};

use super::routers::global_batch;
use super::{Step, StepStats, StepSync};
use crate::config::ParallelStrategy;
use crate::error::{Result, TrainError};

/// The devices of a run; the first holds the master weights and the optimizer.
#[derive(Debug, Clone)]
pub struct Replicas {
    devices: Vec<Device>,
    /// `ddp`: the collective context and the plain devices it reduces over.
    ddp: Option<(Arc<DistributedContext>, Vec<Device>)>,
}

/// Which strategy `requested` means for `devices`: `auto` is `ddp` for a list of several CUDA
/// devices and `gather` otherwise; `ddp` on anything but CUDA is refused.
pub fn resolve_strategy(
    requested: ParallelStrategy,
    devices: &DeviceSet,
) -> Result<ParallelStrategy> {
    let all_cuda = devices
        .kinds()
        .iter()
        .all(|k| matches!(k, BackendKind::Cuda(_)));
    match requested {
        ParallelStrategy::Auto if all_cuda && devices.len() > 1 => Ok(ParallelStrategy::Ddp),
        ParallelStrategy::Auto => Ok(ParallelStrategy::Gather),
        ParallelStrategy::Ddp if !all_cuda => Err(TrainError::config(
            "training.parallel",
            format!(
                "\"ddp\" needs CUDA devices (`cuda:0,cuda:1`): Burn 0.22.1 implements its \
                 collective all-reduce (NCCL) for CUDA only, not for `{}`; use \"gather\", which \
                 works on every backend",
                devices.name()
            ),
        )),
        other => Ok(other),
    }
}

impl Replicas {
    /// Autodiff devices, first = main; gradients gathered to the main device.
    pub fn new(devices: Vec<Device>) -> Self {
        assert!(!devices.is_empty(), "at least one device");
        Self { devices, ddp: None }
    }

    /// Autodiff replicas of a device list, for steps of `grad_accum` micro-batches, which must
    /// split evenly over them, combined by `strategy` (see [`resolve_strategy`]).
    pub fn for_set(
        devices: &DeviceSet,
        grad_accum: usize,
        strategy: ParallelStrategy,
    ) -> Result<Self> {
        if !grad_accum.is_multiple_of(devices.len()) {
            return Err(TrainError::config(
                "training.grad_accum",
                format!(
                    "must be a multiple of the number of devices ({}) so each device gets whole micro-batches",
                    devices.len()
                ),
            ));
        }
        let mut replicas = Self::new(
            devices
                .devices()
                .iter()
                .map(|d| d.clone().autodiff())
                .collect(),
        );
        if resolve_strategy(strategy, devices)? == ParallelStrategy::Ddp && devices.len() > 1 {
            let plain = devices.devices().to_vec();
            let context = DistributedContext::init(
                plain.clone(),
                DistributedConfig {
                    all_reduce_op: ReduceOperation::Sum,
                },
            );
            replicas.ddp = Some((Arc::new(context), plain));
        }
        Ok(replicas)
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
    /// Each replica thread keeps the calling thread's fused-kernel setting.
    pub fn step(
        &self,
        step: &Step<'_>,
        model: &Qwen3ForCausalLM,
        batches: &[Batch],
    ) -> Result<(GradientsParams, StepStats)> {
        let step_units = step.units(batches);
        if step.bitwise && (self.devices.len() > 1 || global_batch(&model.config).is_none()) {
            return self.step_rows(step, model, batches, step_units);
        }
        let total_micro = batches.len();
        if self.devices.len() == 1 {
            // `bitwise` with `global_batch` balancing: every row's forward first, in one part.
            let forwards = step.forwards(batches);
            let n = forwards.len();
            return step.part(model, &forwards, self.main(), step_units, n, None);
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
        let ddp = self.ddp.as_ref().map(|(_, plain)| plain);
        let results = self.on_replicas(model, batches.chunks(share), |replica, device, part| {
            let (grads, stats) =
                step.part(replica, part, device, step_units, total_micro, Some(sync))?;
            Ok(match ddp {
                Some(plain) => (all_reduce_grads(replica, grads, plain), stats),
                None => (grads, stats),
            })
        });
        let mut accumulator = GradientsAccumulator::<Qwen3ForCausalLM>::new();
        let mut stats: Option<StepStats> = None;
        let mut reduced = None;
        for (rank, result) in results.into_iter().enumerate() {
            let (grads, part) = result?;
            if self.ddp.is_some() {
                // Every rank holds the all-reduced sum; rank 0's is on the main device.
                if rank == 0 {
                    reduced = Some(grads);
                }
            } else {
                accumulator.accumulate(model, grads.to_device(self.main(), model));
            }
            stats = Some(match stats {
                None => part,
                Some(s) => s.merge(part),
            });
        }
        let grads = reduced.unwrap_or_else(|| accumulator.grads());
        Ok((grads, stats.expect("at least one device")))
    }
}

impl Replicas {
    /// `training.reproducible = "bitwise"`: the step's rows in rounds of one row per device
    /// (row `i` of a round on device `i`; one device takes them one by one), each row a
    /// forward and backward of its own ([`Step::part`] over that row), and the rows' gradients
    /// and statistics added on the main device in the rows' order. Every split of the same
    /// global batch, over any number of devices, then adds the same numbers in the same order.
    /// `global_batch` balancing needs every forward of the step before any backward, and `ddp`
    /// sums in NCCL's order: both are refused with several devices.
    fn step_rows(
        &self,
        step: &Step<'_>,
        model: &Qwen3ForCausalLM,
        batches: &[Batch],
        step_units: usize,
    ) -> Result<(GradientsParams, StepStats)> {
        if self.devices.len() > 1 && global_batch(&model.config).is_some() {
            return Err(TrainError::config(
                "training.reproducible",
                "\"bitwise\" on several devices cannot use the router balancing \
                 \"global_batch\" (it needs every forward of a step before any backward): \
                 use one device, or another balancing",
            ));
        }
        if self.ddp.is_some() {
            return Err(TrainError::config(
                "training.reproducible",
                "\"bitwise\" adds the rows' gradients in their order on the main device; \
                 `ddp` sums in the collective's order: set training.parallel = \"gather\"",
            ));
        }
        let rows = step.forwards(batches);
        let total = rows.len();
        let mut accumulator = GradientsAccumulator::<Qwen3ForCausalLM>::new();
        let mut stats: Option<StepStats> = None;
        for round in rows.chunks(self.devices.len()) {
            let results: Vec<Result<(GradientsParams, StepStats)>> = if round.len() == 1 {
                let row = std::slice::from_ref(&round[0]);
                vec![step.part(model, row, self.main(), step_units, total, None)]
            } else {
                self.on_replicas(model, round.iter(), |replica, device, row| {
                    let row = std::slice::from_ref(row);
                    step.part(replica, row, device, step_units, total, None)
                })
            };
            for result in results {
                let (grads, part) = result?;
                accumulator.accumulate(model, grads.to_device(self.main(), model));
                stats = Some(match stats {
                    None => part,
                    Some(s) => s.merge(part),
                });
            }
        }
        let stats = stats.ok_or_else(|| TrainError::Other("a step without rows".into()))?;
        Ok((accumulator.grads(), stats))
    }
}

impl Replicas {
    /// `job` on each of `parts` with its device (part `i` on device `i`), one thread per
    /// replica, each with the calling thread's fused-kernel setting; the results in device
    /// order. Every replica but the first gets its own parameter leaves (`fork`: same
    /// ParamIds, fresh autodiff nodes; on the main device the data is shared, not copied).
    /// Replicas sharing leaves would share one autodiff graph, which serialises their backward
    /// passes, and Burn 0.22.1's graph merging can deadlock when one thread merges while
    /// another runs backward.
    fn on_replicas<'p, P: ?Sized + Sync + 'p, T: Send>(
        &self,
        model: &Qwen3ForCausalLM,
        parts: impl Iterator<Item = &'p P>,
        job: impl Fn(&Qwen3ForCausalLM, &Device, &P) -> Result<T> + Sync,
    ) -> Vec<Result<T>> {
        let (fused, precision) = (
            qwen_burn_kernels::fused_kernels(),
            qwen_burn_kernels::precision(),
        );
        let job = &job;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .devices
                .iter()
                .zip(parts)
                .enumerate()
                .map(|(i, (device, part))| {
                    let replica = if i == 0 {
                        model.clone()
                    } else {
                        model.clone().fork(device)
                    };
                    scope.spawn(move || {
                        let job = || job(&replica, device, part);
                        qwen_burn_kernels::with_kernels(fused, precision, job)
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
        })
    }
}

/// Sum every parameter's gradient over the ranks with Burn's collective all-reduce. Each rank
/// visits the parameters in the same order and contributes a tensor for every one (zeros for a
/// parameter it has no gradient for, e.g. an expert that got no token there), so the collective
/// calls pair up across ranks.
fn all_reduce_grads(
    model: &Qwen3ForCausalLM,
    mut grads: GradientsParams,
    devices: &[Device],
) -> GradientsParams {
    struct Reduce<'a> {
        grads: &'a mut GradientsParams,
        devices: &'a [Device],
    }
    impl ModuleVisitor for Reduce<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if !param.val().is_require_grad() {
                return;
            }
            let grad = self.grads.remove::<D>(param.id).unwrap_or_else(|| {
                let value = param.val();
                Tensor::zeros(value.dims(), &value.device().without_autodiff())
            });
            let sum = all_reduce(grad, ReduceOperation::Sum, self.devices.to_vec()).resolve();
            self.grads.register(param.id, sum);
        }
    }
    model.visit(&mut Reduce {
        grads: &mut grads,
        devices,
    });
    grads
}
