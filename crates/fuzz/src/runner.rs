//! The proptest runner of a fuzz test and its tally.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
/// Input bytes whose `Debug` is readable (escaped text), for proptest's failure messages.
#[derive(Clone)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes: b\"{}\"", self.0.len(), self.0.escape_ascii())
    }
}

/// What a fuzz test saw, printed at its end (`cargo test -- --nocapture` shows it).
#[derive(Default)]
pub struct Tally {
    ok: AtomicUsize,
    err: AtomicUsize,
    max_peak: AtomicUsize,
    max_len: AtomicUsize,
}

impl Tally {
    /// Counts one case.
    pub fn add(&self, ok: bool, input_len: usize, peak: usize) {
        if ok { &self.ok } else { &self.err }.fetch_add(1, Ordering::Relaxed);
        self.max_peak.fetch_max(peak, Ordering::Relaxed);
        self.max_len.fetch_max(input_len, Ordering::Relaxed);
    }
}

/// Cases per parser: 10,000 unless `QWEN_BURN_FUZZ_CASES` is set.
pub fn cases() -> u32 {
    std::env::var("QWEN_BURN_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

/// Replaces the panic hook with one that prints the message and location only. The default
/// hook captures a backtrace when `RUST_BACKTRACE` is set, which loads debug info (tens of MiB)
/// inside the measured call whenever a library catches a panic of a dependency, and would be
/// counted against the parser. A failing case still reports its panic message through
/// proptest.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "panic (caught or reported by the fuzz runner): {info}");
        }));
    });
}

/// Runs `test` on `cases()` inputs from `strategy` with a fixed seed (so CI replays the same
/// inputs; `QWEN_BURN_FUZZ_SEED` explores others), panicking with the shrunk input on failure.
pub fn run<S: Strategy>(
    name: &str,
    strategy: S,
    tally: &Tally,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let seed = std::env::var("QWEN_BURN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x51_7e_23);
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_iters: 2048,
        ..Config::default()
    };
    quiet_panics();
    let start = Instant::now();
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(&strategy, test) {
        panic!("fuzz {name} (seed {seed}): {e}");
    }
    println!(
        "fuzz {name}: {} cases ({} Ok, {} Err) in {:.1} s; largest input {} bytes, peak \
         allocation {} bytes",
        cases(),
        tally.ok.load(Ordering::Relaxed),
        tally.err.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64(),
        tally.max_len.load(Ordering::Relaxed),
        tally.max_peak.load(Ordering::Relaxed),
    );
}
