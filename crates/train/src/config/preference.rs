//! The `[preference]` section: the loss of preference fine-tuning (`data.kind = "preference"`).

use serde::{Deserialize, Serialize};

/// `[preference]`: how pairs of chosen and rejected completions train the model (TRL 1.16.0's
/// `DPOTrainer` losses, its `CPOTrainer`'s SimPO and its `ORPOTrainer`, with their defaults).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PreferenceConfig {
    /// `sigmoid` (DPO), `hinge` (SLiC), `ipo` (length-normalised, as TRL), `robust` (DPO
    /// with label smoothing), or the reference-free `simpo` and `orpo`.
    pub loss: PreferenceLoss,
    /// The temperature of the implicit reward (`beta * log-ratio`); IPO's regularisation;
    /// SimPO's reward scale; ORPO's weight of the odds-ratio term (TRL's `beta`).
    pub beta: f64,
    /// SimPO's target reward margin (TRL's `simpo_gamma`, 0.5 when unset); read by `simpo`
    /// only.
    pub gamma: Option<f64>,
    /// The assumed share of flipped labels, for `robust`; in [0, 0.5).
    pub label_smoothing: f64,
    /// Weight of an added NLL term: the micro-batch's mean negative log-probability of its
    /// chosen completions' tokens (RPO; TRL's `loss_type = [loss, "sft"]` with
    /// `loss_weights = [1, sft_weight]`, formerly `rpo_alpha`). 0 (default): none. For the
    /// losses with a reference (`sigmoid`, `hinge`, `ipo`, `robust`).
    pub sft_weight: f64,
    /// Which end of a sequence longer than `training.seq_len` tokens is kept:
    /// `keep_start` (drops a pair whose prompt alone is that long) or `keep_end`.
    pub truncation: TruncationMode,
}

impl Default for PreferenceConfig {
    fn default() -> Self {
        Self {
            loss: PreferenceLoss::Sigmoid,
            beta: 0.1,
            gamma: None,
            label_smoothing: 0.0,
            sft_weight: 0.0,
            truncation: TruncationMode::KeepStart,
        }
    }
}

/// `preference.loss`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PreferenceLoss {
    /// DPO: `-log sigmoid(beta * delta)`.
    #[default]
    Sigmoid,
    /// SLiC's hinge: `relu(1 - beta * delta)`.
    Hinge,
    /// IPO, on log-ratios averaged over completion tokens: `(delta_avg - 1 / (2 beta))^2`.
    Ipo,
    /// Robust DPO with `label_smoothing`.
    Robust,
    /// SimPO (reference-free), on mean per-token log-probabilities `a`:
    /// `-log sigmoid(beta (a_c - a_r) - gamma)`.
    Simpo,
    /// ORPO (reference-free): the chosen completions' token-mean NLL minus
    /// `beta * log sigmoid(log-odds ratio)` of the mean per-token probabilities.
    Orpo,
}

impl PreferenceLoss {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PreferenceLoss::Sigmoid => "sigmoid",
            PreferenceLoss::Hinge => "hinge",
            PreferenceLoss::Ipo => "ipo",
            PreferenceLoss::Robust => "robust",
            PreferenceLoss::Simpo => "simpo",
            PreferenceLoss::Orpo => "orpo",
        }
    }

    /// Every loss, in the order of the docs.
    pub const ALL: [PreferenceLoss; 6] = [
        PreferenceLoss::Sigmoid,
        PreferenceLoss::Hinge,
        PreferenceLoss::Ipo,
        PreferenceLoss::Robust,
        PreferenceLoss::Simpo,
        PreferenceLoss::Orpo,
    ];

    /// Whether the loss compares with a reference model's log-probabilities (all but `simpo`
    /// and `orpo`).
    pub fn needs_reference(self) -> bool {
        !matches!(self, PreferenceLoss::Simpo | PreferenceLoss::Orpo)
    }
}

/// SimPO's `gamma` when `preference.gamma` is unset (TRL's `CPOConfig.simpo_gamma`).
pub const DEFAULT_SIMPO_GAMMA: f64 = 0.5;

impl PreferenceConfig {
    /// SimPO's target margin.
    pub fn simpo_gamma(&self) -> f64 {
        self.gamma.unwrap_or(DEFAULT_SIMPO_GAMMA)
    }
}

/// `preference.truncation`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TruncationMode {
    /// Cut the end.
    #[default]
    KeepStart,
    /// Cut the start.
    KeepEnd,
}

impl PreferenceConfig {
    /// Refuse values the losses cannot use, naming the key.
    pub fn check(&self) -> crate::error::Result<()> {
        use crate::error::TrainError;
        if !(self.beta.is_finite() && self.beta > 0.0) {
            return Err(TrainError::config(
                "preference.beta",
                format!("is {}; it must be above 0", self.beta),
            ));
        }
        if !(0.0..0.5).contains(&self.label_smoothing) {
            return Err(TrainError::config(
                "preference.label_smoothing",
                format!("is {}; it must be in [0, 0.5)", self.label_smoothing),
            ));
        }
        if self.label_smoothing > 0.0 && self.loss != PreferenceLoss::Robust {
            return Err(TrainError::config(
                "preference.label_smoothing",
                format!(
                    "is read by loss = \"robust\" only, not \"{}\"; remove it or use robust",
                    self.loss.as_str()
                ),
            ));
        }
        if !(self.sft_weight.is_finite() && self.sft_weight >= 0.0) {
            return Err(TrainError::config(
                "preference.sft_weight",
                format!("is {}; it must be 0 or above", self.sft_weight),
            ));
        }
        if self.sft_weight > 0.0 && !self.loss.needs_reference() {
            return Err(TrainError::config(
                "preference.sft_weight",
                format!(
                    "adds TRL DPOTrainer's \"sft\" term to sigmoid, hinge, ipo or robust, not to \
                     \"{}\" (orpo has its own NLL term); remove it or change the loss",
                    self.loss.as_str()
                ),
            ));
        }
        if let Some(gamma) = self.gamma {
            if self.loss != PreferenceLoss::Simpo {
                return Err(TrainError::config(
                    "preference.gamma",
                    format!(
                        "is read by loss = \"simpo\" only, not \"{}\"; remove it or use simpo",
                        self.loss.as_str()
                    ),
                ));
            }
            if !gamma.is_finite() {
                return Err(TrainError::config(
                    "preference.gamma",
                    format!("is {gamma}; it must be a finite number"),
                ));
            }
        }
        Ok(())
    }
}
