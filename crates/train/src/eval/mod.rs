//! Evaluation: what a run measures of its model besides the training loss, and what the
//! `eval` and `score` commands compute.
//!
//! - [`validation`]: the validation loss and bits per byte; windowed perplexity of a text.
//! - [`tasks`]: multiple-choice tasks by log-likelihood, as lm-evaluation-harness scores them.
//! - [`sample`]: the periodic samples of a run.
//! - [`generation`]: rewards of generated completions (`eval --generate`): accuracy, pass@k.

pub mod generation;
pub mod sample;
pub mod tasks;
pub mod validation;
