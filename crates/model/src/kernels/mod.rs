//! Custom fused operations through Burn's backend extensions (`#[backend_extension]`).
//!
//! Each operation has a default body composed of standard tensor ops (the reference, and what
//! every backend without a hand-written kernel runs) and a Flex kernel written in Rust.
//!
//! - [`row_matmul`]: `x @ w` for a single row `x`, the matrix-vector product of decoding.
//! - [`decode_attention`]: one query position over the KV cache buffers, in place.
//! - [`cross_entropy_rows`]: softmax cross-entropy and its gradient coefficient, one pass per row.
//! - [`exp::exp_f32`]: the vectorisable `exp` these kernels use.

mod cross_entropy;
mod decode_attention;
pub mod exp;
mod matvec;

pub use cross_entropy::cross_entropy_rows;
pub use decode_attention::decode_attention;
pub use matvec::row_matmul;

/// Run `f` on a thread of rayon's pool (at once if this already is one).
///
/// Flex's matmuls and the kernels here split their work with rayon. Called from a thread outside
/// the pool, each parallel call queues its work, wakes the workers and puts the caller to sleep
/// until they finish; from inside the pool the calling thread does its share and only the other
/// workers are woken. A decoding step makes about 200 such calls per token (Qwen3-0.6B), a
/// training step thousands, so the hand-offs add up (`benches/README.md`).
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::join(f, || ()).0
}
