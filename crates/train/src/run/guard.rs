//! Non-finite guards: find NaN/Inf in gradients and weights before they do harm, and name the
//! first parameter that holds one.
//!
//! The fast path is one device read per check: the sum over every tensor of `x - x`, which is
//! 0 when all values are finite and NaN as soon as one is NaN or infinite (`inf - inf` is NaN).
//! Unlike a sum of squares it cannot overflow on large finite values. Only when that sum is not
//! finite are the tensors visited one by one to name the first bad one.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use qwen_burn_data::Batch;
use qwen_burn_model::Qwen3ForCausalLM;

use crate::error::{Result, TrainError};
use crate::eval::validation::evaluate;
use crate::step::StepStats;

/// Which tensors of a parameter to look at.
enum Source<'a> {
    /// The parameter values.
    Weights,
    /// Their gradients (parameters without one are skipped).
    Grads(&'a GradientsParams),
}

/// Walks the module, keeping the dotted path of the current parameter (HF style: enum variant
/// names such as `Dense`/`Sparse` are left out).
struct Finder<'a> {
    source: Source<'a>,
    path: Vec<String>,
    /// Running sum of `x - x` (fast pass).
    total: Option<Tensor<1>>,
    /// First parameter with a non-finite value (locate pass).
    locate: bool,
    first_bad: Option<String>,
}

impl Finder<'_> {
    fn tensor<const D: usize>(&self, param: &Param<Tensor<D>>) -> Option<Tensor<D>> {
        match &self.source {
            // The stored values: LoRA factors are parameters of their own, visited after their
            // base (no merged copy is formed); a bf16 base is widened, one matrix at a time.
            Source::Weights => Some(qwen_burn_kernels::widened(param.base())),
            Source::Grads(grads) => grads.get::<D>(param.id),
        }
    }
}

impl ModuleVisitor for Finder<'_> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        if !container_type.starts_with("Enum:") {
            self.path.push(name.to_string());
        }
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        if !container_type.starts_with("Enum:") {
            self.path.pop();
        }
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(x) = self.tensor(param) else {
            return;
        };
        if self.locate {
            if self.first_bad.is_none() && !x.is_finite().all().into_scalar::<bool>() {
                self.first_bad = Some(self.path.join("."));
            }
            return;
        }
        let zero_if_finite = (x.clone() - x).sum();
        self.total = Some(match self.total.take() {
            Some(t) => t + zero_if_finite,
            None => zero_if_finite,
        });
    }
}

fn first_non_finite<M: Module>(model: &M, source: Source<'_>) -> Result<Option<String>> {
    let mut finder = Finder {
        source,
        path: Vec::new(),
        total: None,
        locate: false,
        first_bad: None,
    };
    model.visit(&mut finder);
    let Some(total) = finder.total.take() else {
        return Ok(None);
    };
    let sum = total
        .try_into_scalar::<f32>()
        .map_err(|e| TrainError::Device(format!("{e:?}")))?;
    if sum.is_finite() {
        return Ok(None);
    }
    finder.locate = true;
    model.visit(&mut finder);
    // The fast pass saw a non-finite value, so some tensor holds one; the fallback name covers a
    // backend whose `is_finite` disagrees with its arithmetic.
    Ok(Some(finder.first_bad.unwrap_or_else(|| {
        "(a parameter that could not be identified)".into()
    })))
}

/// The dotted name of the first parameter whose gradient holds NaN or Inf, if any.
pub fn first_non_finite_grad<M: Module>(
    model: &M,
    grads: &GradientsParams,
) -> Result<Option<String>> {
    first_non_finite(model, Source::Grads(grads))
}

/// The dotted name of the first parameter whose value holds NaN or Inf, if any.
pub fn first_non_finite_weight<M: Module>(model: &M) -> Result<Option<String>> {
    first_non_finite(model, Source::Weights)
}

/// What the non-finite guard found in a step.
pub struct NonFiniteStep {
    /// `loss (NaN)`, `gradient norm (inf)`, ...
    pub what: String,
    /// `, first in parameter NAME`, or empty.
    pub param: String,
    /// The weights themselves are no longer finite (nothing to skip back to).
    pub weights: bool,
}

/// The guard before the update: the loss, the router losses and the global gradient norm
/// must be finite. On a non-finite loss the weights are checked too, since a bad earlier
/// update, not this batch, may be the cause.
pub fn check_step(
    model: &Qwen3ForCausalLM,
    grads: &GradientsParams,
    stats: &StepStats,
) -> Result<Option<NonFiniteStep>> {
    let losses = [
        ("loss", Some(stats.loss)),
        ("aux loss", stats.aux_loss),
        ("z-loss", stats.z_loss),
    ];
    if let Some((name, Some(value))) = losses
        .into_iter()
        .find(|(_, v)| v.is_some_and(|v| !v.is_finite()))
    {
        if let Some(param) = first_non_finite_weight(model)? {
            return Ok(Some(NonFiniteStep {
                what: format!("weights (the {name} is {value})"),
                param: format!(", first in parameter {param}"),
                weights: true,
            }));
        }
        return Ok(Some(NonFiniteStep {
            what: format!("{name} ({value})"),
            param: String::new(),
            weights: false,
        }));
    }
    if stats.grad_norm.is_finite() {
        return Ok(None);
    }
    let param = first_non_finite_grad(model, grads)?
        .map_or(String::new(), |p| format!(", first in parameter {p}"));
    Ok(Some(NonFiniteStep {
        what: format!("gradient norm ({})", stats.grad_norm),
        param,
        weights: false,
    }))
}

/// Why the current weights must not become a checkpoint: `(what, param)`, or `None` when they
/// are finite and score a finite validation loss (`val_loss` if this step measured it, else
/// the first validation batch).
pub fn unfit_for_checkpoint(
    model: &Qwen3ForCausalLM,
    val_loss: Option<f64>,
    val_batches: &[Batch],
    device: &Device,
) -> Result<Option<(String, String)>> {
    let valid = model.valid();
    if let Some(param) = first_non_finite_weight(&valid)? {
        return Ok(Some((
            "weights".into(),
            format!(", first in parameter {param}"),
        )));
    }
    let loss = match val_loss {
        Some(l) => l,
        None => {
            evaluate(
                &valid,
                &val_batches[..val_batches.len().min(1)],
                device,
                None,
            )?
            .loss
        }
    };
    Ok((!loss.is_finite()).then(|| {
        (
            format!("validation loss ({loss}) of the updated weights"),
            String::new(),
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};
    use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM};
    use serde_json::json;

    fn tiny() -> Qwen3ForCausalLM {
        let config = Qwen3Config::from_json(
            &json!({
                "model_type": "qwen3", "vocab_size": 16, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 4,
            }),
            true,
        )
        .unwrap();
        Qwen3ForCausalLM::new(&config, &Device::flex())
    }

    /// Replace one weight of `layers.1.mlp.up_proj` by `value`.
    fn poison(mut model: Qwen3ForCausalLM, value: f32) -> Qwen3ForCausalLM {
        let layer = &mut model.model.layers[1];
        let qwen_burn_model::block::FeedForward::Dense(mlp) = &mut layer.mlp else {
            unreachable!("dense model")
        };
        let w = mlp.up_proj.weight.val();
        let dims = w.dims();
        let mut values = w.try_into_vec_as::<f32>().unwrap();
        values[3] = value;
        let device = Device::flex();
        let id = mlp.up_proj.weight.id;
        mlp.up_proj.weight = Param::initialized(
            id,
            Tensor::from_data(TensorData::new(values, dims), &device),
        );
        model
    }

    #[test]
    fn finite_weights_pass_and_the_first_bad_one_is_named() {
        let model = tiny();
        assert_eq!(first_non_finite_weight(&model).unwrap(), None);
        // Large but finite values do not trip the check (a sum of squares would overflow).
        let big = poison(model.clone(), 3.0e38);
        assert_eq!(first_non_finite_weight(&big).unwrap(), None);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let name = first_non_finite_weight(&poison(model.clone(), bad)).unwrap();
            assert_eq!(name.as_deref(), Some("model.layers.1.mlp.up_proj.weight"));
        }
    }

    #[test]
    fn gradients_are_checked_per_parameter() {
        let model = tiny();
        let device = Device::flex();
        let mut grads = GradientsParams::new();
        let q = &model.model.layers[0].self_attn.q_proj.weight;
        grads.register(q.id, Tensor::<2>::ones(q.val().dims(), &device));
        assert_eq!(first_non_finite_grad(&model, &grads).unwrap(), None);
        let norm = &model.model.norm.weight;
        let mut bad = vec![1.0f32; norm.val().dims()[0]];
        bad[0] = f32::NAN;
        grads.register(
            norm.id,
            Tensor::<1>::from_data(TensorData::new(bad, norm.val().dims()), &device),
        );
        let name = first_non_finite_grad(&model, &grads).unwrap();
        assert_eq!(name.as_deref(), Some("model.norm.weight"));
    }
}
