//! Typed errors of the training crate.

use std::path::PathBuf;

/// Everything that can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A run-config key or value is wrong.
    #[error("config `{key}`: {reason}")]
    Config {
        /// Dotted key, e.g. `optimizer.lr`.
        key: String,
        /// What was wrong and what was expected.
        reason: String,
    },

    /// A TOML file that does not parse.
    #[error("cannot parse {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Parser message (with line and column).
        reason: String,
    },

    /// File-system failure.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we were doing.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },

    /// A checkpoint that cannot be used.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// Checkpoint directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// `--resume` with a config whose architecture differs from the checkpoint's.
    #[error(
        "cannot resume from {path}: the model architecture differs from the checkpoint's:\n{diffs}"
    )]
    ArchitectureChanged {
        /// Checkpoint directory.
        path: PathBuf,
        /// One line per differing field.
        diffs: String,
    },

    /// A NaN or Inf in the loss, the gradients or the updated weights.
    #[error(
        "non-finite {what} at step {step}{param}; the run stopped before {action}, and the last good checkpoint ({last_good}) is kept"
    )]
    NonFinite {
        /// Optimizer step (1-based) where it was found.
        step: usize,
        /// What was not finite, with its value (e.g. `loss (NaN)`, `gradient norm (inf)`).
        what: String,
        /// `, first in parameter NAME` when a parameter is to blame, else empty.
        param: String,
        /// What was not done (`the update`, `writing a checkpoint`).
        action: &'static str,
        /// Description of the newest checkpoint.
        last_good: String,
    },

    /// Another process trains in this run directory.
    #[error(
        "run directory {path} is in use by {holder} (its train.lock is held); wait for it to finish, stop it, or choose another --run-dir"
    )]
    RunDirLocked {
        /// The run directory.
        path: PathBuf,
        /// `PID n` of the holder.
        holder: String,
    },

    /// A run whose memory estimate is over the limit, with the options that would fit.
    #[error("{refusal}; {options}")]
    DoesNotFit {
        /// The estimate's refusal: what it needs, what is available, the largest terms.
        refusal: String,
        /// The config changes that would make it fit.
        options: String,
    },

    /// Model errors (config, weights).
    #[error(transparent)]
    Model(#[from] qwen_burn_model::ModelError),

    /// Data errors (tokenizer, shards, batching).
    #[error(transparent)]
    Data(#[from] qwen_burn_data::DataError),

    /// Reading a tensor back from the device failed.
    #[error("device read failed: {0}")]
    Device(String),

    /// Anything else, with its context.
    #[error("{0}")]
    Other(String),
}

/// Result alias of the training crate.
pub type Result<T> = std::result::Result<T, TrainError>;

impl TrainError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Config {
            key: key.into(),
            reason: reason.into(),
        }
    }
}
