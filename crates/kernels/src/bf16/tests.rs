//! The bf16 products against the f64 product of the bf16-rounded operands.
use super::*;
use crate::mm::Threads;

/// Deterministic values in [-1, 1).
pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + seed * 40_503) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

pub(super) fn widen(bits: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(bits) << 16))
}

/// Rounding agrees with `half`'s (round to nearest even) on ties, subnormals, infinities, the
/// largest finite values and NaNs.
#[test]
fn rounding_is_round_to_nearest_even() {
    let mut cases = vec![
        0.0f32,
        -0.0,
        1.0,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-40,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0x3f80_8000), // a tie rounding down to even
        f32::from_bits(0x3f81_8000), // a tie rounding up to even
        f32::from_bits(0x3f80_8001),
    ];
    cases.extend(values(10_000, 7).iter().map(|v| v * 1e3));
    for x in cases {
        let expected = half::bf16::from_f32(x).to_bits();
        let found = round_bits(x);
        if x.is_nan() {
            assert!(f32::from_bits(u32::from(found) << 16).is_nan(), "{x:e}");
        } else {
            assert_eq!(found, expected, "{x:e} ({:#x})", x.to_bits());
        }
    }
}

/// Which path this machine runs, printed, and consistent with the CPU's features.
#[test]
fn the_path_follows_the_cpu() {
    let path = detected_bf16_path();
    println!(
        "bf16 products on this CPU: {path:?} (running {:?})",
        bf16_path()
    );
    #[cfg(target_arch = "x86_64")]
    {
        let avx512bf16 = std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512f");
        assert_eq!(has_bf16_path(Path::Avx512Bf16), avx512bf16);
        assert_eq!(
            path == Path::Avx512Bf16,
            avx512bf16 && !has_bf16_path(Path::Amx)
        );
        // AMX-BF16 and AMX-TILE from `cpuid` leaf 7 (EDX bits 22 and 24); the path needs Linux's
        // permission too, which a CPU with them may withhold.
        // SAFETY: `cpuid` exists on every x86-64 CPU.
        #[allow(unused_unsafe)]
        let edx = unsafe { std::arch::x86_64::__cpuid_count(7, 0).edx };
        let amx = (edx >> 22) & 1 == 1 && (edx >> 24) & 1 == 1;
        if path == Path::Amx {
            assert!(amx, "AMX path without the CPU's AMX");
        }
        println!("cpuid: AMX-BF16 and AMX-TILE {amx}, AVX512-BF16 {avx512bf16}");
    }
    assert!(bf16_path() <= path);
}

/// `QWEN_BURN_BF16_KERNEL` takes the paths this CPU has and refuses the others by name.
#[test]
fn the_kernel_variable_names_the_paths_this_cpu_has() {
    let with = super::path::path_named;
    assert_eq!(with("").unwrap(), detected_bf16_path());
    assert_eq!(with("emulated").unwrap(), Path::Emulated);
    for p in [Path::Avx512Bf16, Path::Amx] {
        let r = with(p.name());
        if has_bf16_path(p) {
            assert_eq!(r.unwrap(), p);
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(BF16_KERNEL_VAR) && e.contains(p.name()), "{e}");
        }
    }
    let e = with("avx512").unwrap_err().to_string();
    assert!(e.contains("\"avx512\"") && e.contains("emulated"), "{e}");
}

/// Every path, layout, dtype, edge and accumulation equals the exact product of the rounded
/// operands to within f32 accumulation error.
#[test]
fn bf16_products_equal_the_product_of_the_rounded_operands() {
    let paths: Vec<Path> = [Path::Emulated, Path::Avx512Bf16, Path::Amx]
        .into_iter()
        .filter(|p| has_bf16_path(*p))
        .collect();
    println!("paths: {paths:?}");
    let shapes = [
        (1, 1, 1),
        (3, 5, 2),
        (13, 33, 7),
        (12, 32, 384),
        (97, 70, 385),
        (200, 520, 400),
        (5, 1100, 900),
        (64, 64, 512),
        (33, 65, 33),
        (130, 96, 290),
    ];
    for (m, n, k) in shapes {
        for a_t in [false, true] {
            for b_t in [false, true] {
                for b_bf16 in [false, true] {
                    for accumulate in [false, true] {
                        for threads in [Threads::All, Threads::One] {
                            for &path in &paths {
                                check(path, (m, n, k), (a_t, b_t, b_bf16), accumulate, threads);
                            }
                            if paths.contains(&Path::Amx) {
                                // Other walks of the tiles: with the default (3 blocks,
                                // prefetching), every group size and both prefetch choices.
                                for (group, prefetch) in [(1, true), (2, false), (4, true)] {
                                    let walk = super::walk::Walk { group, prefetch };
                                    assert_ne!(walk, super::walk::Walk::DEFAULT);
                                    super::walk::with_walk(walk, || {
                                        let shape = (m, n, k);
                                        let layout = (a_t, b_t, b_bf16);
                                        check(Path::Amx, shape, layout, accumulate, threads)
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn check(
    path: Path,
    (m, n, k): (usize, usize, usize),
    (a_t, b_t, b_bf16): (bool, bool, bool),
    accumulate: bool,
    threads: Threads,
) {
    let a = values(m * k, 1);
    let b32 = values(k * n, 2);
    let b16: Vec<half::bf16> = b32.iter().map(|&v| half::bf16::from_f32(v * 3.0)).collect();
    let (a_rs, a_cs) = if a_t { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if b_t { (1, k) } else { (n, 1) };
    let b = if b_bf16 {
        Operand::Bf16(&b16, b_rs, b_cs)
    } else {
        Operand::F32(&b32, b_rs, b_cs)
    };
    let b_at = |p: usize, j: usize| -> f64 {
        let at = p * b_rs + j * b_cs;
        if b_bf16 {
            widen(b16[at].to_bits())
        } else {
            widen(round_bits(b32[at]))
        }
    };
    // A destination wider than the product: the columns past `n` must stay untouched.
    let c_rs = n + 3;
    let start = values(m * c_rs, 3);
    let mut c = start.clone();
    mm_bf16_on(
        path,
        m,
        n,
        k,
        Operand::F32(&a, a_rs, a_cs),
        b,
        (&mut c, c_rs),
        accumulate,
        threads,
    );
    let a_at = |i: usize, p: usize| widen(round_bits(a[i * a_rs + p * a_cs]));
    let worst = worst_error((m, n, k), (&c, &start, c_rs), accumulate, a_at, b_at);
    let tolerance = 3e-7 * (k as f64 + 1.0) * 3.0;
    assert!(
        worst <= tolerance,
        "{path:?} {m}x{n}x{k} a_t={a_t} b_t={b_t} bf16={b_bf16} accumulate={accumulate} \
         {threads:?}: off by {worst:e} (tolerance {tolerance:e})"
    );
}

/// The largest distance of `c` (`m` rows at stride `c_rs`, written over `start`) from the
/// exact `[m, k] @ [k, n]` of `a_at(i, p)` and `b_at(p, j)` (plus `start` when `accumulate`),
/// a NaN counting as infinitely far; the columns past `n` must be `start`'s.
pub(super) fn worst_error(
    (m, n, k): (usize, usize, usize),
    (c, start, c_rs): (&[f32], &[f32], usize),
    accumulate: bool,
    a_at: impl Fn(usize, usize) -> f64,
    b_at: impl Fn(usize, usize) -> f64,
) -> f64 {
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..c_rs {
            let found = f64::from(c[i * c_rs + j]);
            if j >= n {
                assert_eq!(
                    found,
                    f64::from(start[i * c_rs + j]),
                    "column {j} past n written"
                );
                continue;
            }
            let mut exact = if accumulate {
                f64::from(start[i * c_rs + j])
            } else {
                0.0
            };
            for p in 0..k {
                exact += a_at(i, p) * b_at(p, j);
            }
            // A NaN counts as off by infinity (`max` would skip it).
            worst = worst.max(if found.is_nan() {
                f64::INFINITY
            } else {
                (found - exact).abs()
            });
        }
    }
    worst
}

/// The kernel's tasks: a short product (up to 192 rows) is one row block, a tall one is cut into
/// blocks of at most 192 rows; column blocks are 4 to 16 panels wide.
#[test]
fn blocking_cuts_products_into_tasks() {
    for (threads, mr) in [(Threads::All, MR), (Threads::One, MR), (Threads::All, 32)] {
        for (row_panels, col_panels) in [
            (1, 1),
            (11, 32),
            (11, 96),
            (16, 8),
            (17, 8),
            (171, 8),
            (43, 192),
        ] {
            let (row_blocks, nc) = blocking(row_panels, col_panels, mr, threads);
            let what = format!(
                "{row_panels} x {col_panels} panels, {threads:?}: {row_blocks} row blocks, {nc} columns"
            );
            assert!(nc % NR == 0 && (4 * NR..=NC).contains(&nc), "{what}");
            assert!((1..=row_panels).contains(&row_blocks), "{what}");
            let most = MAX_ROWS / mr;
            assert!(row_panels.div_ceil(row_blocks) <= most, "{what}");
            if row_panels <= most {
                assert_eq!(row_blocks, 1, "{what}");
            }
        }
    }
}

/// Packing equals its definition (panels of `width` lanes, `[pairs][width]` words, an even
/// reduction index in the low half, zeros past the lanes and the reduction) for both layouts
/// of the source, both element types, blocks of 8 or 4 lanes x 8 pairs and their remainders.
#[test]
fn packing_equals_its_definition() {
    use super::pack::pack_all;
    // A reduction of at most `2 * KC2` (one packed block).
    // Lanes past a staged run of words (480) where they are the columns.
    let (rows, cols) = (70, 520);
    let x32 = values(rows * cols, 5);
    let x16: Vec<half::bf16> = x32.iter().map(|&v| half::bf16::from_f32(v)).collect();
    for bf16_src in [false, true] {
        for lanes_contiguous in [false, true] {
            // Lanes are rows (reduction contiguous) or columns (lanes contiguous) of x.
            let (ls, ps) = if lanes_contiguous {
                (1, cols)
            } else {
                (cols, 1)
            };
            let x = if bf16_src {
                Operand::Bf16(&x16, 0, 0)
            } else {
                Operand::F32(&x32, 0, 0)
            };
            let bits = |l: usize, p: usize| -> u32 {
                let at = l * ls + p * ps;
                u32::from(if bf16_src {
                    x16[at].to_bits()
                } else {
                    round_bits(x32[at])
                })
            };
            let (all_lanes, all_len) = if lanes_contiguous {
                (cols, rows)
            } else {
                (rows, cols)
            };
            for (lane0, lanes, p0, len, width) in [
                (0, all_lanes, 0, all_len.min(2 * super::KC2), 32),
                (5, all_lanes - 5, 3, 41, 12),
                (1, all_lanes - 1, 0, 9, 8),
                (3, 29, 1, 37, 32),
                (8, 40, 16, 33, 12),
                (2, 50, 5, 60, 12),
                (0, 17, 0, 16, 32),
                (1, 5, 2, 1, 8),
            ] {
                let pairs = len.div_ceil(2);
                let panels = lanes.div_ceil(width);
                let mut out = vec![0xdead_beefu32; panels * pairs * width];
                for threads in [Threads::All, Threads::One] {
                    pack_all(
                        x,
                        (ls, ps),
                        (lane0, lanes),
                        p0,
                        len,
                        width,
                        &mut out,
                        threads,
                    );
                    for panel in 0..panels {
                        for q in 0..pairs {
                            for l in 0..width {
                                let lane = panel * width + l;
                                let word = |p: usize| {
                                    if lane < lanes && p < len {
                                        bits(lane0 + lane, p0 + p)
                                    } else {
                                        0
                                    }
                                };
                                let expected = word(2 * q) | (word(2 * q + 1) << 16);
                                let found = out[(panel * pairs + q) * width + l];
                                assert_eq!(
                                    found, expected,
                                    "bf16 {bf16_src}, lanes contiguous {lanes_contiguous}, \
                                     {lanes} lanes from {lane0}, {len} from {p0}, width {width}: \
                                     panel {panel} pair {q} lane {l}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The vector rounding of 16 f32 into 8 packed words equals [`round_bits`] pair by pair, on
/// special values (NaN with payloads, infinities, ties, the largest finite, subnormals, zeros)
/// and on random bit patterns.
#[cfg(target_arch = "x86_64")]
#[test]
fn f32_words_on_vectors_equal_the_rounding() {
    let special = [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc1_2345),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        f32::from_bits(0x0000_0001),
        f32::from_bits(0x8000_7fff),
        0.0,
        -0.0,
        1.0,
        f32::from_bits(0x7f7f_ffff),
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut runs = vec![special];
    for _ in 0..1000 {
        runs.push(std::array::from_fn(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f32::from_bits(state as u32)
        }));
    }
    if !std::arch::is_x86_feature_detected!("avx2") {
        println!("no AVX2 on this CPU: the scalar loop packs");
        return;
    }
    for run in runs {
        let mut words = [0u32; 8];
        // SAFETY: the CPU has AVX2 (above); `run` holds 16 f32 and `words` 8 u32.
        unsafe {
            let packed = super::pack_x86::rounded(run.as_ptr());
            std::arch::x86_64::_mm256_storeu_si256(words.as_mut_ptr().cast(), packed);
        }
        for (q, &w) in words.iter().enumerate() {
            let want =
                u32::from(round_bits(run[2 * q])) | (u32::from(round_bits(run[2 * q + 1])) << 16);
            assert_eq!(w, want, "pair {q} of {run:?}");
        }
    }
}
