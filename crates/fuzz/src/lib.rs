//! Shared harness of the fuzz tests (`crates/*/tests/fuzz.rs`): a dev-only crate, never part of
//! the product.
//!
//! - [`Counting`]: a global allocator that counts, per thread, the bytes currently allocated and
//!   the peak since [`measure`] started, so a case can assert that parsing an input of `n` bytes
//!   never held more than `A * n + B` bytes. Requests over [`HARD_LIMIT`] are refused (the
//!   process then aborts with "memory allocation of N bytes failed") after the input that caused
//!   them is written to stderr, so an unbounded allocation is reported even though it cannot be
//!   shrunk.
//! - [`Edit`] and [`mutated`]: structure-aware mutations of valid seeds (value and key
//!   replacement with extreme values, line deletion and duplication, deep nesting, byte flips,
//!   inserted integers, truncation, splices of another seed), mixed with fully random bytes.
//! - [`run`]: a proptest runner with a fixed seed, no failure files, and 10,000 cases unless
//!   `QWEN_BURN_FUZZ_CASES` says otherwise (`QWEN_BURN_FUZZ_SEED` picks another seed).

mod alloc;
mod mutate;
mod runner;

pub use alloc::{Bound, Counting, HARD_LIMIT, MIB, measure};
pub use mutate::*;
pub use runner::{Bytes, Tally, cases, run};
