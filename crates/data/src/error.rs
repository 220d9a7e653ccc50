//! The crate's error type.
//!
//! Every variant carries enough context to act on the message alone: the file, the line or byte
//! offset, the field, and what was expected.

use std::path::PathBuf;

/// Everything that can go wrong while reading corpora, tokenising, writing or reading token
/// shards, and sampling batches.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An operating-system error on a named file or directory.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory being read or written.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// An input path given by the user does not exist.
    #[error("input path {path} does not exist")]
    MissingPath {
        /// The path as given.
        path: PathBuf,
    },

    /// The inputs contain no document with any text.
    #[error("empty corpus: {detail} (inputs: {inputs})")]
    EmptyCorpus {
        /// The inputs as given, comma-separated.
        inputs: String,
        /// What was found (no files, only empty files, ...).
        detail: String,
    },

    /// A corpus file is not valid UTF-8.
    #[error(
        "{path}: invalid UTF-8 at byte offset {offset} (line {line}{gz}); \
         the corpus must be UTF-8 text"
    )]
    InvalidUtf8 {
        /// The corpus file.
        path: PathBuf,
        /// Byte offset of the first invalid byte (in the decompressed stream for `.gz`).
        offset: usize,
        /// 1-based line of that byte.
        line: usize,
        /// `", of the decompressed stream"` for `.gz` files, else empty.
        gz: &'static str,
    },

    /// A `tokenizer_config.json` chat template that cannot be read, compiled or applied.
    #[error("chat template of {path}: {message}")]
    ChatTemplate {
        /// The `tokenizer_config.json`.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },

    /// A Parquet file that cannot be read, or whose text column is missing or not a string.
    #[error("{path}: {message}")]
    Parquet {
        /// The Parquet file.
        path: PathBuf,
        /// What is wrong and what was expected.
        message: String,
    },

    /// A multiple-choice task row that is not a question of a known layout.
    #[error("{path}: row {row}: {message}")]
    Task {
        /// The task file.
        path: PathBuf,
        /// 1-based row (the line of a JSONL file).
        row: usize,
        /// What is wrong and what was expected.
        message: String,
    },

    /// A JSONL line that is not a JSON object with the expected fields.
    #[error("{path}:{line}: {message}")]
    Jsonl {
        /// The JSONL file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong and what was expected.
        message: String,
    },

    /// A `tokenizer.json` that cannot be parsed by the `tokenizers` crate.
    #[error("cannot load tokenizer {path}: {message}")]
    TokenizerLoad {
        /// The tokenizer file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },

    /// Encoding, decoding, training or saving failed inside the `tokenizers` crate.
    #[error("tokenizer error while {action}: {message}")]
    Tokenizer {
        /// What was being done (`"encoding"`, `"training BPE"`, ...).
        action: String,
        /// The `tokenizers` crate's message.
        message: String,
    },

    /// The tokenizer lacks a token this crate needs.
    #[error("tokenizer {path} has no {token:?} token, needed {purpose}")]
    MissingToken {
        /// The tokenizer file.
        path: PathBuf,
        /// The missing token.
        token: String,
        /// Why it is needed.
        purpose: String,
    },

    /// Shards were prepared with a different tokenizer than the one configured.
    #[error(
        "token shards in {dir} were prepared with tokenizer sha256 {found}, but the configured \
         tokenizer has sha256 {expected}; re-run `qwen-burn data prepare --out {dir}` with the \
         configured tokenizer"
    )]
    TokenizerMismatch {
        /// The shard directory.
        dir: PathBuf,
        /// Hash of the configured tokenizer.
        expected: String,
        /// Hash recorded in the shard metadata.
        found: String,
    },

    /// A shard directory without (valid) metadata.
    #[error("{path}: {message}")]
    Meta {
        /// The `meta.json` file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// A token shard whose header or size does not match its metadata.
    #[error("corrupt token shard {path}: {message}")]
    BadShard {
        /// The shard file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// The token stream cannot hold a single training window.
    #[error(
        "corpus of {tokens} tokens{context} is shorter than one window of {window} tokens \
         (seq_len {seq_len} + 1); use a shorter seq_len or more data"
    )]
    CorpusTooShort {
        /// Tokens available.
        tokens: usize,
        /// seq_len + 1.
        window: usize,
        /// The requested sequence length.
        seq_len: usize,
        /// Where the tokens come from, e.g. `" (train split of data/shards)"`, or empty.
        context: String,
    },

    /// An option or argument outside its valid range.
    #[error("invalid {field}: {message}")]
    InvalidOption {
        /// The option's name.
        field: String,
        /// The rule it breaks.
        message: String,
    },

    /// A saved cursor that belongs to a different sampler configuration.
    #[error(
        "cannot restore data cursor: {field} is {found} in the cursor but {expected} in this \
         sampler"
    )]
    CursorMismatch {
        /// The mismatching field.
        field: &'static str,
        /// This sampler's value.
        expected: String,
        /// The cursor's value.
        found: String,
    },

    /// The background prefetch thread died (it panicked; the panic message is in the log).
    #[error("the batch prefetch thread stopped unexpectedly (it panicked)")]
    PrefetchStopped,
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, DataError>;

impl DataError {
    /// An [`DataError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }

    /// A [`DataError::Tokenizer`] from the `tokenizers` crate's boxed error.
    pub(crate) fn tokenizer(action: &str, err: impl std::fmt::Display) -> Self {
        DataError::Tokenizer {
            action: action.to_string(),
            message: err.to_string(),
        }
    }

    /// A [`DataError::InvalidOption`].
    pub(crate) fn option(field: &str, message: impl Into<String>) -> Self {
        DataError::InvalidOption {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// The message of a caught panic (a `&str` or `String` payload), for errors that report a
/// panic of a dependency on malformed input.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown error".into())
}
