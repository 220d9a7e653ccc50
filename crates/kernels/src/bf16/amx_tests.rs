//! The AMX path's packing and tile walk, with the tile modelled ([`super`]).
use super::super::NR;
use super::super::pack::{KC2, pack_all, round_bits};
use super::super::tests::{values, widen, worst_error};
use super::super::walk::MAX_GROUP;
use super::*;

thread_local! {
    /// The model's four accumulator tiles, 32 x 32.
    static MODEL_ACC: std::cell::RefCell<[[f32; NR]; MR]> =
        const { std::cell::RefCell::new([[0.0; NR]; MR]) };
}

/// [`TILE`] in scalar code, on any CPU: `tdpbf16ps`'s sums of pairs of bf16 products, the
/// accumulators in a thread's array.
const MODEL: TileOps = TileOps {
    start: model_start,
    steps: model_steps,
    finish: model_finish,
};

/// # Safety
/// As [`TILE`]'s, without the tiles.
unsafe fn model_start(c: *mut f32, c_rs: usize, zero: bool) {
    MODEL_ACC.with_borrow_mut(|acc| {
        for (i, row) in acc.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                // SAFETY: inside the accumulator (the caller's promise).
                *v = if zero {
                    0.0
                } else {
                    unsafe { *c.byte_add(i * c_rs).add(j) }
                };
            }
        }
    });
}

/// # Safety
/// As [`TILE`]'s, without the tiles.
unsafe fn model_steps(t: Steps) {
    let half = |w: u32, hi: bool| f32::from_bits(if hi { w & 0xffff_0000 } else { w << 16 });
    MODEL_ACC.with_borrow_mut(|acc| {
        for (i, row) in acc.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                for s in 0..t.steps {
                    let b = if s < t.whole {
                        t.b.wrapping_add(s * STEP * NR)
                    } else {
                        t.last
                    };
                    for q in 0..STEP {
                        // SAFETY: inside the step's tiles (the caller's promise).
                        let (x, y) =
                            unsafe { (*t.a.add(s * STEP * MR + i * STEP + q), *b.add(q * NR + j)) };
                        *v += half(x, false) * half(y, false) + half(x, true) * half(y, true);
                    }
                }
            }
        }
    });
}

/// # Safety
/// As [`TILE`]'s, without the tiles.
unsafe fn model_finish(c: *mut f32, c_rs: usize) {
    MODEL_ACC.with_borrow(|acc| {
        for (i, row) in acc.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                // SAFETY: inside the accumulator (the caller's promise).
                unsafe { *c.byte_add(i * c_rs).add(j) = *v };
            }
        }
    });
}

/// The AMX path's packing of `a` and its walk over tiles, edges and partial steps, in groups of
/// every length (with the tile modelled, so that it runs on any CPU), equal the exact product of
/// the rounded operands.
#[test]
fn amx_tiles_cover_the_product() {
    for (m, n, k) in [
        (1, 1, 1),
        (31, 33, 31),
        (32, 32, 32),
        (70, 100, 300),
        (64, 40, 513),
        (40, 64, 1100),
    ] {
        for a_t in [false, true] {
            let a = values(m * k, 1);
            let b = values(k * n, 2);
            let (a_rs, a_cs) = if a_t { (1, m) } else { (k, 1) };
            let c_rs = n + 3;
            let start = values(m * c_rs, 3);
            for (accumulate, group_len) in [false, true]
                .into_iter()
                .flat_map(|acc| (1..=MAX_GROUP).map(move |g| (acc, g)))
            {
                let mut c = start.clone();
                let kc = 2 * KC2;
                // Every reduction block packed, then the tiles over groups of blocks.
                let mut packed = Vec::new();
                for p0 in (0..k).step_by(kc) {
                    let len = kc.min(k - p0);
                    let pairs = len.div_ceil(2);
                    let mut pa = vec![7u32; m.div_ceil(MR) * MR * KC2];
                    let pp = pack_rows(
                        Operand::F32(&a, a_rs, a_cs),
                        (a_rs, a_cs),
                        m,
                        p0,
                        len,
                        &mut pa,
                        Threads::One,
                    );
                    assert_eq!(pp, pairs.div_ceil(STEP) * STEP);
                    // Past the packed panels: NaNs, which a step must not read.
                    let mut pb = vec![0xffc0_ffc0u32; n.div_ceil(NR) * NR * KC2];
                    pack_all(
                        Operand::F32(&b, n, 1),
                        (1, n),
                        (0, n),
                        p0,
                        len,
                        NR,
                        &mut pb,
                        Threads::One,
                    );
                    packed.push((pairs, pa, pb));
                }
                for (g, group) in packed.chunks(group_len).enumerate() {
                    let blocks: Vec<Block<'_>> = group
                        .iter()
                        .map(|(pairs, pa, pb)| Block {
                            pairs: *pairs,
                            pa,
                            pb,
                        })
                        .collect();
                    let first = g == 0 && !accumulate;
                    // SAFETY: the model needs no tiles; the destination holds `m` rows of
                    // `n` at stride `c_rs`.
                    unsafe {
                        block_tiles(
                            &blocks,
                            0..m,
                            0..n.div_ceil(NR),
                            n,
                            (c.as_mut_ptr(), c_rs),
                            first,
                            group_len % 2 == 0,
                            &MODEL,
                        )
                    };
                }
                let a_at = |i: usize, p: usize| widen(round_bits(a[i * a_rs + p * a_cs]));
                let b_at = |p: usize, j: usize| widen(round_bits(b[p * n + j]));
                let worst = worst_error((m, n, k), (&c, &start, c_rs), accumulate, a_at, b_at);
                let tolerance = 3e-7 * (k as f64 + 1.0) * 3.0;
                assert!(
                    worst <= tolerance,
                    "{m}x{n}x{k} a_t={a_t} accumulate={accumulate} group {group_len}: off by {worst:e}"
                );
            }
        }
    }
}

/// [`pack_rows`] equals its definition word by word, for rows contiguous in the reduction, for
/// rows contiguous across (a transposed `a`) and for neither, f32 and bf16, partial panels and
/// odd lengths, on one thread and on all.
#[test]
fn pack_rows_equals_its_definition() {
    for (m, k) in [(1, 1), (5, 7), (32, 64), (45, 301), (70, 256)] {
        // Row stride, column stride and the buffer's length of each layout.
        let layouts = [
            (k, 1, m * k),
            (1, m, m * k),
            (2 * k + 1, 2, m * (2 * k + 1)),
        ];
        for (rs, cs, size) in layouts {
            let x = values(size, 5);
            let x16: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
            for (p0, len) in [(0, k.min(256)), (k / 3, k - k / 3)] {
                for bf16_in in [false, true] {
                    for threads in [Threads::One, Threads::All] {
                        let operand = if bf16_in {
                            Operand::Bf16(&x16, rs, cs)
                        } else {
                            Operand::F32(&x, rs, cs)
                        };
                        let mut out =
                            vec![7u32; m.div_ceil(MR) * MR * len.div_ceil(2) + 2 * MR * STEP];
                        let pp = pack_rows(operand, (rs, cs), m, p0, len, &mut out, threads);
                        let bits = |i: usize, p: usize| -> u32 {
                            if i >= m || p >= len {
                                return 0;
                            }
                            let at = i * rs + (p0 + p) * cs;
                            if bf16_in {
                                u32::from(x16[at].to_bits())
                            } else {
                                u32::from(round_bits(x[at]))
                            }
                        };
                        for panel in 0..m.div_ceil(MR) {
                            for q in 0..pp {
                                for r in 0..MR {
                                    let got = out[panel * MR * pp
                                        + (q / STEP) * STEP * MR
                                        + r * STEP
                                        + q % STEP];
                                    let (i, p) = (panel * MR + r, 2 * q);
                                    let want = bits(i, p) | (bits(i, p + 1) << 16);
                                    assert_eq!(
                                        got, want,
                                        "{m}x{k} strides ({rs}, {cs}) from {p0} for {len} \
                                         bf16={bf16_in} {threads:?}: row {i}, pair {q}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
