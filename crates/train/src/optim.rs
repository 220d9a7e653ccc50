//! AdamW with explicit hyperparameters, weight-decay groups, global-norm clipping, and the
//! update half of a step (AdamW plus the aux-loss-free routing-bias move).

use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Tensor, TensorData};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::block::FeedForward;

use crate::config::OptimizerConfig;
use crate::error::{Result, TrainError};
use crate::step::StepStats;

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
/// vectors (RMSNorm gains, biases, routing biases). Burn's defaults (eps 1e-5, weight decay
/// 1e-4) are never used: every value comes from the config. Clipping is done separately
/// ([`clip_global_norm`]) because Burn's `GradientClipping::Norm` clips each tensor alone.
pub fn build_optimizer<M: Module>(model: &M, cfg: &OptimizerConfig) -> ModuleOptimizer {
    let adamw = |weight_decay: f64| {
        AdamWConfig::new()
            .with_beta_1(cfg.beta1 as f32)
            .with_beta_2(cfg.beta2 as f32)
            .with_epsilon(cfg.eps as f32)
            .with_weight_decay(weight_decay as f32)
    };
    let mut ids = RankIds {
        vectors: Vec::new(),
    };
    model.visit(&mut ids);
    adamw(cfg.weight_decay).init().with_group(
        ParamGroup::from_ids(ids.vectors),
        adamw(0.0).build(),
        None,
    )
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
    if rate > 0.0 {
        update_routing_biases(model, &stats.expert_counts, rate)
    } else {
        model
    }
}

/// Aux-loss-free balancing (DeepSeek-V3): after each optimizer step move each expert's routing
/// bias by `rate * sign(mean_load - load_e)`, so overloaded experts become less likely picks.
pub fn update_routing_biases(
    model: Qwen3ForCausalLM,
    counts: &[Vec<usize>],
    rate: f64,
) -> Qwen3ForCausalLM {
    let mut model = model;
    let mut moe_layers = model
        .model
        .layers
        .iter_mut()
        .filter_map(|l| match &mut l.mlp {
            FeedForward::Sparse(moe) => Some(moe),
            FeedForward::Dense(_) => None,
        });
    for layer_counts in counts {
        let Some(moe) = moe_layers.next() else { break };
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
    use serde_json::json;

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
