//! Background batch preparation so the training step never waits on data.
//!
//! A [`Prefetcher`] owns a sampler on its own thread and keeps up to `depth` finished batches
//! in a bounded channel. Each batch comes with the cursor *after* it, so a checkpoint taken
//! after consuming batch `k` stores exactly the state that yields batch `k + 1` on resume,
//! regardless of how many batches were prefetched but not consumed.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::batch::{Batch, Cursor};
use crate::chat::{SftDataset, SftSampler};
use crate::error::{DataError, Result};
use crate::sampler::WindowSampler;
use crate::shards::TokenStore;

/// How long the consumer waited on data (time spent blocked in [`Prefetcher::next`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefetchStats {
    /// Batches handed out.
    pub batches: u64,
    /// Total time blocked waiting for a batch.
    pub total_wait: Duration,
    /// Longest single wait.
    pub max_wait: Duration,
}

impl PrefetchStats {
    /// Mean wait per batch.
    pub fn mean_wait(&self) -> Duration {
        if self.batches == 0 {
            Duration::ZERO
        } else {
            self.total_wait / self.batches as u32
        }
    }
}

/// A background thread producing `(batch, cursor after the batch)` pairs in order.
pub struct Prefetcher {
    rx: Option<Receiver<(Batch, Cursor)>>,
    handle: Option<JoinHandle<()>>,
    stats: PrefetchStats,
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("stats", &self.stats)
            .finish()
    }
}

impl Prefetcher {
    /// Runs `produce` on a background thread, keeping up to `depth` (at least 1) results ready.
    pub fn spawn<F>(depth: usize, mut produce: F) -> Self
    where
        F: FnMut() -> (Batch, Cursor) + Send + 'static,
    {
        let (tx, rx): (SyncSender<(Batch, Cursor)>, _) = sync_channel(depth.max(1));
        let handle = std::thread::Builder::new()
            .name("qwen-burn-prefetch".into())
            .spawn(move || {
                // Ends when the consumer drops the receiver.
                while tx.send(produce()).is_ok() {}
            });
        let handle = match handle {
            Ok(h) => Some(h),
            Err(e) => {
                // Without a thread the channel's sender is gone, and next() reports it.
                tracing::error!("cannot spawn the prefetch thread: {e}");
                None
            }
        };
        Prefetcher {
            rx: Some(rx),
            handle,
            stats: PrefetchStats::default(),
        }
    }

    /// Prefetches pretraining windows from `store`.
    pub fn windows(store: Arc<TokenStore>, mut sampler: WindowSampler, depth: usize) -> Self {
        Self::spawn(depth, move || {
            let batch = sampler.next_batch(&store);
            (batch, sampler.cursor())
        })
    }

    /// Prefetches chat SFT batches from `dataset`.
    pub fn sft(dataset: Arc<SftDataset>, mut sampler: SftSampler, depth: usize) -> Self {
        Self::spawn(depth, move || {
            let batch = sampler.next_batch(&dataset);
            (batch, sampler.cursor())
        })
    }

    /// The next batch and the cursor to checkpoint once it has been consumed.
    // Not `Iterator::next`: the trainer needs the error, and the stream never ends.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<(Batch, Cursor)> {
        let rx = self.rx.as_ref().ok_or(DataError::PrefetchStopped)?;
        let t0 = Instant::now();
        let item = rx.recv().map_err(|_| DataError::PrefetchStopped)?;
        let waited = t0.elapsed();
        self.stats.batches += 1;
        self.stats.total_wait += waited;
        self.stats.max_wait = self.stats.max_wait.max(waited);
        Ok(item)
    }

    /// Time the consumer has spent waiting so far.
    pub fn stats(&self) -> &PrefetchStats {
        &self.stats
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Dropping the receiver makes the producer's next send fail, ending its loop.
        self.rx.take();
        if let Some(h) = self.handle.take()
            && h.join().is_err()
        {
            tracing::warn!("the prefetch thread had panicked");
        }
    }
}
