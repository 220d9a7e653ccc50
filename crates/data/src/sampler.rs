//! Pretraining batches from a packed token stream: windows of `T + 1` tokens become one row of
//! inputs (`w[0..T]`) and targets (`w[1..T + 1]`).
//!
//! Two modes ([`SampleMode`]):
//! - `Random`: each row starts at a uniformly random token (nanoGPT's sampler). Global batch
//!   `k` (the `batch_size x grad_accum` rows of one optimizer step) draws from RNG stream `k`,
//!   row `j` of it from the stream's `j`-th value: the rows of a step depend on the seed, the
//!   data and the global batch, never on how it is split into micro-batches.
//! - `Epochs`: the stream is cut into `(N - 1) / T` windows of stride `T` (inputs never
//!   overlap), shifted by a random offset in `[0, slack]` per epoch, and visited in a seeded
//!   shuffled order per epoch. A batch that crosses an epoch boundary continues into the next
//!   epoch, so every batch is full.

use crate::batch::{
    Batch, Cursor, EpochOrder, SampleMode, below, check_global_batch, check_shape, stream_rng,
};
use crate::error::{DataError, Result};
use crate::shards::TokenStore;

/// Decorrelates the per-epoch offset stream from the shuffle stream of the same seed.
const OFFSET_DOMAIN: u64 = 0x6f66_6673_6574_2d31;

/// Seeded, resumable sampler of `[B, T]` windows over a token stream of known length.
#[derive(Clone, Debug)]
pub struct WindowSampler {
    num_tokens: usize,
    batch_size: usize,
    seq_len: usize,
    mode: SampleMode,
    seed: u64,
    step: u64,
    /// Rows of a global batch (random mode's stream unit).
    global_rows: usize,
    /// Window starts to draw from (random) or windows per epoch (epochs).
    num_items: usize,
    /// Epochs mode: unused tokens at offset 0, the range of the per-epoch offset.
    slack: usize,
    order: Option<EpochOrder>,
    window: Vec<u32>,
}

impl WindowSampler {
    /// A sampler over `num_tokens` tokens; fails if they cannot hold one window of
    /// `seq_len + 1` tokens.
    pub fn new(
        num_tokens: usize,
        batch_size: usize,
        seq_len: usize,
        mode: SampleMode,
        seed: u64,
    ) -> Result<Self> {
        check_shape(batch_size, seq_len)?;
        if num_tokens < seq_len + 1 {
            return Err(DataError::CorpusTooShort {
                tokens: num_tokens,
                window: seq_len + 1,
                seq_len,
                context: String::new(),
            });
        }
        let (num_items, slack, order) = match mode {
            SampleMode::Random => (num_tokens - seq_len, 0, None),
            SampleMode::Epochs => {
                let n = (num_tokens - 1) / seq_len;
                if n > u32::MAX as usize {
                    return Err(DataError::option(
                        "seq_len",
                        format!("{n} windows per epoch exceed 2^32; use a longer seq_len"),
                    ));
                }
                (
                    n,
                    num_tokens - 1 - n * seq_len,
                    Some(EpochOrder::new(n, seed)),
                )
            }
        };
        Ok(WindowSampler {
            num_tokens,
            batch_size,
            seq_len,
            mode,
            seed,
            step: 0,
            global_rows: batch_size,
            num_items,
            slack,
            order,
            window: vec![0; seq_len + 1],
        })
    }

    /// [`WindowSampler::new`] over a store's length, naming the split and directory in the
    /// too-short error.
    pub fn for_store(
        store: &TokenStore,
        batch_size: usize,
        seq_len: usize,
        mode: SampleMode,
        seed: u64,
    ) -> Result<Self> {
        Self::new(store.len(), batch_size, seq_len, mode, seed).map_err(|e| match e {
            DataError::CorpusTooShort {
                tokens,
                window,
                seq_len,
                ..
            } => DataError::CorpusTooShort {
                tokens,
                window,
                seq_len,
                context: format!(" ({})", store.describe()),
            },
            other => other,
        })
    }

    /// Batches of `global_rows` rows (a multiple of the batch size: `batch_size x grad_accum`)
    /// decide the data order; the default is one batch.
    pub fn with_global_batch(mut self, global_rows: usize) -> Result<Self> {
        check_global_batch(global_rows, self.batch_size)?;
        self.global_rows = global_rows;
        Ok(self)
    }

    /// The state after the batches produced so far.
    pub fn cursor(&self) -> Cursor {
        let (epoch, position) = self
            .order
            .as_ref()
            .map_or((0, 0), |o| (o.epoch, o.position));
        Cursor {
            mode: self.mode,
            seed: self.seed,
            batch_size: self.batch_size,
            seq_len: self.seq_len,
            num_items: self.num_items as u64,
            epoch,
            position,
            step: self.step,
            global_batch: self.global_rows,
        }
    }

    /// Continues from a saved cursor. Mode, batch size, sequence length and the data size must
    /// match this sampler; the cursor's seed is adopted.
    pub fn restore(&mut self, c: &Cursor) -> Result<()> {
        c.check_compatible(&self.cursor())?;
        self.seed = c.seed;
        self.step = c.steps_at(self.batch_size);
        // A cursor from before the global batch was recorded drew one stream per batch.
        self.global_rows = if c.global_batch == 0 {
            c.batch_size
        } else {
            self.global_rows
        };
        if let Some(o) = self.order.as_mut() {
            o.seek(c.seed, c.epoch, c.position);
        }
        Ok(())
    }

    /// Batches produced so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The next `[B, T]` batch (no attention mask: every position is real).
    ///
    /// # Panics
    /// If `store` does not hold the `num_tokens` this sampler was built for.
    pub fn next_batch(&mut self, store: &TokenStore) -> Batch {
        assert_eq!(
            store.len(),
            self.num_tokens,
            "sampler built for {} tokens used with {}",
            self.num_tokens,
            store.describe()
        );
        let (b, t) = (self.batch_size, self.seq_len);
        let mut inputs = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        let first = self.step * b as u64;
        let g = self.global_rows as u64;
        let mut rng = stream_rng(self.seed, first / g);
        // Row j of a global batch takes the stream's j-th value (`below` draws one u64, two
        // 32-bit words).
        rng.set_word_pos(u128::from(first % g) * 2);
        for _ in 0..b {
            let start = match self.order.as_mut() {
                None => below(&mut rng, self.num_items as u64) as usize,
                Some(order) => {
                    let w = order.next_item();
                    epoch_offset(self.seed, order.epoch, self.slack) + w * t
                }
            };
            store.read(start, &mut self.window);
            inputs.extend_from_slice(&self.window[..t]);
            targets.extend(self.window[1..].iter().map(|&x| x as i64));
        }
        self.step += 1;
        Batch {
            batch_size: b,
            seq_len: t,
            inputs,
            targets,
            attention_mask: None,
            positions: None,
            pairs: None,
        }
    }
}

/// Start offset of all windows in `epoch`, uniform in `[0, slack]`.
fn epoch_offset(seed: u64, epoch: u64, slack: usize) -> usize {
    if slack == 0 {
        return 0;
    }
    below(
        &mut stream_rng(seed ^ OFFSET_DOMAIN, epoch),
        slack as u64 + 1,
    ) as usize
}

/// Deterministic validation batches: windows `i * T .. i * T + T + 1` from the start of the
/// stream (inputs never overlap), `batch_size` per batch, at most `max_batches` batches. The
/// last batch may have fewer rows (its `batch_size` says how many). Empty if the stream cannot
/// hold one window.
pub fn eval_batches(
    store: &TokenStore,
    batch_size: usize,
    seq_len: usize,
    max_batches: usize,
) -> Vec<Batch> {
    if batch_size == 0 || seq_len == 0 || store.len() < seq_len + 1 {
        tracing::warn!(
            "{} has {} tokens, fewer than one window of {}: no eval batches",
            store.describe(),
            store.len(),
            seq_len + 1
        );
        return Vec::new();
    }
    let windows = (store.len() - 1) / seq_len;
    let mut window = vec![0u32; seq_len + 1];
    let mut batches = Vec::new();
    let mut next = 0;
    while next < windows && batches.len() < max_batches {
        let rows = batch_size.min(windows - next);
        let mut inputs = Vec::with_capacity(rows * seq_len);
        let mut targets = Vec::with_capacity(rows * seq_len);
        for w in next..next + rows {
            store.read(w * seq_len, &mut window);
            inputs.extend_from_slice(&window[..seq_len]);
            targets.extend(window[1..].iter().map(|&x| x as i64));
        }
        next += rows;
        batches.push(Batch {
            batch_size: rows,
            seq_len,
            inputs,
            targets,
            attention_mask: None,
            positions: None,
            pairs: None,
        });
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_short_names_sizes() {
        let e = WindowSampler::new(10, 2, 10, SampleMode::Random, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "corpus of 10 tokens is shorter than one window of 11 tokens (seq_len 10 + 1); use a \
             shorter seq_len or more data"
        );
        assert!(WindowSampler::new(11, 2, 10, SampleMode::Epochs, 0).is_ok());
    }

    #[test]
    fn epoch_windows_stay_inside_the_stream() {
        for n in [11usize, 12, 25, 31, 100] {
            let s = WindowSampler::new(n, 1, 10, SampleMode::Epochs, 3).unwrap();
            for e in 0..20 {
                let off = epoch_offset(3, e, s.slack);
                assert!(off + (s.num_items - 1) * 10 + 11 <= n, "n {n} epoch {e}");
            }
        }
    }
}
