//! Typed errors of the model crate.

use std::path::PathBuf;

/// Everything that can go wrong when building, loading or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A config field has a value the model cannot use.
    #[error("invalid config field `{field}`: {reason}")]
    InvalidConfig {
        /// HF `config.json` key, e.g. `num_key_value_heads` (nested: `rope_scaling.factor`).
        field: String,
        /// What was wrong and what was expected.
        reason: String,
    },

    /// A model (or a training run) that would not fit in memory, refused before allocating.
    #[error(
        "{what} needs about {need} but {available} is available ({limit_source}); the largest \
         parts: {parts}. Reduce those config fields, or set QWEN_BURN_MEMORY_LIMIT (e.g. 64GiB) \
         if the estimate is wrong for this machine"
    )]
    TooLarge {
        /// What was about to be built ("the model of config.json", "training").
        what: String,
        /// Estimated bytes, human-readable.
        need: String,
        /// Available bytes, human-readable.
        available: String,
        /// Where the available figure comes from.
        limit_source: String,
        /// The biggest terms of the estimate, each naming the config fields it comes from.
        parts: String,
    },

    /// A `config.json` that is not JSON or does not have the expected types.
    #[error("cannot parse {path}: {reason}")]
    ConfigParse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },

    /// File-system failure, with the file it concerned.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we were doing ("read", "write", "create directory", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A safetensors file that cannot be parsed.
    #[error("corrupt safetensors file {path}: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },

    /// The checkpoint lacks a tensor the model needs.
    #[error("missing tensor `{key}` (expected shape {expected:?}) in {source_desc}")]
    MissingTensor {
        /// HF key.
        key: String,
        /// Shape the model expects, in HF layout.
        expected: Vec<usize>,
        /// Which checkpoint.
        source_desc: String,
    },

    /// The checkpoint holds tensors the model does not have.
    #[error("unexpected tensor(s) in {source_desc}: {keys}")]
    UnexpectedTensors {
        /// Comma-separated keys with shapes.
        keys: String,
        /// Which checkpoint.
        source_desc: String,
    },

    /// A tensor with the wrong shape.
    #[error("tensor `{key}` has shape {found:?} in {source_desc}, the model expects {expected:?}")]
    ShapeMismatch {
        /// HF key.
        key: String,
        /// Shape the model expects, in HF layout.
        expected: Vec<usize>,
        /// Shape found in the file.
        found: Vec<usize>,
        /// Which checkpoint.
        source_desc: String,
    },

    /// A tensor with a dtype we cannot convert to f32.
    #[error("tensor `{key}` in {source_desc} has dtype {dtype}, expected F32, F16 or BF16")]
    UnsupportedDType {
        /// HF key.
        key: String,
        /// dtype name.
        dtype: String,
        /// Which checkpoint.
        source_desc: String,
    },

    /// Reading tensor data back from the device failed.
    #[error("cannot read tensor `{key}` from the device: {reason}")]
    TensorRead {
        /// Parameter path.
        key: String,
        /// Backend message.
        reason: String,
    },

    /// Bad input to generation or scoring.
    #[error("{0}")]
    InvalidInput(String),

    /// A hub id that is neither cached nor downloadable.
    #[error("model `{id}`: {reason}")]
    Hub {
        /// `ORG/NAME@REV`.
        id: String,
        /// What was tried, and the command that fetches it.
        reason: String,
    },

    /// The model holds state HF transformers cannot represent.
    #[error("cannot export: {0}")]
    Export(String),
}

/// Result alias of the model crate.
pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
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

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
