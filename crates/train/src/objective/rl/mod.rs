//! Reinforcement learning with verifiable rewards (`data.kind = "prompts"`, `[rl]`): GRPO as
//! TRL 1.16.0's `GRPOTrainer` computes it, and nanochat's on-policy REINFORCE.
//!
//! A step's data are prompts. Before the step, [`Objective::rollout`] decodes `group_size`
//! completions of each prompt with the policy as it is (the prompts of one length in one
//! batch, each prompt's prefill shared by its group: [`qwen_burn_model::generate_groups`]),
//! scores them with the reward functions
//! (summed with their weights), and turns them into training rows whose advantages are the
//! rewards against their group's mean ([`advantage::advantages`]). The loss of those rows is
//! [`loss::rl_loss`]. With `rl.num_iterations > 1` the rows are kept and trained on that many
//! steps, the ratio taken to the log-probabilities at generation; with `rl.beta > 0` the
//! reference (the model of `model.from`, loaded once) gives the KL term. Rows whose advantage
//! is 0 add nothing to the update; where leaving them out gives the same step, the batches
//! leave them out ([`left_out`]).
//!
//! Figures under TRL's names: `reward`, `reward_std`, `rewards/<name>/mean`,
//! `frac_reward_zero_std`, `completions/mean_length`, `completions/max_length`,
//! `completions/clipped_ratio`, `entropy`, `kl`, `clip_ratio/*`. Validation decodes the
//! held-out prompts greedily: `reward`, `rewards/<name>/mean` and, with an `exact_match`
//! reward, `accuracy`.

pub mod advantage;
pub mod left_out;
pub mod loss;
mod objective;
pub mod rewards;
pub mod rollout;

pub use objective::Rl;
pub use rollout::PromptSets;
