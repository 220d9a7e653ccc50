//! Data parallelism over two replicas gives the gradients of one device processing the same
//! micro-batches (within 1e-5), here with two threads on the flex CPU device.

mod common;

use burn::tensor::Device;
use common::{lcg_batch, tiny_config, tiny_moe_config, worst_grad_diff};
use qwen_burn_data::Batch;
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::init::init_weights;
use qwen_burn_train::step::replicas::Replicas;
use qwen_burn_train::step::{Step, forward_backward};

#[test]
fn two_replicas_equal_one_device() {
    for moe in [false, true] {
        let config = tiny_config(moe, None, 0.01);
        let device = Device::flex().autodiff();
        let model = init_weights(Qwen3ForCausalLM::new(&config, &device), 9);
        let batches: Vec<Batch> = (0..4).map(|seed| lcg_batch(2, 12, seed)).collect();
        let (g_one, s_one) = forward_backward(&model, &batches, &device).unwrap();
        let replicas = Replicas::new(vec![device.clone(), device.clone()]);
        let (g_two, s_two) = replicas
            .step(&Step::next_token(), &model, &batches)
            .unwrap();
        let (worst, count) = worst_grad_diff(&model, &g_one, &g_two);
        println!(
            "moe={moe}: {} grads, worst diff {:.2e}, loss {} vs {}",
            count, worst, s_one.loss, s_two.loss
        );
        assert!(worst <= 1e-5, "data-parallel gradients differ by {}", worst);
        assert!((s_one.loss - s_two.loss).abs() <= 1e-6);
        assert_eq!(s_one.tokens, s_two.tokens);
        assert!((s_one.aux_loss.unwrap_or(0.0) - s_two.aux_loss.unwrap_or(0.0)).abs() <= 1e-6);
    }
}

/// `global_batch` counts experts over the whole step: 1 device x 4 micro-batches and
/// 2 replicas x 2 give the same loss, aux loss and gradients (aux coefficient 0.5, so the aux
/// gradient is not negligible).
#[test]
fn global_batch_is_the_same_on_one_device_and_on_two_replicas() {
    let config = tiny_moe_config("global_batch", 0.5);
    let device = Device::flex().autodiff();
    let model = init_weights(Qwen3ForCausalLM::new(&config, &device), 9);
    let batches: Vec<Batch> = (0..4).map(|seed| lcg_batch(2, 12, seed)).collect();
    let (g_one, s_one) = forward_backward(&model, &batches, &device).unwrap();
    let replicas = Replicas::new(vec![device.clone(), device.clone()]);
    let (g_two, s_two) = replicas
        .step(&Step::next_token(), &model, &batches)
        .unwrap();
    let (worst, count) = worst_grad_diff(&model, &g_one, &g_two);
    let (a1, a2) = (s_one.aux_loss.unwrap(), s_two.aux_loss.unwrap());
    println!("global_batch: {count} grads, worst diff {worst:.2e}, aux {a1} vs {a2}");
    assert!(worst <= 1e-6, "gradients differ by {worst}");
    assert!((s_one.loss - s_two.loss).abs() <= 1e-6);
    assert!((a1 - a2).abs() <= 1e-6, "aux {a1} vs {a2}");
    assert_eq!(s_one.expert_counts, s_two.expert_counts);
}

/// `training.parallel`: `auto` picks `gather` off CUDA; `ddp` (Burn's collective all-reduce,
/// CUDA only in Burn 0.22.1) is refused before training on a CPU device list, naming the key.
#[test]
fn ddp_is_refused_off_cuda_and_auto_gathers() {
    use qwen_burn_model::DeviceSet;
    use qwen_burn_train::config::ParallelStrategy;
    use qwen_burn_train::step::replicas::resolve_strategy;
    let cpu = DeviceSet::parse("flex,flex").unwrap();
    assert_eq!(
        resolve_strategy(ParallelStrategy::Auto, &cpu).unwrap(),
        ParallelStrategy::Gather
    );
    assert_eq!(
        resolve_strategy(ParallelStrategy::Gather, &cpu).unwrap(),
        ParallelStrategy::Gather
    );
    let err = Replicas::for_set(&cpu, 2, ParallelStrategy::Ddp)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("training.parallel") && err.contains("CUDA") && err.contains("flex,flex"),
        "{err}"
    );
}
