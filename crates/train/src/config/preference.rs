//! The `[preference]` section: the loss of preference fine-tuning (`data.kind = "preference"`).

use serde::{Deserialize, Serialize};

/// `[preference]`: how pairs of chosen and rejected completions train the model (TRL 1.16.0's
/// `DPOTrainer` losses, with its defaults).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PreferenceConfig {
    /// `sigmoid` (DPO), `hinge` (SLiC), `ipo` (length-normalised, as TRL), or `robust` (DPO
    /// with label smoothing).
    pub loss: PreferenceLoss,
    /// The temperature of the implicit reward (`beta * log-ratio`); IPO's regularisation.
    pub beta: f64,
    /// The assumed share of flipped labels, for `robust`; in [0, 0.5).
    pub label_smoothing: f64,
    /// Which end of a sequence longer than `training.seq_len` tokens is kept:
    /// `keep_start` (drops a pair whose prompt alone is that long) or `keep_end`.
    pub truncation: TruncationMode,
}

impl Default for PreferenceConfig {
    fn default() -> Self {
        Self {
            loss: PreferenceLoss::Sigmoid,
            beta: 0.1,
            label_smoothing: 0.0,
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
}

impl PreferenceLoss {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PreferenceLoss::Sigmoid => "sigmoid",
            PreferenceLoss::Hinge => "hinge",
            PreferenceLoss::Ipo => "ipo",
            PreferenceLoss::Robust => "robust",
        }
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
        Ok(())
    }
}
