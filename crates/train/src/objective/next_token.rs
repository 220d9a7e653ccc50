//! Next-token cross-entropy: pretraining on text and SFT (prompt tokens masked with target -1).

use burn::tensor::{Bool, Device, Tensor};
use qwen_burn_data::Batch;
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::moe::RouterOutput;

use super::{Objective, ObjectiveLoss};
use crate::config::DataKind;
use crate::error::Result;
use crate::step::batch::{batch_documents, input_tensors, target_tensor};

/// Next-token cross-entropy, averaged over the step's target tokens: the loss of pretraining
/// and of supervised fine-tuning.
#[derive(Debug, Clone, Copy, Default)]
pub struct NextToken;

impl Objective for NextToken {
    fn name(&self) -> &'static str {
        "next_token"
    }

    fn data_kinds(&self) -> &'static [DataKind] {
        &[DataKind::Text, DataKind::Sft]
    }

    fn units(&self, batch: &Batch) -> usize {
        count_targets(batch)
    }

    fn loss(
        &self,
        model: &Qwen3ForCausalLM,
        hidden: Tensor<3>,
        batch: &Batch,
        device: &Device,
        step_units: f64,
    ) -> Result<ObjectiveLoss> {
        let sum = model.head_cross_entropy_sum(hidden, target_tensor(batch, device));
        Ok(ObjectiveLoss {
            loss: sum.clone() / step_units,
            sum,
            figures: Vec::new(),
        })
    }
}

/// Targets that count in the loss.
pub fn count_targets(batch: &Batch) -> usize {
    batch.targets.iter().filter(|&&t| t >= 0).count()
}

/// The summed next-token cross-entropy of one batch and its router outputs, with its padding
/// mask (for the balancing losses): the forward of validation (and of `bench`'s figures).
/// Packed documents are kept apart ([`Qwen3ForCausalLM::forward_hidden_packed`]).
pub fn forward_ce_sum(
    model: &Qwen3ForCausalLM,
    batch: &Batch,
    device: &Device,
) -> Result<(Tensor<1>, Vec<RouterOutput>, Option<Tensor<2, Bool>>)> {
    let (inputs, mask) = input_tensors(batch, device);
    let docs = batch_documents(batch, model)?;
    let (hidden, routers) = model.forward_hidden_packed(inputs, mask.clone(), docs.as_ref());
    let targets = target_tensor(batch, device);
    Ok((model.head_cross_entropy_sum(hidden, targets), routers, mask))
}

/// Each row's summed next-token cross-entropy (`[rows]`, nats), and the router outputs: the
/// forward of validation. Each row goes through the fused head on its own, so that a row's sum
/// does not depend on the rows beside it (issue 40, L1): the caller adds them in f64, in order.
pub fn forward_ce_rows(
    model: &Qwen3ForCausalLM,
    batch: &Batch,
    device: &Device,
) -> Result<(Vec<f64>, Vec<RouterOutput>)> {
    let (inputs, mask) = input_tensors(batch, device);
    let docs = batch_documents(batch, model)?;
    let (hidden, routers) = model.forward_hidden_packed(inputs, mask, docs.as_ref());
    let targets = target_tensor(batch, device);
    let [b, t, h] = hidden.dims();
    let rows = (0..b)
        .map(|r| {
            let row = hidden.clone().slice([r..r + 1, 0..t, 0..h]);
            let sum = model.head_cross_entropy_sum(row, targets.clone().slice([r..r + 1, 0..t]));
            crate::step::read_scalar(sum)
        })
        .collect::<Result<Vec<f64>>>()?;
    Ok((rows, routers))
}
