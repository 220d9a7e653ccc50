//! AdamW with explicit hyperparameters, weight-decay groups, and global-norm clipping.

use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;

use crate::config::OptimizerConfig;
use crate::error::{Result, TrainError};

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
