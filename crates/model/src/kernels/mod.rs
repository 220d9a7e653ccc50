//! Custom fused operations through Burn's backend extensions (`#[backend_extension]`).
//!
//! Each operation has a default body composed of standard tensor ops (the reference, and what
//! every backend without a hand-written kernel runs) and a Flex kernel written in Rust.
//!
//! - [`row_matmul`]: `x @ w` for a single row `x`, the matrix-vector product of decoding.

mod matvec;

pub use matvec::row_matmul;
