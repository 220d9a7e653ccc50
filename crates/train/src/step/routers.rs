//! The MoE router losses of a forward (load balancing, z-loss, assignment), added to an
//! objective's loss in one place ([`add_router_losses`], which training, `bench` and `score`
//! share), and the meeting point of the replicas for `global_batch` balancing ([`StepSync`]).
//!
//! The router terms enter the loss only with `output_router_logits`, as in HF. `aux` and `z`
//! are per forward (as HF computes them); `global_batch`'s `aux` is weighted by the forward's
//! share of the step's real tokens, which makes the sum over the step exactly the loss of the
//! whole step's tokens (see [`crate::step::Step::part`]).

use std::sync::{Barrier, Mutex};

use burn::tensor::{Bool, Tensor};
use qwen_burn_model::moe::RouterOutput;
use qwen_burn_model::{
    BalanceLoss, Qwen3Config, assignment_loss, balancing_loss, router_z_loss, selection_counts,
};

/// A forward's loss with its router terms added, and those terms unweighted (for the records).
pub struct LossParts {
    /// What to differentiate: the objective's loss `+ router_weight * (coefs * router losses)`.
    pub loss: Tensor<1>,
    /// Unweighted load-balancing loss (MoE), as configured by `router_aux_loss_type`.
    pub aux: Option<Tensor<1>>,
    /// Unweighted router z-loss (MoE with `router_z_loss_coef > 0`).
    pub z: Option<Tensor<1>>,
    /// Unweighted assignment loss (MoE with `router_assignment_loss_coef > 0` in a training
    /// forward under a capacity).
    pub assignment: Option<Tensor<1>>,
}

/// Add the router losses of a forward to `loss` (its objective's).
///
/// `routers` are the forward's router outputs, `batch_size` its rows, `mask` its padding mask;
/// `router_weight` scales this forward's router losses (its share of the step);
/// `global_fractions` are the step's selection fractions for `global_batch`. A dense model
/// returns `loss` as it is.
pub fn add_router_losses(
    config: &Qwen3Config,
    mut loss: Tensor<1>,
    routers: &[RouterOutput],
    batch_size: usize,
    mask: Option<&Tensor<2, Bool>>,
    router_weight: f64,
    global_fractions: Option<&[Vec<f64>]>,
) -> LossParts {
    let (mut aux, mut z, mut assignment) = (None, None, None);
    if let Some(moe) = &config.moe {
        let logits: Vec<_> = routers.iter().map(|r| r.logits.clone()).collect();
        let mask_f = mask.map(|m| m.clone().float());
        let a = balancing_loss(
            moe.router_aux_loss_type,
            &logits,
            moe.num_experts,
            moe.num_experts_per_tok,
            batch_size,
            mask_f.as_ref(),
            global_fractions,
        );
        if moe.output_router_logits && moe.router_aux_loss_coef > 0.0 {
            loss = loss + a.clone() * (moe.router_aux_loss_coef * router_weight);
        }
        aux = Some(a);
        if moe.router_assignment_loss_coef > 0.0 {
            let (logits, ids): (Vec<_>, Vec<_>) = routers
                .iter()
                .filter_map(|r| Some((r.logits.clone(), r.assignment.clone()?)))
                .unzip();
            if let Some(al) = assignment_loss(&logits, &ids, mask_f.as_ref()) {
                if moe.output_router_logits {
                    loss = loss + al.clone() * (moe.router_assignment_loss_coef * router_weight);
                }
                assignment = Some(al);
            }
        }
        if moe.router_z_loss_coef > 0.0 {
            let zl = router_z_loss(&logits);
            if moe.output_router_logits {
                loss = loss + zl.clone() * (moe.router_z_loss_coef * router_weight);
            }
            z = Some(zl);
        }
    }
    LossParts {
        loss,
        aux,
        z,
        assignment,
    }
}

/// For a `global_batch` model scored on one forward (`score`, `eval`), that forward is the
/// whole "step": its own selection fractions. `None` for the other kinds.
pub fn own_fractions(
    config: &Qwen3Config,
    routers: &[RouterOutput],
    mask: Option<&Tensor<2, Bool>>,
) -> Option<Vec<Vec<f64>>> {
    let moe = config.moe.as_ref()?;
    if moe.router_aux_loss_type != BalanceLoss::GlobalBatch {
        return None;
    }
    let (counts, tokens) = forward_counts(routers, moe.num_experts_per_tok, mask);
    Some(fractions(&counts, tokens).0)
}

/// Per MoE layer, how often the router's top-`k` picks each expert in one forward, and the
/// forward's real tokens.
pub(super) fn forward_counts(
    routers: &[RouterOutput],
    top_k: usize,
    mask: Option<&Tensor<2, Bool>>,
) -> (Vec<Vec<f64>>, f64) {
    let logits: Vec<_> = routers.iter().map(|r| r.logits.clone()).collect();
    let mask_f = mask.map(|m| m.clone().float());
    selection_counts(&logits, top_k, mask_f.as_ref())
}

/// Where the replicas of one step meet for `global_batch`: each adds the selection counts of
/// its micro-batches, and all continue with the step's totals.
pub struct StepSync {
    barrier: Barrier,
    totals: Mutex<(Vec<Vec<f64>>, f64)>,
}

impl StepSync {
    /// For `replicas` threads.
    pub fn new(replicas: usize) -> Self {
        Self {
            barrier: Barrier::new(replicas),
            totals: Mutex::new((Vec::new(), 0.0)),
        }
    }

    /// Add this replica's counts and tokens; wait for the others; return the step's selection
    /// fractions (`counts / tokens`) and its real-token count. Counts are whole numbers, so the
    /// sums do not depend on the order the replicas arrive in.
    pub(super) fn exchange(&self, counts: &[Vec<f64>], tokens: f64) -> (Vec<Vec<f64>>, f64) {
        {
            let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
            add_f64(&mut totals.0, counts);
            totals.1 += tokens;
        }
        self.barrier.wait();
        let totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        fractions(&totals.0, totals.1)
    }
}

pub(super) fn add_f64(acc: &mut Vec<Vec<f64>>, other: &[Vec<f64>]) {
    if acc.is_empty() {
        *acc = other.to_vec();
        return;
    }
    for (a, b) in acc.iter_mut().zip(other) {
        a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
    }
}

pub(super) fn fractions(counts: &[Vec<f64>], tokens: f64) -> (Vec<Vec<f64>>, f64) {
    let f = counts
        .iter()
        .map(|layer| layer.iter().map(|c| c / tokens.max(1.0)).collect())
        .collect();
    (f, tokens)
}

/// Whether `config` balances with `global_batch` (the step's forwards all run before any
/// backward), and its top-k.
pub(super) fn global_batch(config: &Qwen3Config) -> Option<usize> {
    config
        .moe
        .as_ref()
        .filter(|m| m.router_aux_loss_type == BalanceLoss::GlobalBatch)
        .map(|m| m.num_experts_per_tok)
}
