//! Helpers of the RL tests (`grpo.rs`, `grpo_paths.rs`): the fixtures' directory, a matrix as a
//! tensor, an empty batch to fill row by row, and TRL's tolerance check.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_data::Batch;

/// `crates/train/tests/fixtures`.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// `[rows, cols]` from rows of equal length.
pub fn tensor(rows: &[Vec<f32>], device: &Device) -> Tensor<2> {
    let (b, t) = (rows.len(), rows[0].len());
    Tensor::from_data(TensorData::new(rows.concat(), [b, t]), device)
}

/// A batch of `rows x seq_len` with no tokens yet and an attention mask to fill.
pub fn empty_batch(rows: usize, seq_len: usize) -> Batch {
    Batch {
        batch_size: rows,
        seq_len,
        inputs: Vec::new(),
        targets: Vec::new(),
        attention_mask: Some(Vec::new()),
        positions: None,
        pairs: None,
    }
}

/// `ours` within `tol` of TRL's `theirs` (relative above 1, absolute below).
pub fn close(ours: f64, theirs: f64, tol: f64, what: &str) {
    assert!(
        (ours - theirs).abs() <= tol * theirs.abs().max(1.0),
        "{what}: ours {ours}, TRL {theirs}"
    );
}
