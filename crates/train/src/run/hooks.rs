//! Test hooks: environment variables that make a training process fail at a chosen point, so
//! the integration tests can prove what a crash, a kill or a NaN leaves behind. Each is read
//! where it applies and does nothing when unset.

use burn::optim::GradientsParams;
use qwen_burn_model::Qwen3ForCausalLM;

/// The step number in variable `name`, if set.
fn step_of(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

pub fn abort_after_step(step: usize) {
    // Test hook: die without any cleanup right after step N (and its checkpoint), like `kill -9`.
    if step_of("QWEN_BURN_ABORT_AFTER_STEP") == Some(step) {
        eprintln!("QWEN_BURN_ABORT_AFTER_STEP: aborting after step {step}");
        std::process::abort();
    }
}

/// Test hook: stop (sleep) right after step N's records are written, so that a test can
/// SIGKILL the process between checkpoints at a known point (`QWEN_BURN_PAUSE_AFTER_STEP=N`).
pub fn pause_after_step(step: usize) {
    if step_of("QWEN_BURN_PAUSE_AFTER_STEP") == Some(step) {
        eprintln!("QWEN_BURN_PAUSE_AFTER_STEP: paused after step {step}");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Test hook: make the gradient of `model.norm.weight` NaN at step N
/// (`QWEN_BURN_POISON_GRAD_AT_STEP=N`), a finite loss with a non-finite gradient.
pub fn poison_grad(step: usize, model: &Qwen3ForCausalLM, grads: &mut GradientsParams) {
    if step_of("QWEN_BURN_POISON_GRAD_AT_STEP") == Some(step) {
        let id = model.model.norm.weight.id;
        if let Some(g) = grads.remove::<1>(id) {
            grads.register(id, g.mul_scalar(f32::NAN));
        }
    }
}
