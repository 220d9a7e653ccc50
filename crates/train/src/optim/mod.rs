//! AdamW with explicit hyperparameters, weight-decay groups, global-norm clipping, and the
//! update half of a step (AdamW plus the aux-loss-free routing-bias move).

pub mod muon;
pub mod schedule;

use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::{
    AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, GradientsParams, ModuleOptimizer,
    Optimizer,
};
use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_kernels::{AdamWStep, adamw_update};
use qwen_burn_model::Qwen3ForCausalLM;

use crate::config::{OptimizerConfig, OptimizerKind};
use crate::error::{Result, TrainError};
use crate::step::StepStats;
use muon::{TorchLayoutMuon, muon_param_ids};

/// Collects the ids of parameters by rank.
struct RankIds {
    vectors: Vec<ParamId>,
}

impl ModuleVisitor for RankIds {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if D < 2 {
            self.vectors.push(param.id);
        }
    }
}

/// Elements of the parameters that train (`require_grad`): all of them in full fine-tuning, the
/// adapters (and whatever else the run unfreezes) under LoRA.
pub fn trainable_params<M: Module>(model: &M) -> usize {
    struct Count(usize);
    impl ModuleVisitor for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if param.is_require_grad() {
                self.0 += param.lazy_shape().num_elements();
            }
        }
    }
    let mut count = Count(0);
    model.visit(&mut count);
    count.0
}

/// Build AdamW: decoupled weight decay on matrices (linear and embedding weights), none on
/// vectors (RMSNorm gains, biases, routing biases). With `kind = "muon"`, the hidden matrices
/// ([`muon_param_ids`]) train with Muon instead. Burn's defaults (eps 1e-5, weight decay
/// 1e-4) are never used: every value comes from the config. Clipping is done separately
/// ([`clip_global_norm`]) because Burn's `GradientClipping::Norm` clips each tensor alone.
pub fn build_optimizer<M: Module>(model: &M, cfg: &OptimizerConfig) -> ModuleOptimizer {
    let adamw = |weight_decay: f64| FusedAdamW::new(cfg, weight_decay);
    let mut ids = RankIds {
        vectors: Vec::new(),
    };
    model.visit(&mut ids);
    let optimizer = ModuleOptimizer::from(adamw(cfg.weight_decay)).with_group(
        ParamGroup::from_ids(ids.vectors),
        adamw(0.0),
        None,
    );
    match cfg.kind {
        OptimizerKind::AdamW => optimizer,
        // The last group a parameter matches wins: the hidden matrices go to Muon.
        OptimizerKind::Muon => optimizer.with_group(
            ParamGroup::from_ids(muon_param_ids(model)),
            TorchLayoutMuon::new(cfg),
            None,
        ),
    }
}

/// AdamW whose per-parameter update is one fused in-place pass on Flex
/// ([`qwen_burn_kernels::adamw_update`], bit-identical to Burn's `AdamW`), and Burn's
/// `AdamW` itself elsewhere (other devices, `training.fused_kernels = false`). The state is
/// Burn's `AdamWState`, so optimizer records are the same either way.
#[derive(Clone)]
pub struct FusedAdamW {
    burn: AdamW,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
}

impl FusedAdamW {
    /// From the run's optimizer settings, with this group's weight decay.
    pub fn new(cfg: &OptimizerConfig, weight_decay: f64) -> Self {
        let (beta_1, beta_2, epsilon, weight_decay) = (
            cfg.beta1 as f32,
            cfg.beta2 as f32,
            cfg.eps as f32,
            weight_decay as f32,
        );
        let burn = AdamWConfig::new()
            .with_beta_1(beta_1)
            .with_beta_2(beta_2)
            .with_epsilon(epsilon)
            .with_weight_decay(weight_decay)
            .build();
        Self {
            burn,
            beta_1,
            beta_2,
            epsilon,
            weight_decay,
        }
    }
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let time = state.as_ref().map_or(1, |s| s.momentum.time + 1);
        let amsgrad = state
            .as_ref()
            .is_some_and(|s| s.momentum.max_moment_2.is_some());
        if amsgrad {
            return self.burn.step(lr, tensor, grad, state);
        }
        let moments = state.map(|s| (s.momentum.moment_1, s.momentum.moment_2));
        let step = AdamWStep {
            lr,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            time,
        };
        match adamw_update(tensor, grad, moments, step) {
            Ok((param, m, v)) => {
                let momentum = AdaptiveMomentumState::new(time, m, v);
                (param, Some(AdamWState::new(momentum)))
            }
            Err(inputs) => {
                let inputs = *inputs;
                let state = inputs
                    .moments
                    .map(|(m, v)| AdamWState::new(AdaptiveMomentumState::new(time - 1, m, v)));
                self.burn.step(lr, inputs.param, inputs.grad, state)
            }
        }
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        AdamW::to_device(state, device)
    }
}

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    total: Option<Tensor<1>>,
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            let sq = g.square().sum();
            self.total = Some(match self.total.take() {
                Some(t) => t + sq,
                None => sq,
            });
        }
    }
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// Global L2 norm of all gradients (one device read).
pub fn grad_norm<M: Module>(model: &M, grads: &GradientsParams) -> Result<f64> {
    let mut v = SquaredNorm { grads, total: None };
    model.visit(&mut v);
    match v.total {
        None => Ok(0.0),
        Some(t) => t
            .try_into_scalar::<f32>()
            .map(|s| f64::from(s).sqrt())
            .map_err(|e| TrainError::Device(format!("{e:?}"))),
    }
}

/// Multiply every gradient by `factor`.
pub fn scale_grads<M: Module>(model: &M, grads: &mut GradientsParams, factor: f64) {
    model.visit(&mut Scale { grads, factor });
}

/// `torch.nn.utils.clip_grad_norm_`: if the global norm exceeds `max_norm`, scale all gradients
/// by `max_norm / (norm + 1e-6)`. Returns the norm before clipping.
pub fn clip_global_norm<M: Module>(
    model: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> Result<f64> {
    let norm = grad_norm(model, grads)?;
    clip_to_norm(model, grads, norm, max_norm);
    Ok(norm)
}

/// [`clip_global_norm`] with the norm already measured.
pub fn clip_to_norm<M: Module>(model: &M, grads: &mut GradientsParams, norm: f64, max_norm: f64) {
    if max_norm > 0.0 && norm > max_norm {
        scale_grads(model, grads, max_norm / (norm + 1e-6));
    }
}

/// The update half of a step, shared by `train` and `bench`: AdamW at `lr`, then (MoE with
/// aux-loss-free balancing) the routing-bias move from the step's expert counts.
pub fn apply_update(
    model: Qwen3ForCausalLM,
    optimizer: &mut ModuleOptimizer,
    lr: f64,
    grads: GradientsParams,
    stats: &StepStats,
) -> Qwen3ForCausalLM {
    let model = optimizer.step(lr, model, grads);
    let rate = model
        .config
        .moe
        .as_ref()
        .map_or(0.0, |m| m.router_bias_update_rate);
    let model = if rate > 0.0 {
        // Under a training-time capacity the bias follows the router's own (uncapped) choices.
        let counts = if stats.uncapped_counts.is_empty() {
            &stats.expert_counts
        } else {
            &stats.uncapped_counts
        };
        update_routing_biases(model, counts, rate)
    } else {
        model
    };
    center_routers(model, &stats.router_input_sums)
}

/// `router_centering`: each MoE layer's router weight made orthogonal to the step's mean router
/// input ([`qwen_burn_model::moe::SparseMoe::center_router`]); `sums` holds, per MoE layer, the
/// step's input sum and token count (empty when centring is off).
pub fn center_routers(mut model: Qwen3ForCausalLM, sums: &[(Vec<f64>, usize)]) -> Qwen3ForCausalLM {
    if sums.is_empty() {
        return model;
    }
    for (moe, (sum, n)) in model.sparse_layers_mut().zip(sums) {
        let mean: Vec<f64> = sum.iter().map(|v| v / (*n).max(1) as f64).collect();
        moe.center_router(&mean);
    }
    model
}

/// Aux-loss-free balancing (DeepSeek-V3): after each optimizer step move each expert's routing
/// bias by `rate * sign(mean_load - load_e)`, so overloaded experts become less likely picks.
pub fn update_routing_biases(
    model: Qwen3ForCausalLM,
    counts: &[Vec<usize>],
    rate: f64,
) -> Qwen3ForCausalLM {
    let mut model = model;
    for (moe, layer_counts) in model.sparse_layers_mut().zip(counts) {
        let Some(bias) = moe.routing_bias.take() else {
            continue;
        };
        let mean = layer_counts.iter().sum::<usize>() as f64 / layer_counts.len() as f64;
        let delta: Vec<f32> = layer_counts
            .iter()
            .map(|&c| {
                let diff = mean - c as f64;
                let sign = if diff > 0.0 {
                    1.0
                } else if diff < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                (rate * sign) as f32
            })
            .collect();
        let id = bias.id;
        let value = bias.val().detach();
        let device = value.device();
        let updated = (value
            + Tensor::<1>::from_data(TensorData::new(delta, [layer_counts.len()]), &device))
        .detach()
        .set_require_grad(false);
        moe.routing_bias = Some(Param::initialized(id, updated).set_require_grad(false));
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;
    use burn::tensor::Device;
    use qwen_burn_model::Qwen3Config;
    use qwen_burn_model::block::FeedForward;
    use serde_json::json;

    /// The fused AdamW update (taken on Flex) gives bit-identical parameters and moments to
    /// Burn's `AdamW` over several steps, with and without weight decay, including the first
    /// step (no moments yet).
    #[test]
    fn fused_adamw_is_bit_identical_to_burns_adamw() {
        use burn::tensor::Distribution;
        let device = Device::flex();
        let cfg = OptimizerConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            ..OptimizerConfig::default()
        };
        for weight_decay in [0.1, 0.0] {
            let fused = FusedAdamW::new(&cfg, weight_decay);
            let burn = fused.burn.clone();
            let mut p_fused =
                Tensor::<2>::random([37, 300], Distribution::Normal(0.0, 0.5), &device);
            let mut p_burn = p_fused.clone();
            let (mut s_fused, mut s_burn) = (None, None);
            for step in 0..5 {
                let lr = cfg.lr * (1.0 + step as f64) / 5.0;
                let g = Tensor::<2>::random([37, 300], Distribution::Normal(0.0, 1e-2), &device);
                // The kernel path, not the fallback, is what runs here.
                let moments = s_fused.as_ref().map(|s: &AdamWState<2>| {
                    (s.momentum.moment_1.clone(), s.momentum.moment_2.clone())
                });
                let probe = AdamWStep {
                    lr,
                    beta_1: 0.9,
                    beta_2: 0.95,
                    epsilon: 1e-8,
                    weight_decay: weight_decay as f32,
                    time: step + 1,
                };
                assert!(adamw_update(p_fused.clone(), g.clone(), moments, probe).is_ok());
                let (p, s) = fused.step(lr, p_fused, g.clone(), s_fused);
                (p_fused, s_fused) = (p, s);
                let (p, s) = burn.step(lr, p_burn, g, s_burn);
                (p_burn, s_burn) = (p, s);
                let bits = |t: &Tensor<2>| -> Vec<u32> {
                    t.clone()
                        .into_data()
                        .iter::<f32>()
                        .map(f32::to_bits)
                        .collect()
                };
                let (a, b) = (s_fused.as_ref().unwrap(), s_burn.as_ref().unwrap());
                assert_eq!(a.momentum.time, b.momentum.time);
                assert_eq!(
                    bits(&p_fused),
                    bits(&p_burn),
                    "wd {weight_decay} step {step}: parameters"
                );
                assert_eq!(
                    bits(&a.momentum.moment_1),
                    bits(&b.momentum.moment_1),
                    "moment 1"
                );
                assert_eq!(
                    bits(&a.momentum.moment_2),
                    bits(&b.momentum.moment_2),
                    "moment 2"
                );
            }
        }
    }

    /// The aux-loss-free update moves each expert's bias against its load: up for experts below
    /// the mean load, down above it, unchanged at the mean.
    #[test]
    fn routing_bias_update_has_the_right_sign() {
        let config = Qwen3Config::from_json(
            &json!({
                "model_type": "qwen3_moe", "vocab_size": 16, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 4, "num_experts": 4,
                "num_experts_per_tok": 2, "router_bias_update_rate": 0.1,
            }),
            true,
        )
        .unwrap();
        let model = Qwen3ForCausalLM::new(&config, &Device::flex());
        let before = model.num_params();
        // Mean load 4: expert 0 overloaded, 1 and 3 underloaded, 2 at the mean.
        let model = update_routing_biases(model, &[vec![10, 2, 4, 0]], 0.1);
        let FeedForward::Sparse(moe) = &model.model.layers[0].mlp else {
            panic!("MoE layer")
        };
        let bias = moe.routing_bias.as_ref().unwrap().val();
        let values = bias.try_into_vec_as::<f32>().unwrap();
        assert_eq!(values, vec![-0.1, 0.1, 0.0, 0.1]);
        assert_eq!(model.num_params(), before);
    }
}
