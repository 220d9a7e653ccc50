//! How the AMX products walk a task's tiles ([`super::amx::block_tiles`]): choices measured
//! against each other on a CPU with AMX (`examples/bf16_projection --amx-walks`).

use std::sync::atomic::{AtomicUsize, Ordering};

/// The most reduction blocks of one group ([`Walk::group`]).
pub(super) const MAX_GROUP: usize = 4;

/// How [`super::amx::block_tiles`] walks a task, measured against each other on a CPU with AMX by
/// `examples/bf16_projection --amx-walks` (`benches/README.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Reduction blocks whose sums stay in the tiles (the accumulators are loaded and stored
    /// once per group), 1 to [`MAX_GROUP`]: the default 3 keeps three blocks of `b`'s panel,
    /// 48 KiB, in the L1 and L2 caches across the row tiles.
    pub group: usize,
    /// Fetch the next step's tiles of `a` and `b` (2 KiB each) into the L1 cache while a step
    /// runs: `tileloadd` waits on data that is not there yet.
    pub prefetch: bool,
}

impl Walk {
    /// The walk the products take unless [`set_walk`] chose another: the best median of the
    /// eight walks on an Emerald Rapids Xeon (1.14x and 1.15x the former default, 2 blocks
    /// without prefetching, on the bf16-weight and mixed-precision products of the Qwen3-1.7B
    /// MLP's shapes; `benches/README.md`, twenty-second session).
    pub const DEFAULT: Walk = Walk {
        group: 3,
        prefetch: true,
    };

    const fn code(self) -> usize {
        self.group << 1 | self.prefetch as usize
    }
}

/// The walk in use, as [`Walk::code`].
static WALK: AtomicUsize = AtomicUsize::new(Walk::DEFAULT.code());

/// The walk the AMX products take from now on (measurements only: the products are the same
/// numbers under every walk, up to the order of the f32 sums across groups); `None` for a
/// group outside 1 to [`MAX_GROUP`].
pub fn set_walk(walk: Walk) -> Option<Walk> {
    (1..=MAX_GROUP).contains(&walk.group).then(|| {
        WALK.store(walk.code(), Ordering::Relaxed);
        walk
    })
}

thread_local! {
    /// A walk for the products this thread starts, over [`WALK`] (tests: a test's walk must
    /// not reach the products of the tests running beside it).
    static THIS_THREAD: std::cell::Cell<Option<Walk>> = const { std::cell::Cell::new(None) };
}

/// The walk of a product started on this thread: read once by the product, on the thread that
/// calls it (its tasks run on others).
pub(super) fn walk() -> Walk {
    THIS_THREAD.get().unwrap_or_else(|| {
        let code = WALK.load(Ordering::Relaxed);
        Walk {
            group: code >> 1,
            prefetch: code & 1 == 1,
        }
    })
}

/// `f` with the products this thread starts taking `walk`.
#[cfg(test)]
pub(super) fn with_walk<R>(walk: Walk, f: impl FnOnce() -> R) -> R {
    assert!((1..=MAX_GROUP).contains(&walk.group));
    let before = THIS_THREAD.replace(Some(walk));
    let out = f();
    THIS_THREAD.set(before);
    out
}
