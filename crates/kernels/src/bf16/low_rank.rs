//! A bf16 product with a rank-`r` f32 product added as its tiles are stored: the LoRA
//! projection's `x @ w + (s x @ a) @ b` and its input gradient `dy @ w^T + (s dlow) @ a^T`
//! (`crate::lora`). Added after the product by `gemm`, the rank-`r` share reads and writes the
//! whole `[m, n]` destination once more: on the Qwen3-1.7B shapes that pass cost more than the
//! share's arithmetic (`benches/README.md`, twenty-first session). Also the kernel's products
//! into a new buffer, with or without the share ([`kernel_new`]).

#[cfg(target_arch = "x86_64")]
use super::{Dst, blocked, has_bf16_path};
use super::{Operand, Path, Rhs, bf16_path, check};
use crate::mm::Threads;

/// A rank-`rank` product `l @ r` for an `[m, n]` destination: `l: [m, rank]` and
/// `r: [rank, n]`, both row-major.
#[derive(Clone, Copy)]
pub(crate) struct LowRank<'a> {
    pub(crate) l: &'a [f32],
    pub(crate) r: &'a [f32],
    pub(crate) rank: usize,
}

/// `a @ b + l @ r` into a new row-major `[m, n]` buffer on the AVX512-BF16 kernel: each tile's
/// `l @ r`, a chain of f32 multiply-adds over the rank from zero, added to the tile's sum as it
/// is stored (the numbers of `gemm` accumulating `l @ r` onto `a @ b`). `None` (nothing
/// computed) on the other paths (AMX, no kernel) and for an empty reduction.
pub(crate) fn mm_bf16_kernel_new_low(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Rhs<'_>,
    low: LowRank<'_>,
    threads: Threads,
) -> Option<Vec<f32>> {
    let path = bf16_path();
    if path != Path::Avx512Bf16 || k == 0 || cfg!(not(target_arch = "x86_64")) {
        return None;
    }
    check(m, n, k, a, b);
    assert!(
        low.l.len() >= m * low.rank && low.r.len() >= low.rank * n,
        "low-rank operands out of bounds"
    );
    #[cfg(target_arch = "x86_64")]
    return Some(kernel_new(path, m, n, k, a, b, Some(low), threads));
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `a @ b` (plus `low`'s `l @ r`) into a new row-major `[m, n]` buffer on `path`'s kernel, written
/// without zeroing it first (operands checked by the caller).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) fn kernel_new(
    path: Path,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Rhs<'_>,
    low: Option<LowRank<'_>>,
    threads: Threads,
) -> Vec<f32> {
    assert!(
        path.has_kernel() && has_bf16_path(path),
        "{path:?} is not a kernel on this CPU"
    );
    let mut c: Vec<f32> = Vec::with_capacity(m * n);
    if m > 0 && n > 0 {
        let dst = (Dst(c.spare_capacity_mut().as_mut_ptr().cast::<f32>()), n);
        // SAFETY: the kernel's instructions are present (asserted); the spare capacity holds the
        // `m x n` destination; without `accumulate` the kernel only writes it, every element of
        // it (its tiles cover the destination; `k = 0` writes zeros), so that all `m * n` are
        // initialised afterwards; `low`'s bounds are its caller's to check.
        unsafe {
            blocked(path, m, n, k, a, b, dst, false, low, threads);
            c.set_len(m * n);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16::{mm_bf16_new, tests::values};
    use crate::mm::mm;

    /// The share added as the tiles are stored gives the bits of `gemm` accumulating it onto
    /// the product afterwards: ranks 1, 5, 8 and 16, shapes with partial tiles (rows not a
    /// multiple of 12, columns not of 16), reductions of one block and of several.
    #[test]
    fn the_share_in_the_tiles_equals_gemm_after_the_product() {
        for (m, n, k, rank) in [
            (37, 70, 300, 8),
            (12, 32, 256, 5),
            (200, 1000, 600, 16),
            (5, 3, 9, 1),
        ] {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let (l, r) = (values(m * rank, 3), values(rank * n, 4));
            let (a16, b16) = (Operand::F32(&a, k, 1), Operand::F32(&b, n, 1));
            let share = LowRank { l: &l, r: &r, rank };
            let Some(fused) =
                mm_bf16_kernel_new_low(m, n, k, a16, Rhs::Pack(b16), share, Threads::All)
            else {
                assert_ne!(
                    bf16_path(),
                    Path::Avx512Bf16,
                    "the AVX512-BF16 path computes it"
                );
                println!(
                    "no AVX512-BF16 path on this CPU ({:?}): nothing to compare",
                    bf16_path()
                );
                return;
            };
            let mut after = mm_bf16_new(m, n, k, a16, b16, Threads::All);
            mm(
                m,
                n,
                rank,
                (&l, rank, 1),
                (&r, n, 1),
                (&mut after, n),
                true,
                Threads::All,
            );
            for (i, (f, g)) in fused.iter().zip(&after).enumerate() {
                assert_eq!(
                    f.to_bits(),
                    g.to_bits(),
                    "{m}x{n}x{k} rank {rank}: element {i}: {f} vs {g}"
                );
            }
        }
    }
}
