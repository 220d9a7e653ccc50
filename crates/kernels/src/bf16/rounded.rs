//! Operands rounded to bf16 as f32 matrices: the products without a bf16 kernel (AVX2-only
//! CPUs) are f32 products of these copies, the same numbers as a bf16 kernel's up to the order
//! of the sums ([`super::Path::Emulated`]).

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::pack::{Bits, Operand};

/// Output rows per task.
const ROWS_PER_TASK: usize = 32;
/// The side of the tiles a transposed operand is copied in.
const TILE: usize = 16;

/// A `[rows, cols]` operand rounded to bf16, as a dense row-major f32 matrix. Tasks of 32 rows
/// on rayon's threads; each row read in order where the operand's rows are contiguous, else
/// (a transposed matrix, whose columns are) in tiles of 16 x 16. One element at a time down
/// each row took 17% of a mixed-precision `bench-dense` step on an AVX2 CPU, on one thread
/// (`benches/README.md`).
pub(crate) fn rounded(x: Operand<'_>, rows: usize, cols: usize) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::with_capacity(rows * cols);
    if rows == 0 || cols == 0 {
        return out;
    }
    // Written without zeroing it first: every element is written once.
    let spare = &mut out.spare_capacity_mut()[..rows * cols];
    let task =
        |(t, chunk): (usize, &mut [MaybeUninit<f32>])| rows_of(x, t * ROWS_PER_TASK, cols, chunk);
    if rows <= ROWS_PER_TASK {
        task((0, spare));
    } else {
        spare
            .par_chunks_mut(ROWS_PER_TASK * cols)
            .enumerate()
            .for_each(task);
    }
    // SAFETY: the tasks wrote all `rows * cols` elements (`rows_from` writes every element of
    // its rows).
    unsafe { out.set_len(rows * cols) };
    out
}

simd_dispatch! {
    /// The rows of `out` (`cols` each) from row `i0` of `x`, compiled for the CPU's vectors.
    fn rows_of(x: Operand<'_>, i0: usize, cols: usize, out: &mut [MaybeUninit<f32>]) = rows_of_generic
}

#[inline(always)]
fn rows_of_generic(x: Operand<'_>, i0: usize, cols: usize, out: &mut [MaybeUninit<f32>]) {
    match x {
        Operand::F32(s, rs, cs) => rows_from(s, (rs, cs), i0, cols, out),
        Operand::Bf16(s, rs, cs) => rows_from(s, (rs, cs), i0, cols, out),
    }
}

#[inline(always)]
fn rows_from<T: Bits>(
    s: &[T],
    (rs, cs): (usize, usize),
    i0: usize,
    cols: usize,
    out: &mut [MaybeUninit<f32>],
) {
    let widen = |v: T| f32::from_bits(v.bits() << 16);
    let rows = out.len() / cols;
    if cs == 1 || rs != 1 {
        for (i, row) in out.chunks_exact_mut(cols).enumerate() {
            let at = (i0 + i) * rs;
            if cs == 1 {
                for (o, &v) in row.iter_mut().zip(&s[at..at + cols]) {
                    o.write(widen(v));
                }
            } else {
                for (j, o) in row.iter_mut().enumerate() {
                    o.write(widen(s[at + j * cs]));
                }
            }
        }
        return;
    }
    // Rows contiguous across (`rs == 1`): a tile's 16 source runs read in order, its 16 rows
    // written in order.
    for r0 in (0..rows).step_by(TILE) {
        let height = TILE.min(rows - r0);
        for c0 in (0..cols).step_by(TILE) {
            let width = TILE.min(cols - c0);
            let mut tile = [[0.0f32; TILE]; TILE];
            for (j, column) in tile.iter_mut().enumerate().take(width) {
                let run = &s[i0 + r0 + (c0 + j) * cs..][..height];
                for (t, &v) in column.iter_mut().zip(run) {
                    *t = widen(v);
                }
            }
            for i in 0..height {
                let row = &mut out[(r0 + i) * cols + c0..][..width];
                for (j, o) in row.iter_mut().enumerate() {
                    o.write(tile[j][i]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16::round_bits;

    /// [`rounded`] equals its definition element by element: rows contiguous, columns
    /// contiguous (tiles, with partial tiles and several tasks), neither, f32 and bf16.
    #[test]
    fn rounded_equals_its_definition() {
        let (rows, cols) = (70, 37);
        let values: Vec<f32> = (0..3 * rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 77.0)
            .collect();
        let halves: Vec<half::bf16> = values.iter().map(|&v| half::bf16::from_f32(v)).collect();
        for (rs, cs) in [(cols, 1), (1, rows), (2 * cols + 1, 2)] {
            for bf16_in in [false, true] {
                let x = if bf16_in {
                    Operand::Bf16(&halves, rs, cs)
                } else {
                    Operand::F32(&values, rs, cs)
                };
                for (r, c) in [(rows, cols), (1, 1), (33, 16), (5, 40)] {
                    let got = rounded(x, r, c);
                    for i in 0..r {
                        for j in 0..c {
                            let at = i * rs + j * cs;
                            let bits = if bf16_in {
                                halves[at].to_bits()
                            } else {
                                round_bits(values[at])
                            };
                            let want = f32::from_bits(u32::from(bits) << 16);
                            assert_eq!(
                                got[i * c + j].to_bits(),
                                want.to_bits(),
                                "{r}x{c} strides ({rs}, {cs}) bf16={bf16_in}: ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }
}
