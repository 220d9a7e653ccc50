//! Rows of a rollout that the update can leave out (`rl.skip_zero_advantage_rows`).
//!
//! On-policy without a KL term, a row's loss is its advantage times terms of its
//! log-probabilities: a row whose advantage is exactly 0 has loss 0 and adds exactly 0 to
//! every gradient. Prompts whose completions all earned the same reward give such rows
//! (`frac_reward_zero_std` of them), often half a batch or more. Their forward and backward
//! are then work for nothing; left out of the batches, with their loss units still counted
//! ([`crate::objective::Objective::units_left_out`]), the step computes the same loss and
//! gradient (up to the order of the f32 sums) on the rows that move it. DAPO's dynamic
//! sampling drops such groups too, but then samples new prompts until the batch is full, a
//! change of the batch; this keeps the batch and only saves the work.

use qwen_burn_model::{GroupCompletion, Qwen3ForCausalLM};

use crate::config::RlConfig;
use crate::error::{Result, TrainError};

/// Whether the rollouts leave their zero-advantage rows out of the batches
/// (`rl.skip_zero_advantage_rows`): unless set to false, wherever that is the same step, which
/// needs a model without MoE layers (their router losses and balancing count every row's
/// tokens); set to true, an error where it is not.
pub fn skips_zero_rows(config: &RlConfig, model: &Qwen3ForCausalLM) -> Result<bool> {
    let setting = config.skip_zero_advantage_rows;
    if setting == Some(false) || config.zero_rows_matter().is_some() {
        return Ok(false);
    }
    if !model.config.moe_layers().is_empty() {
        if setting == Some(true) {
            return Err(TrainError::config(
                "rl.skip_zero_advantage_rows",
                "is true, but the model has MoE layers, whose router losses and balancing \
                 count every row's tokens; unset it or set it to false",
            ));
        }
        return Ok(false);
    }
    Ok(true)
}

/// The rows of a prompt batch (indices in `advantages`' order) that the update needs: those
/// whose advantage is not 0, else the first row alone, so that every micro-batch keeps a
/// forward and every parameter its gradient (0): the optimizer steps as it would on all the
/// rows (AdamW's moments decay, its weight decay applies).
pub fn rows_needed(advantages: &[f64]) -> Vec<usize> {
    let needed: Vec<usize> = (0..advantages.len())
        .filter(|&i| advantages[i] != 0.0)
        .collect();
    if needed.is_empty() && !advantages.is_empty() {
        vec![0]
    } else {
        needed
    }
}

/// `prompts`' groups of `completions` reduced to `rows` (ascending indices over the groups'
/// completions in order, prompt by prompt), the prompts left without a row dropped.
pub fn select_rows(
    prompts: &[u32],
    completions: &[Vec<GroupCompletion>],
    rows: &[usize],
) -> (Vec<u32>, Vec<Vec<GroupCompletion>>) {
    let (mut kept_prompts, mut kept) = (Vec::new(), Vec::new());
    let mut next = rows.iter().copied().peekable();
    let mut first = 0usize;
    for (&prompt, group) in prompts.iter().zip(completions) {
        let end = first + group.len();
        let mut chosen = Vec::new();
        while let Some(r) = next.next_if(|&r| r < end) {
            chosen.push(group[r - first].clone());
        }
        if !chosen.is_empty() {
            kept_prompts.push(prompt);
            kept.push(chosen);
        }
        first = end;
    }
    (kept_prompts, kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: u32) -> GroupCompletion {
        GroupCompletion {
            ids: vec![id],
            stopped: true,
        }
    }

    #[test]
    fn needed_rows_are_the_nonzero_advantages_or_the_first_row() {
        assert_eq!(rows_needed(&[0.0, 0.7, -0.7, 0.0]), vec![1, 2]);
        assert_eq!(rows_needed(&[0.0, -0.0, 0.0]), vec![0]);
        assert_eq!(rows_needed(&[0.0, 1e-30]), vec![1]);
        assert!(rows_needed(&[]).is_empty());
    }

    #[test]
    fn selected_rows_keep_their_prompts_and_order() {
        let groups = vec![vec![c(1), c(2)], vec![c(3), c(4)], vec![c(5), c(6)]];
        let (prompts, kept) = select_rows(&[10, 11, 12], &groups, &[1, 4, 5]);
        assert_eq!(prompts, vec![10, 12]);
        assert_eq!(kept, vec![vec![c(2)], vec![c(5), c(6)]]);
        let (prompts, kept) = select_rows(&[10, 11, 12], &groups, &[0, 1, 2, 3, 4, 5]);
        assert_eq!((prompts, kept), (vec![10, 11, 12], groups));
    }
}
