//! What the trainer consumes ([`Batch`]) and the samplers' serialisable state ([`Cursor`]),
//! plus the seeded epoch order both samplers share.
//!
//! Randomness is counter-based so that a cursor is a handful of integers: the order of epoch
//! `e` is a Fisher-Yates shuffle driven by ChaCha8 seeded with `seed` on stream `e`, and the
//! windows of random-mode batch `k` come from stream `k`. Nothing depends on how many values
//! an earlier batch drew.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};

/// Loss target of positions that are not trained on (padding, prompts): HF's `ignore_index`.
pub const IGNORE_INDEX: i64 = -100;

/// One training or evaluation batch, row-major, ready to become tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Rows (B).
    pub batch_size: usize,
    /// Positions per row (T).
    pub seq_len: usize,
    /// Input ids, `[B, T]`.
    pub inputs: Vec<u32>,
    /// `targets[b * T + t]` is the id that should follow `inputs[b * T + t]`, or
    /// [`IGNORE_INDEX`]; `[B, T]`.
    pub targets: Vec<i64>,
    /// `[B, T]`, 1 = real token, 0 = padding; `None` when every position is real (packed
    /// pretraining windows).
    pub attention_mask: Option<Vec<u8>>,
    /// `[B, T]`: each input's position inside its document, restarting at 0 at every document
    /// start (HF `position_ids` of packed rows; a row's trailing padding is a document of its
    /// own). Documents of a row then never see each other. `None`: one document per row.
    pub positions: Option<Vec<u32>>,
    /// The ids of the items the rows belong to. Preference batches: the index of each pair in
    /// its data; the first half of the rows are the pairs' chosen sequences, the second half
    /// their rejected ones, in this order. RL prompt batches: each row's prompt; RL training
    /// rows: each row's index in its rollout. `None` for every other batch.
    pub pairs: Option<Vec<u32>>,
}

impl Batch {
    /// Marks documents in every row: a document starts at position 0 and after each
    /// `separator` (the end-of-document token that shards put after every document), as
    /// Megatron's `--reset-position-ids`. Rows without a separator before their last position
    /// stay one document, and a batch without any stays `positions: None`.
    pub fn with_separator_documents(mut self, separator: u32) -> Self {
        let t = self.seq_len;
        let split = self
            .inputs
            .chunks(t.max(1))
            .any(|row| row[..t.saturating_sub(1)].contains(&separator));
        if split {
            let mut positions = Vec::with_capacity(self.inputs.len());
            for row in self.inputs.chunks(t) {
                let (mut p, mut after_separator) = (0u32, false);
                for &id in row {
                    if after_separator {
                        p = 0;
                    }
                    positions.push(p);
                    p += 1;
                    after_separator = id == separator;
                }
            }
            self.positions = Some(positions);
        }
        self
    }

    /// The document starts of row `r` (indices where the position is 0), for display.
    pub fn document_starts(&self, r: usize) -> Vec<usize> {
        let t = self.seq_len;
        match &self.positions {
            Some(p) => (0..t).filter(|&i| p[r * t + i] == 0).collect(),
            None => vec![0],
        }
    }

    /// Positions whose target is not [`IGNORE_INDEX`].
    pub fn num_target_tokens(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE_INDEX).count()
    }

    /// Each row as a batch of its own, in order. A row's batch depends on that row alone: its
    /// mask is `None` when every position of the row is real, and its positions are `None`
    /// when the row is one document (`0..T`), whatever the other rows of this batch hold.
    pub fn rows(&self) -> impl Iterator<Item = Batch> + '_ {
        let t = self.seq_len;
        (0..self.batch_size).map(move |r| {
            let span = r * t..(r + 1) * t;
            let attention_mask = self
                .attention_mask
                .as_ref()
                .map(|m| m[span.clone()].to_vec())
                .filter(|m| m.contains(&0));
            let positions = self
                .positions
                .as_ref()
                .map(|p| p[span.clone()].to_vec())
                .filter(|p| p.iter().enumerate().any(|(i, &v)| v as usize != i));
            Batch {
                batch_size: 1,
                seq_len: t,
                inputs: self.inputs[span.clone()].to_vec(),
                targets: self.targets[span].to_vec(),
                attention_mask,
                positions,
                pairs: self.pairs.as_ref().and_then(|p| p.get(r).map(|&v| vec![v])),
            }
        })
    }
}

/// How window samplers pick windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleMode {
    /// Independent uniformly random window starts (with replacement), as in nanoGPT.
    Random,
    /// Epochs over a seeded shuffle of non-overlapping windows, each epoch with its own
    /// shuffle and its own random start offset.
    Epochs,
}

impl std::fmt::Display for SampleMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SampleMode::Random => "random",
            SampleMode::Epochs => "epochs",
        })
    }
}

/// A sampler's complete state, small and serialisable (JSON in checkpoints). Restoring it into
/// a sampler built with the same data and shape continues exactly where it was taken.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// Sampling mode (SFT samplers are always `epochs`).
    pub mode: SampleMode,
    /// Seed of all the sampler's randomness.
    pub seed: u64,
    /// Rows per batch.
    pub batch_size: usize,
    /// Positions per row.
    pub seq_len: usize,
    /// Items sampled from: window starts (random), windows per epoch (epochs) or SFT rows.
    pub num_items: u64,
    /// Current epoch (0 in random mode).
    pub epoch: u64,
    /// Items already taken from the current epoch (0 in random mode).
    pub position: u64,
    /// Batches produced so far.
    pub step: u64,
    /// Rows of a global batch (`batch_size x grad_accum`), which decide the data order (see
    /// [`crate::WindowSampler`]); 0 in cursors written before it was recorded, read as
    /// `batch_size`.
    #[serde(default)]
    pub global_batch: usize,
}

impl Cursor {
    /// [`Cursor::global_batch`], `batch_size` when unrecorded.
    pub fn global_rows(&self) -> usize {
        if self.global_batch == 0 {
            self.batch_size
        } else {
            self.global_batch
        }
    }

    /// The batches of `batch_size` rows that cover the rows this cursor has drawn: what a
    /// sampler restored with another split of the same global batch has produced.
    pub(crate) fn steps_at(&self, batch_size: usize) -> u64 {
        self.step * self.batch_size as u64 / batch_size.max(1) as u64
    }

    /// Checks that `self` (a saved cursor) fits a sampler whose fresh cursor is `this`.
    pub(crate) fn check_compatible(&self, this: &Cursor) -> Result<()> {
        // The split of a global batch may change (the data order depends on the global batch
        // alone); cursors from before the global batch was recorded keep their batch size.
        let (size_field, expected, found) = if self.global_batch == 0 {
            ("batch_size", this.batch_size, self.batch_size)
        } else {
            (
                "global batch (batch_size x grad_accum)",
                this.global_rows(),
                self.global_rows(),
            )
        };
        let drawn = self.step * self.batch_size as u64;
        if self.global_batch != 0 && !drawn.is_multiple_of(this.batch_size.max(1) as u64) {
            return Err(DataError::CursorMismatch {
                field: "batch_size",
                expected: format!("a divisor of the {drawn} rows drawn"),
                found: this.batch_size.to_string(),
            });
        }
        let fields: [(&'static str, String, String); 4] = [
            ("mode", this.mode.to_string(), self.mode.to_string()),
            (size_field, expected.to_string(), found.to_string()),
            (
                "seq_len",
                this.seq_len.to_string(),
                self.seq_len.to_string(),
            ),
            (
                "num_items (the data changed)",
                this.num_items.to_string(),
                self.num_items.to_string(),
            ),
        ];
        for (field, expected, found) in fields {
            if expected != found {
                return Err(DataError::CursorMismatch {
                    field,
                    expected,
                    found,
                });
            }
        }
        if self.mode == SampleMode::Epochs && self.position > self.num_items {
            return Err(DataError::CursorMismatch {
                field: "position",
                expected: format!("at most {}", self.num_items),
                found: self.position.to_string(),
            });
        }
        if self.seed != this.seed {
            tracing::info!(
                "restored data cursor has seed {} (configured {}); continuing with the cursor's",
                self.seed,
                this.seed
            );
        }
        Ok(())
    }
}

/// A global batch of `global_rows` rows must be whole batches of `batch_size`.
pub(crate) fn check_global_batch(global_rows: usize, batch_size: usize) -> Result<()> {
    if global_rows == 0 || !global_rows.is_multiple_of(batch_size) {
        return Err(DataError::option(
            "global batch",
            format!("{global_rows} rows is not a multiple of the batch size {batch_size}"),
        ));
    }
    Ok(())
}

/// ChaCha8 seeded with `seed`, positioned on `stream`.
pub(crate) fn stream_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// Uniform integer in `[0, n)` by 64x64->128 multiply (bias below n / 2^64, negligible), kept
/// here rather than borrowed from `rand` so data order does not change with `rand` versions.
pub(crate) fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    ((rng.next_u64() as u128 * n as u128) >> 64) as u64
}

/// Seeded per-epoch shuffle of `0..n` with a position inside the current epoch.
#[derive(Clone, Debug)]
pub(crate) struct EpochOrder {
    pub(crate) seed: u64,
    pub(crate) epoch: u64,
    pub(crate) position: u64,
    order: Vec<u32>,
}

impl EpochOrder {
    /// Epoch 0, position 0. `n` must be in `1..=u32::MAX` (checked by the samplers).
    pub(crate) fn new(n: usize, seed: u64) -> Self {
        let mut e = EpochOrder {
            seed,
            epoch: 0,
            position: 0,
            order: (0..n as u32).collect(),
        };
        e.shuffle();
        e
    }

    pub(crate) fn len(&self) -> u64 {
        self.order.len() as u64
    }

    fn shuffle(&mut self) {
        let n = self.order.len();
        self.order
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as u32);
        let mut rng = stream_rng(self.seed, self.epoch);
        for i in (1..n).rev() {
            let j = below(&mut rng, i as u64 + 1) as usize;
            self.order.swap(i, j);
        }
    }

    /// Moves to `(seed, epoch, position)`, reshuffling only if the epoch or seed changed.
    pub(crate) fn seek(&mut self, seed: u64, epoch: u64, position: u64) {
        if seed != self.seed || epoch != self.epoch {
            self.seed = seed;
            self.epoch = epoch;
            self.shuffle();
        }
        self.position = position;
    }

    /// The next item, rolling over into a freshly shuffled epoch when one ends.
    pub(crate) fn next_item(&mut self) -> usize {
        if self.position == self.len() {
            self.epoch += 1;
            self.position = 0;
            self.shuffle();
        }
        let item = self.order[self.position as usize] as usize;
        self.position += 1;
        item
    }
}

/// Checks batch/sequence sizes shared by all samplers.
pub(crate) fn check_shape(batch_size: usize, seq_len: usize) -> Result<()> {
    if batch_size == 0 {
        return Err(DataError::option("batch_size", "must be at least 1"));
    }
    if seq_len == 0 {
        return Err(DataError::option("seq_len", "must be at least 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_order_is_a_permutation_that_changes_per_epoch() {
        let mut o = EpochOrder::new(100, 7);
        let e0: Vec<usize> = (0..100).map(|_| o.next_item()).collect();
        let e1: Vec<usize> = (0..100).map(|_| o.next_item()).collect();
        assert_eq!(o.epoch, 1);
        let mut s0 = e0.clone();
        s0.sort();
        assert_eq!(s0, (0..100).collect::<Vec<_>>());
        assert_ne!(e0, e1);
        assert_ne!(e0, (0..100).collect::<Vec<_>>());
        let mut again = EpochOrder::new(100, 7);
        again.seek(7, 1, 0);
        let e1b: Vec<usize> = (0..100).map(|_| again.next_item()).collect();
        assert_eq!(e1, e1b);
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = stream_rng(1, 2);
        assert!((0..10_000).all(|_| below(&mut rng, 7) < 7));
    }
}
