//! L1 of reproducibility (issue 40): the validation loss of a set of rows does not depend on
//! how they are batched, bit for bit, dense and MoE.

mod common;

use burn::tensor::Device;
use common::{lcg_batch, tiny_config};
use qwen_burn_data::Batch;
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::init::init_weights;
use qwen_burn_train::eval::validation::evaluate;

#[test]
fn validation_is_the_same_whatever_the_batching() {
    for moe in [false, true] {
        same_loss_at_every_batching(moe);
    }
}

fn same_loss_at_every_batching(moe: bool) {
    let device = Device::flex();
    let model = init_weights(
        Qwen3ForCausalLM::new(&tiny_config(moe, Some(0.2), 0.0), &device),
        4,
    );
    let rows: Vec<Batch> = (0..3)
        .flat_map(|seed| lcg_batch(4, 24, seed).rows().collect::<Vec<_>>())
        .collect();
    let batched = |size: usize| -> Vec<Batch> {
        rows.chunks(size)
            .map(|chunk| {
                let mut b = chunk[0].clone();
                for r in &chunk[1..] {
                    b.inputs.extend(&r.inputs);
                    b.targets.extend(&r.targets);
                }
                b.batch_size = chunk.len();
                b
            })
            .collect()
    };
    let one = evaluate(&model, &batched(1), &device, None).unwrap();
    for size in [2, 3, 5, 12] {
        let other = evaluate(&model, &batched(size), &device, None).unwrap();
        assert_eq!(
            one.loss.to_bits(),
            other.loss.to_bits(),
            "moe {moe}, batches of {size}: {} vs {}",
            other.loss,
            one.loss
        );
    }
}
