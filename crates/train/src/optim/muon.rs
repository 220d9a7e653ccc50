//! Muon (momentum orthogonalised by Newton–Schulz iterations) for the hidden matrices, and the
//! rule that decides which parameters it trains.
//!
//! The update is Burn's `Muon` (Nesterov momentum, the quintic Newton–Schulz iteration with
//! Keller Jordan's coefficients in f32, decoupled weight decay at the unscaled learning rate),
//! stepped in PyTorch's layout: Burn stores a `Linear` weight as `[d_in, d_out]`, PyTorch as
//! `[out, in]`. The orthogonalised update is the same matrix either way (transposing commutes
//! with the iteration), but the learning-rate scale by shape is not: Keller Jordan's
//! `sqrt(max(1, out / in))` read on `[d_in, d_out]` would scale the transposed shapes. So each
//! step transposes the weight, its gradient (and, kept that way, its momentum) to `[out, in]`
//! and back. Burn's momentum is PyTorch's times `1 / (1 - momentum)` at every step, a factor
//! the normalisation before the iteration removes. `crates/train/tests/muon.rs` checks one and
//! three steps against `torch.optim.Muon`.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::{Momentum, MomentumConfig};
use burn::optim::{AdjustLrFn, Muon, MuonConfig, MuonState, Optimizer};
use burn::tensor::{Device, Tensor};
use qwen_burn_kernels::{NewtonSchulz, fused_newton_schulz_applies, newton_schulz};

use crate::config::{AdjustLr, OptimizerConfig};

/// Muon on `[d_in, d_out]` weights, meaning what `torch.optim.Muon` means on `[out, in]`, with
/// its own peak learning rate: the step's learning rate (scheduled from `optimizer.lr`) is
/// scaled by `optimizer.muon.lr / optimizer.lr`.
///
/// On Flex (f32, fused kernels on) the step is Burn's `Muon` step with its Newton–Schulz
/// iteration replaced by the fused kernel ([`newton_schulz`]): the same momentum (Burn's, so the
/// state and checkpoints are the same either way), learning-rate scale, weight decay and update.
/// Elsewhere it is Burn's `Muon` itself.
#[derive(Clone)]
pub struct TorchLayoutMuon {
    inner: Muon,
    lr_scale: f64,
    momentum: Momentum,
    ns: NewtonSchulz,
    adjust_lr: AdjustLr,
    /// Burn's weight-decay penalty (f32, as `WeightDecayConfig` keeps it).
    weight_decay: Option<f32>,
}

/// Burn's `MuonConfig` defaults, which `torch.optim.Muon` shares: Keller Jordan's quintic
/// coefficients and the norm's floor.
const NS_COEFFICIENTS: (f32, f32, f32) = (3.4445, -4.775, 2.0315);
const NS_EPSILON: f32 = 1e-7;

impl TorchLayoutMuon {
    /// The Muon group of a run's optimizer settings.
    pub fn new(cfg: &OptimizerConfig) -> Self {
        let m = &cfg.muon;
        let momentum = MomentumConfig {
            momentum: m.momentum,
            dampening: 0.0,
            nesterov: true,
        };
        let weight_decay =
            (m.weight_decay > 0.0).then(|| WeightDecayConfig::new(m.weight_decay as f32));
        let inner = MuonConfig::new()
            .with_momentum(momentum.clone())
            .with_ns_coefficients(NS_COEFFICIENTS)
            .with_epsilon(NS_EPSILON)
            .with_ns_steps(m.ns_steps)
            .with_weight_decay(weight_decay.clone())
            .with_adjust_lr_fn(match m.adjust_lr {
                AdjustLr::Original => AdjustLrFn::Original,
                AdjustLr::MatchRmsAdamw => AdjustLrFn::MatchRmsAdamW,
            })
            .build();
        Self {
            inner,
            lr_scale: m.lr / cfg.lr,
            momentum: Momentum::new(&momentum),
            ns: NewtonSchulz {
                coefficients: NS_COEFFICIENTS,
                steps: m.ns_steps,
                epsilon: NS_EPSILON,
            },
            adjust_lr: m.adjust_lr,
            weight_decay: weight_decay.map(|w| w.penalty),
        }
    }

    /// The learning-rate scale by shape of an `[out, in]` weight, as Burn's `AdjustLrFn` (and
    /// `torch.optim.Muon`'s `adjust_lr_fn`) computes it.
    fn shape_scale(&self, out: usize, inp: usize) -> f64 {
        let (a, b) = (out as f64, inp as f64);
        match self.adjust_lr {
            AdjustLr::Original => (a / b).max(1.0).sqrt(),
            AdjustLr::MatchRmsAdamw => 0.2 * a.max(b).sqrt(),
        }
    }
}

impl Optimizer for TorchLayoutMuon {
    type State<const D: usize> = MuonState<D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let lr = lr * self.lr_scale;
        // Only 2-D weights are routed here ([`muon_param_ids`]); `[out, in]` from here on.
        let (tensor, grad) = (tensor.transpose(), grad.transpose());
        if D != 2 || !fused_newton_schulz_applies(&grad) {
            let (tensor, state) = self.inner.step(lr, tensor, grad, state);
            return (tensor.transpose(), state);
        }
        // Burn's `Muon::step` with the fused iteration.
        let (update, momentum) = self.momentum.transform(grad, state.map(|s| s.momentum));
        let dims = update.dims();
        let (out, inp) = (dims[0], dims[1]);
        let update: Tensor<D> = newton_schulz(update.reshape([out, inp]), self.ns).reshape(dims);
        let tensor = match self.weight_decay {
            Some(penalty) => tensor.mul_scalar(1.0 - lr * penalty as f64),
            None => tensor,
        };
        let tensor = tensor - update.mul_scalar(lr * self.shape_scale(out, inp));
        (tensor.transpose(), Some(MuonState::new(momentum)))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        Muon::to_device(state, device)
    }
}

/// LoRA factors of a smaller rank are trained by AdamW under Muon. Muon's step gives every
/// singular value the same size and scales it by `sqrt(max(1, rows / cols))`, so a factor of
/// rank 1 or 2 takes a step as large as a full matrix's in one or two directions: measured
/// (`experiments/007-optimizers`, LoRA SFT of the tiny base, two seeds) validation 7.5 -> 8.5-10.6
/// in 10 steps at rank 1-2, against 6.5 for AdamW; rank 4 no better than AdamW (6.02 / 6.25
/// against 6.15 at step 30); rank 8 better (5.55 against 6.05 / 6.10).
pub const MIN_MUON_ADAPTER_RANK: usize = 8;

/// The parameters Muon trains: every 2-D weight of the decoder layers' attention and MLP
/// projections (each MoE expert's own, and LoRA adapters of those of rank
/// [`MIN_MUON_ADAPTER_RANK`] or more), but not the token embedding, the LM head or an MoE router
/// (`mlp.gate`), which AdamW trains with the norms, biases, routing biases and adapters of a
/// lower rank.
pub fn muon_param_ids<M: Module>(model: &M) -> Vec<ParamId> {
    /// The module path as it is walked, and the ids found.
    struct Hidden {
        path: Vec<String>,
        ids: Vec<ParamId>,
    }
    impl ModuleVisitor for Hidden {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if D == 2 && is_hidden_matrix(&self.path) {
                // A LoRA factor (`[d_in, rank]` or `[rank, d_out]`, under the `lora` module).
                let adapter = self.path.iter().any(|p| p == "lora");
                let rank = param.shape().dims::<D>().into_iter().min().unwrap_or(0);
                if !adapter || rank >= MIN_MUON_ADAPTER_RANK {
                    self.ids.push(param.id);
                }
            }
        }
    }
    let mut hidden = Hidden {
        path: Vec::new(),
        ids: Vec::new(),
    };
    model.visit(&mut hidden);
    hidden.ids
}

/// Whether a 2-D parameter at `path` is a hidden matrix (see [`muon_param_ids`]).
pub fn is_hidden_matrix(path: &[String]) -> bool {
    let has = |name: &str| path.iter().any(|p| p == name);
    // An MoE layer's router is the module `gate` (`model.layers.N.mlp.gate`, under the
    // feed-forward enum's variant); the MLPs' own projections are `gate_proj`.
    has("layers") && !has("gate") && !has("embed_tokens") && !has("lm_head")
}
