//! The `[rl]` section: reinforcement learning with verifiable rewards (`data.kind = "prompts"`),
//! TRL 1.16.0's `GRPOTrainer` settings under its names and defaults, and nanochat's plain
//! on-policy REINFORCE.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// `[rl]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RlConfig {
    /// `grpo` (clipped ratio, optional KL) or `reinforce` (nanochat: advantage = reward - group
    /// mean, no ratio, no clip, no KL, a token mean over the step).
    pub algorithm: RlAlgorithm,
    /// Completions sampled per prompt (TRL's `num_generations`).
    pub group_size: usize,
    /// Tokens a completion may have (TRL's `max_completion_length`).
    pub max_new_tokens: usize,
    /// Sampling temperature (> 0).
    pub temperature: f64,
    /// Nucleus sampling (1 = off).
    pub top_p: f64,
    /// Top-k sampling (0 = off).
    pub top_k: usize,
    /// Texts that end a completion besides the EOS token (checked on the decoded completion).
    pub stop: Vec<String>,
    /// The lower clip of the ratio, `1 - epsilon`.
    pub epsilon: f64,
    /// The upper clip, `1 + epsilon_high` (TRL: `epsilon` when unset; DAPO uses 0.28).
    pub epsilon_high: Option<f64>,
    /// Weight of the KL to the reference (TRL's k3 estimator); 0 computes no reference.
    pub beta: f64,
    /// How the per-token losses are averaged: `grpo` (per sequence, then over sequences),
    /// `bnpo` (over the micro-batch's tokens), `dr_grpo` (a sum over rows x
    /// `max_new_tokens`), `dapo` (over the step's tokens; the default, as TRL's).
    pub loss_type: RlLossType,
    /// Advantages divided by the reward std of the `group`, of the `batch`, or `none`.
    pub scale_rewards: ScaleRewards,
    /// Policy updates per generation batch; from the second on, the ratio is to the
    /// log-probabilities kept from generation.
    pub num_iterations: usize,
    /// Leave the rows whose advantage is exactly 0 out of the update's forward and backward,
    /// while the loss still averages over them: the same update, less work. Unset: wherever
    /// that changes nothing of the step, its update and its figures (`beta = 0`,
    /// `num_iterations = 1`, any `loss_type` but `bnpo`, a model without MoE layers); `true`:
    /// required (an error elsewhere); `false`: every row is trained on.
    pub skip_zero_advantage_rows: Option<bool>,
    /// The reward functions, summed with their weights.
    pub rewards: Vec<RewardSpec>,
}

impl Default for RlConfig {
    fn default() -> Self {
        Self {
            algorithm: RlAlgorithm::Grpo,
            group_size: 8,
            max_new_tokens: 64,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop: Vec::new(),
            epsilon: 0.2,
            epsilon_high: None,
            beta: 0.0,
            loss_type: RlLossType::Dapo,
            scale_rewards: ScaleRewards::Group,
            num_iterations: 1,
            skip_zero_advantage_rows: None,
            rewards: vec![RewardSpec::default()],
        }
    }
}

/// `rl.algorithm`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RlAlgorithm {
    /// GRPO as TRL computes it.
    #[default]
    Grpo,
    /// nanochat's `chat_rl.py`: `-(reward - group mean) * logp`, a mean over the step's tokens.
    Reinforce,
}

/// `rl.loss_type`: TRL's four normalisations.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RlLossType {
    /// Per sequence: its tokens' mean; then the mean over the sequences.
    Grpo,
    /// The mean over the micro-batch's completion tokens.
    Bnpo,
    /// The sum over the tokens divided by rows x `max_new_tokens`.
    DrGrpo,
    /// The sum over the step's completion tokens divided by their count (TRL's default): every
    /// token weighs the same, whatever its sequence's length or the batch split.
    #[default]
    Dapo,
}

impl RlLossType {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RlLossType::Grpo => "grpo",
            RlLossType::Bnpo => "bnpo",
            RlLossType::DrGrpo => "dr_grpo",
            RlLossType::Dapo => "dapo",
        }
    }
}

/// `rl.scale_rewards`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewards {
    /// By the std of the prompt's group (GRPO's paper).
    #[default]
    Group,
    /// By the std of the whole generation batch.
    Batch,
    /// Not at all (Dr. GRPO).
    None,
}

/// `[[rl.rewards]]`: one reward function.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSpec {
    /// `exact_match` (the final answer against `answer`), `regex` (1 when `pattern`
    /// matches), or `command` (a program that scores JSON lines on stdin).
    pub kind: RewardKind,
    /// Its weight in the summed reward.
    pub weight: f64,
    /// `exact_match`: the regex whose first group at its last match is the answer (default
    /// GSM8K's `#### N`; without a match, the last number); `regex`: the pattern to find.
    pub pattern: Option<String>,
    /// `command`: the program and its arguments (no shell).
    pub command: Vec<PathBuf>,
    /// `command`: seconds one call may take.
    pub timeout_secs: f64,
}

impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            kind: RewardKind::ExactMatch,
            weight: 1.0,
            pattern: None,
            command: Vec::new(),
            timeout_secs: 60.0,
        }
    }
}

/// `rl.rewards.kind`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// The final answer equals the reference answer.
    #[default]
    ExactMatch,
    /// A pattern matches the completion.
    Regex,
    /// A user's program.
    Command,
}

impl RlConfig {
    /// The upper clip's epsilon.
    pub fn epsilon_high(&self) -> f64 {
        self.epsilon_high.unwrap_or(self.epsilon)
    }

    /// Why leaving zero-advantage rows out of the update would change the step under these
    /// settings, its update or its figures (`None`: neither). A zero advantage zeroes a row's
    /// clipped term, but not its KL term (`beta > 0`); `bnpo` averages over each micro-batch's
    /// tokens, the left-out rows' among them. With `num_iterations > 1` the rows are kept, so
    /// that the clip figures stay token means over every row, as TRL's.
    pub fn zero_rows_matter(&self) -> Option<&'static str> {
        if self.beta > 0.0 {
            Some("rl.beta > 0: a row's KL term does not vanish with its advantage")
        } else if self.num_iterations > 1 {
            Some("rl.num_iterations > 1: the clip figures are token means over every row")
        } else if self.algorithm == RlAlgorithm::Grpo && self.loss_type == RlLossType::Bnpo {
            Some("rl.loss_type = \"bnpo\": a micro-batch's token mean counts its left-out rows")
        } else {
            None
        }
    }

    /// Refuse values the run cannot use, naming the key.
    pub fn check(&self) -> Result<()> {
        let bad = |key: &str, why: String| Err(TrainError::config(format!("rl.{key}"), why));
        if self.group_size < 2 {
            return bad(
                "group_size",
                format!(
                    "is {}; a group needs 2 completions or more (its advantages are \
                     rewards against the group's mean)",
                    self.group_size
                ),
            );
        }
        if self.max_new_tokens == 0 {
            return bad("max_new_tokens", "is 0; it must be 1 or more".into());
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return bad(
                "temperature",
                format!(
                    "is {}; sampling needs a temperature above 0",
                    self.temperature
                ),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("is {}; it must be in (0, 1]", self.top_p));
        }
        for (key, e) in [
            ("epsilon", self.epsilon),
            ("epsilon_high", self.epsilon_high()),
        ] {
            if !(e.is_finite() && e > 0.0) {
                return bad(key, format!("is {e}; it must be above 0"));
            }
        }
        if self.epsilon >= 1.0 {
            return bad(
                "epsilon",
                format!(
                    "is {}; the lower clip 1 - epsilon must stay above 0",
                    self.epsilon
                ),
            );
        }
        if !(self.beta.is_finite() && self.beta >= 0.0) {
            return bad("beta", format!("is {}; it must be 0 or more", self.beta));
        }
        if self.num_iterations == 0 {
            return bad("num_iterations", "is 0; it must be 1 or more".into());
        }
        if self.algorithm == RlAlgorithm::Reinforce && (self.beta > 0.0 || self.num_iterations > 1)
        {
            return bad(
                "algorithm",
                "is \"reinforce\", which has no KL term and no ratio: set rl.beta = 0 and \
                 rl.num_iterations = 1, or use \"grpo\""
                    .into(),
            );
        }
        if self.skip_zero_advantage_rows == Some(true)
            && let Some(why) = self.zero_rows_matter()
        {
            return bad(
                "skip_zero_advantage_rows",
                format!(
                    "is true, but here leaving zero-advantage rows out is not the same step \
                     ({why}); unset it or set it to false"
                ),
            );
        }
        if self.rewards.is_empty() {
            return bad(
                "rewards",
                "is empty; give one reward function or more".into(),
            );
        }
        for (i, r) in self.rewards.iter().enumerate() {
            let key = |k: &str| format!("rewards[{i}].{k}");
            if !r.weight.is_finite() {
                return bad(
                    &key("weight"),
                    format!("is {}; it must be finite", r.weight),
                );
            }
            match r.kind {
                RewardKind::Regex if r.pattern.is_none() => {
                    return bad(&key("pattern"), "is required by kind = \"regex\"".into());
                }
                RewardKind::Command if r.command.is_empty() => {
                    return bad(
                        &key("command"),
                        "is required by kind = \"command\": [\"program\", \"arg\", ...]".into(),
                    );
                }
                RewardKind::Command => {}
                _ if !r.command.is_empty() => {
                    return bad(&key("command"), "is read by kind = \"command\" only".into());
                }
                _ => {}
            }
            if r.kind == RewardKind::Command && r.pattern.is_some() {
                return bad(&key("pattern"), "is not read by kind = \"command\"".into());
            }
            if !(r.timeout_secs.is_finite() && r.timeout_secs > 0.0 && r.timeout_secs <= 1e6) {
                return bad(
                    &key("timeout_secs"),
                    format!("is {}; it must be in (0, 1e6] seconds", r.timeout_secs),
                );
            }
        }
        Ok(())
    }
}
