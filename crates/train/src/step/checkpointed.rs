//! Activation checkpointing of the decoder layers (`training.activation_checkpointing =
//! "layers"`): each layer's activations are recomputed in the backward instead of being kept
//! from the forward.

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Bool, Device, Int, Tensor};
use qwen_burn_data::Batch;
use qwen_burn_model::moe::RouterOutput;
use qwen_burn_model::{Documents, Qwen3ForCausalLM};

use super::batch::{batch_documents, input_tensors};
use crate::error::{Result, TrainError};

/// A forward run with activation checkpointing: the decoder stack ran without a graph, keeping
/// only each layer's input; the final norm and the objective's loss run with one, from a leaf
/// standing for the last layer's output (`last`), and the router losses from leaves standing
/// for each MoE layer's router logits.
pub(super) struct Stack {
    /// Inputs of layers `0..L` (no autodiff).
    inputs: Vec<Tensor<3>>,
    /// The leaf the final norm reads.
    last: Tensor<3>,
    /// The batch's token ids and document layout, for the recomputation.
    input_ids: Tensor<2, Int>,
    docs: Option<Documents>,
}

/// The final hidden states, router outputs and padding mask of `batch`, with the [`Stack`] the
/// backward needs: the stack runs on `inner`, the model without autodiff (the same kernels, so
/// the same values), keeping each layer's input.
#[allow(clippy::type_complexity)]
pub(super) fn forward(
    model: &Qwen3ForCausalLM,
    inner: &Qwen3ForCausalLM,
    batch: &Batch,
    device: &Device,
) -> Result<(Tensor<3>, Vec<RouterOutput>, Option<Tensor<2, Bool>>, Stack)> {
    let (input_ids, mask) = input_tensors(batch, device);
    let docs = batch_documents(batch, inner)?;
    let (mut x, layer_inputs) = inner.embed_for_layers(
        input_ids.clone().inner(),
        mask.clone().map(|m| m.inner()),
        docs.as_ref(),
    );
    // Routed as the recomputation (a training forward with autodiff) routes, capacity included.
    let layer_inputs = layer_inputs.with_training_routing(true);
    let layers = inner.config.num_hidden_layers;
    let mut inputs = Vec::with_capacity(layers);
    let mut routers = Vec::new();
    for i in 0..layers {
        inputs.push(x.clone());
        let (y, router) = inner.layer(i, x, &layer_inputs);
        x = y;
        routers.extend(router.map(|r| RouterOutput {
            logits: Tensor::from_inner(r.logits).require_grad(),
            assignment: r.assignment.map(Tensor::from_inner),
            ..r
        }));
    }
    let last = Tensor::from_inner(x).require_grad();
    let hidden = model.final_norm(last.clone());
    let stack = Stack {
        inputs,
        last,
        input_ids,
        docs,
    };
    Ok((hidden, routers, mask, stack))
}

/// The backward of a checkpointed forward, after the loss's own (`grads`, which reached the
/// head, the final norm, `stack.last` and the router-logit leaves): layer by layer from the
/// last, each recomputed from its kept input with a graph, then differentiated against the
/// gradient of its output (and of its router logits, for the router losses); then the
/// embedding. Each part's parameter gradients go to `accumulator`.
pub(super) fn backward(
    model: &Qwen3ForCausalLM,
    mask: Option<Tensor<2, Bool>>,
    stack: Stack,
    routers: &[RouterOutput],
    grads: burn::tensor::Gradients,
    accumulator: &mut GradientsAccumulator<Qwen3ForCausalLM>,
) -> Result<()> {
    let missing = || {
        TrainError::Other(
            "activation checkpointing: no gradient reached the last layer's output".into(),
        )
    };
    let mut dy = stack.last.grad(&grads).ok_or_else(missing)?;
    let mut router_grads: Vec<Option<Tensor<2>>> =
        routers.iter().map(|r| r.logits.grad(&grads)).collect();
    accumulator.accumulate(model, GradientsParams::from_grads(grads, model));

    let (embedded, layer_inputs) =
        model.embed_for_layers(stack.input_ids, mask, stack.docs.as_ref());
    for (i, x) in stack.inputs.into_iter().enumerate().rev() {
        let x = Tensor::from_inner(x).require_grad();
        let (y, router) = model.layer(i, x.clone(), &layer_inputs);
        let mut surrogate = (y * dy).sum();
        if let Some(router) = router {
            // MoE layers are counted from the top: the last router's gradient is the last one.
            if let Some(Some(g)) = router_grads.pop() {
                surrogate = surrogate + (router.logits * g).sum();
            }
        }
        let grads = surrogate.backward();
        dy = x.grad(&grads).ok_or_else(missing)?;
        accumulator.accumulate(model, GradientsParams::from_grads(grads, model));
    }
    if embedded.is_tracked() {
        let grads = (embedded * dy).sum().backward();
        accumulator.accumulate(model, GradientsParams::from_grads(grads, model));
    }
    Ok(())
}
