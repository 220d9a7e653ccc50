//! Sampling: seeded runs are deterministic, top-k = 1 is greedy, top-p keeps the smallest set
//! whose mass reaches p, and the empirical next-token distribution of a tiny model matches its
//! tempered softmax (chi-square test).

use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_model::generate::sample_next;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM, SamplingConfig, generate};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

const VOCAB: usize = 24;

/// A tiny model with a wide init, so its next-token distribution is far from uniform.
fn tiny_model(device: &Device) -> Qwen3ForCausalLM {
    let config = Qwen3Config::from_json(
        &json!({
            "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 8, "initializer_range": 0.5,
        }),
        true,
    )
    .unwrap();
    init_weights(Qwen3ForCausalLM::new(&config, device), 11)
}

fn sampling(
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
    seed: u64,
) -> SamplingConfig {
    SamplingConfig {
        max_new_tokens: 16,
        temperature,
        top_k,
        top_p,
        seed,
        ..SamplingConfig::default()
    }
}

/// Next-token logits of the model after `prompt`.
fn next_logits(model: &Qwen3ForCausalLM, prompt: &[i64], device: &Device) -> Vec<f32> {
    let ids =
        Tensor::<2, Int>::from_data(TensorData::new(prompt.to_vec(), [1, prompt.len()]), device);
    let all = model
        .forward(ids, None, None)
        .logits
        .try_into_vec_as::<f32>()
        .unwrap();
    all[(prompt.len() - 1) * VOCAB..].to_vec()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// `n` pseudo-random logit rows (fixed LCG, values in [-4, 4)).
fn random_rows(n: usize, width: usize) -> Vec<Vec<f32>> {
    let mut s = 0x9e3779b97f4a7c15u64;
    (0..n)
        .map(|_| {
            (0..width)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
                })
                .collect()
        })
        .collect()
}

#[test]
fn seeded_generation_is_deterministic_and_the_seed_matters() {
    let device = Device::flex();
    let model = tiny_model(&device);
    let run = |seed| {
        generate(
            &model,
            &[1, 2, 3],
            &sampling(1.0, None, None, seed),
            &device,
            |_| {},
        )
        .unwrap()
        .new_token_ids
    };
    let (a, b, c) = (run(5), run(5), run(6));
    assert_eq!(a.len(), 16);
    assert_eq!(a, b, "same seed, same tokens");
    assert_ne!(a, c, "another seed, other tokens");
}

#[test]
fn top_k_one_is_greedy() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for row in random_rows(300, 40) {
        let cfg = sampling(1.3, Some(1), None, 0);
        assert_eq!(sample_next(&row, &cfg, &mut rng), argmax(&row));
    }
    let device = Device::flex();
    let model = tiny_model(&device);
    let greedy = generate(
        &model,
        &[4, 5],
        &sampling(0.0, None, None, 0),
        &device,
        |_| {},
    )
    .unwrap();
    for seed in 0..4 {
        let top1 = generate(
            &model,
            &[4, 5],
            &sampling(1.0, Some(1), None, seed),
            &device,
            |_| {},
        )
        .unwrap();
        assert_eq!(top1.new_token_ids, greedy.new_token_ids, "seed {seed}");
    }
}

/// Counts of `n` draws from `logits` under `cfg`.
fn draw_counts(logits: &[f32], cfg: &SamplingConfig, n: usize, seed: u64) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counts = vec![0; logits.len()];
    for _ in 0..n {
        counts[sample_next(logits, cfg, &mut rng) as usize] += 1;
    }
    counts
}

/// Pearson's chi-square statistic of `counts` against probabilities `p` (bins with p > 0),
/// and the 99.9% quantile of the chi-square distribution with bins - 1 degrees of freedom
/// (Wilson-Hilferty approximation, z = 3.09).
fn chi_square(counts: &[usize], p: &[f64]) -> (f64, f64) {
    let n: usize = counts.iter().sum();
    let mut stat = 0.0;
    let mut bins = 0;
    for (&c, &q) in counts.iter().zip(p) {
        if q > 0.0 {
            let expected = q * n as f64;
            assert!(expected >= 5.0, "bin with expected count {expected} < 5");
            stat += (c as f64 - expected).powi(2) / expected;
            bins += 1;
        } else {
            assert_eq!(c, 0, "a token of probability 0 was drawn");
        }
    }
    let df = (bins - 1) as f64;
    let a = 2.0 / (9.0 * df);
    (stat, df * (1.0 - a + 3.09 * a.sqrt()).powi(3))
}

#[test]
fn top_p_keeps_the_smallest_set_whose_mass_reaches_p() {
    // Probabilities 0.05, 0.5, 0.15, 0.3 (token 1 most likely, then 3, 2, 0).
    let probs = [0.05f64, 0.5, 0.15, 0.3];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    for (p, kept) in [
        (0.45f32, vec![1]),
        (0.7, vec![1, 3]),
        (0.9, vec![1, 3, 2]),
        (0.99, vec![1, 3, 2, 0]),
    ] {
        let counts = draw_counts(&logits, &sampling(1.0, None, Some(p), 0), 20_000, 1);
        let drawn: Vec<usize> = (0..4).filter(|&i| counts[i] > 0).collect();
        let mut want = kept.clone();
        want.sort();
        assert_eq!(drawn, want, "top_p {p}: counts {counts:?}");
        // Within the kept set, the probabilities are renormalised.
        let mass: f64 = kept.iter().map(|&i| probs[i]).sum();
        let expected: Vec<f64> = (0..4)
            .map(|i| {
                if kept.contains(&i) {
                    probs[i] / mass
                } else {
                    0.0
                }
            })
            .collect();
        if kept.len() > 1 {
            let (stat, bound) = chi_square(&counts, &expected);
            assert!(stat < bound, "top_p {p}: chi2 {stat:.2} >= {bound:.2}");
        }
    }
}

#[test]
fn empirical_next_token_distribution_matches_the_tempered_softmax() {
    let device = Device::flex();
    let model = tiny_model(&device);
    let logits = next_logits(&model, &[3, 1, 4, 1, 5], &device);
    for temperature in [0.7f32, 1.0, 1.5] {
        let max = logits.iter().fold(f32::MIN, |a, &b| a.max(b));
        let weights: Vec<f64> = logits
            .iter()
            .map(|&z| f64::from((z - max) / temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let p: Vec<f64> = weights.iter().map(|w| w / total).collect();
        // Merge the rare tokens into one bin so every bin expects >= 5 draws.
        let n = 40_000;
        let counts = draw_counts(&logits, &sampling(temperature, None, None, 0), n, 7);
        let (mut c_bins, mut p_bins, mut rare_c, mut rare_p) = (vec![], vec![], 0, 0.0);
        for (&c, &q) in counts.iter().zip(&p) {
            if q * n as f64 >= 5.0 {
                c_bins.push(c);
                p_bins.push(q);
            } else {
                rare_c += c;
                rare_p += q;
            }
        }
        if rare_p * n as f64 >= 5.0 {
            c_bins.push(rare_c);
            p_bins.push(rare_p);
        } else if let (Some(c), Some(q)) = (c_bins.last_mut(), p_bins.last_mut()) {
            *c += rare_c;
            *q += rare_p;
        }
        assert!(
            c_bins.len() >= 8,
            "the distribution should spread over many tokens"
        );
        let (stat, bound) = chi_square(&c_bins, &p_bins);
        println!(
            "T = {temperature}: chi2 {stat:.2} over {} bins (99.9% bound {bound:.2})",
            c_bins.len()
        );
        assert!(
            stat < bound,
            "T = {temperature}: chi2 {stat:.2} >= {bound:.2}"
        );
    }
}

/// The sampler as HF's warpers describe it, written plainly: the whole vocabulary sorted
/// (largest logit first, ties by id), temperature, top-k, top-p, then the draw walks that order.
fn sample_by_full_sort(logits: &[f32], cfg: &SamplingConfig, rng: &mut ChaCha8Rng) -> u32 {
    use rand::Rng;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let keep = cfg
        .top_k
        .filter(|&k| k > 0)
        .map_or(order.len(), |k| k.min(order.len()));
    let max = logits[order[0]] / cfg.temperature;
    let mut probs: Vec<f64> = order[..keep]
        .iter()
        .map(|&i| f64::from(logits[i] / cfg.temperature - max).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = cfg.top_p {
        let mut cumulative = 0.0;
        let cut = probs
            .iter()
            .position(|q| {
                cumulative += q;
                cumulative >= f64::from(p)
            })
            .map_or(probs.len(), |i| i + 1);
        probs.truncate(cut);
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
    }
    let draw: f64 = rng.random();
    let mut cumulative = 0.0;
    for (i, p) in probs.iter().enumerate() {
        cumulative += p;
        if draw < cumulative {
            return order[i] as u32;
        }
    }
    order[probs.len() - 1] as u32
}

#[test]
fn the_sampler_draws_what_a_full_sort_of_the_vocabulary_draws() {
    // Wide rows (a real vocabulary), peaked and flat ones (a flat row walks far past the
    // sorted head), and rows with tied logits.
    let mut rows = random_rows(6, 8192);
    for row in rows.iter_mut().take(2) {
        row.iter_mut().for_each(|x| *x *= 4.0);
    }
    rows.push(vec![0.5; 8192]);
    rows.push((0..8192).map(|i| (i % 7) as f32).collect());
    let mut walked_far = false;
    for (temperature, top_k, top_p) in [
        (1.0f32, None, None),
        (0.7, Some(50), None),
        (1.0, None, Some(0.9)),
        (1.3, Some(300), Some(0.95)),
        (1.0, Some(0), Some(0.5)),
    ] {
        let cfg = sampling(temperature, top_k, top_p, 0);
        for (r, row) in rows.iter().enumerate() {
            let mut a = ChaCha8Rng::seed_from_u64(r as u64);
            let mut b = ChaCha8Rng::seed_from_u64(r as u64);
            for draw in 0..300 {
                let fast = sample_next(row, &cfg, &mut a);
                let plain = sample_by_full_sort(row, &cfg, &mut b);
                assert_eq!(
                    fast, plain,
                    "row {r}, draw {draw}, temperature {temperature}, top_k {top_k:?}, top_p {top_p:?}"
                );
                let rank = {
                    let mut order: Vec<usize> = (0..row.len()).collect();
                    order.sort_by(|&x, &y| row[y].total_cmp(&row[x]));
                    order.iter().position(|&i| i == fast as usize).unwrap()
                };
                walked_far |= rank >= 64;
            }
        }
    }
    assert!(
        walked_far,
        "no draw reached past the sorted head: the test checks none"
    );
}
