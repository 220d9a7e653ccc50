//! A group decoded as one batch (`generate_group`, what RL rollouts use) gives each row the
//! completion `generate` gives alone with that row's seed: the shared prefill and the batched
//! decoding change nothing, stop tokens and stop predicates end rows on their own.

use burn::tensor::Device;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{
    Qwen3Config, Qwen3ForCausalLM, SamplingConfig, generate, generate_group, generate_groups,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

fn tiny_model(device: &Device) -> Qwen3ForCausalLM {
    let config = Qwen3Config::from_json(
        &json!({
            "model_type": "qwen3", "vocab_size": 24, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 8, "initializer_range": 0.5,
        }),
        true,
    )
    .unwrap();
    init_weights(Qwen3ForCausalLM::new(&config, device), 11)
}

#[test]
fn each_row_of_a_group_equals_generate_with_its_seed() {
    let device = Device::flex();
    let model = tiny_model(&device);
    let prompt = [1u32, 5, 9, 2, 7];
    for (temperature, top_k, stop_tokens) in [
        (1.0f32, None, vec![3u32]),
        (0.7, Some(5), vec![3, 4]),
        (0.0, None, vec![]),
    ] {
        let cfg = SamplingConfig {
            max_new_tokens: 12,
            temperature,
            top_k,
            stop_tokens,
            ..SamplingConfig::default()
        };
        let seeds = [3u64, 4, 5, 6, 7, 8];
        let mut rngs: Vec<ChaCha8Rng> = seeds
            .iter()
            .map(|&s| ChaCha8Rng::seed_from_u64(s))
            .collect();
        let group = generate_group(&model, &prompt, &cfg, &mut rngs, &device, &|_| false).unwrap();
        let mut stopped_early = 0;
        for (row, &seed) in group.iter().zip(&seeds) {
            let alone = generate(
                &model,
                &prompt,
                &SamplingConfig {
                    seed,
                    ..cfg.clone()
                },
                &device,
                |_| {},
            )
            .unwrap();
            assert_eq!(
                row.ids, alone.new_token_ids,
                "seed {seed}, temperature {temperature}"
            );
            assert_eq!(row.stopped, alone.stopped);
            stopped_early += usize::from(row.ids.len() < 12);
        }
        if temperature > 0.0 {
            assert!(
                stopped_early > 0,
                "no row met a stop token: the test checks nothing of them"
            );
        }
    }
}

#[test]
fn a_stop_predicate_ends_its_row_only() {
    let device = Device::flex();
    let model = tiny_model(&device);
    let cfg = SamplingConfig {
        max_new_tokens: 10,
        temperature: 1.0,
        ..SamplingConfig::default()
    };
    let mut rngs: Vec<ChaCha8Rng> = (0..4).map(ChaCha8Rng::seed_from_u64).collect();
    // Rows end once they hold 3 tokens whose sum is even... row-dependent by content.
    let stop = |ids: &[u32]| ids.len() >= 3 && ids.iter().sum::<u32>() % 2 == 0;
    let group = generate_group(&model, &[1, 2, 3], &cfg, &mut rngs, &device, &stop).unwrap();
    for row in &group {
        let ended = (3..=row.ids.len()).find(|&k| stop(&row.ids[..k]));
        match ended {
            Some(k) => assert!(row.stopped && k == row.ids.len(), "{row:?}"),
            None => assert!(!row.stopped && row.ids.len() == 10, "{row:?}"),
        }
    }
    let err = generate_group(&model, &[], &cfg, &mut rngs, &device, &stop).unwrap_err();
    assert!(err.to_string().contains("prompt"), "{err}");
}

#[test]
fn groups_of_several_prompts_decoded_together_equal_each_group_alone() {
    let device = Device::flex();
    let model = tiny_model(&device);
    let prompts: [&[u32]; 3] = [&[1, 5, 9, 2], &[4, 4, 7, 1], &[2, 8, 3, 6]];
    let cfg = SamplingConfig {
        max_new_tokens: 12,
        temperature: 1.0,
        stop_tokens: vec![3],
        ..SamplingConfig::default()
    };
    let n = 4;
    let seed = |p: usize, r: usize| (10 * p + r) as u64;
    let mut rngs: Vec<ChaCha8Rng> = (0..prompts.len())
        .flat_map(|p| (0..n).map(move |r| ChaCha8Rng::seed_from_u64(seed(p, r))))
        .collect();
    let together = generate_groups(&model, &prompts, &cfg, &mut rngs, &device, &|_| false).unwrap();
    assert_eq!(together.len(), prompts.len());
    let mut lengths = std::collections::BTreeSet::new();
    for (p, (prompt, group)) in prompts.iter().zip(&together).enumerate() {
        let mut rngs: Vec<ChaCha8Rng> = (0..n)
            .map(|r| ChaCha8Rng::seed_from_u64(seed(p, r)))
            .collect();
        let alone = generate_group(&model, prompt, &cfg, &mut rngs, &device, &|_| false).unwrap();
        assert_eq!(group, &alone, "prompt {p}");
        lengths.extend(group.iter().map(|c| c.ids.len()));
    }
    assert!(
        lengths.len() > 1,
        "every row has one length: the test checks no row ending before the others"
    );
    // Prompts of different lengths are refused, named by their lengths.
    let mut rngs: Vec<ChaCha8Rng> = (0..2).map(ChaCha8Rng::seed_from_u64).collect();
    let err = generate_groups(
        &model,
        &[&[1, 2], &[1, 2, 3]],
        &cfg,
        &mut rngs,
        &device,
        &|_| false,
    )
    .unwrap_err();
    assert!(err.to_string().contains("one length: 2 and 3"), "{err}");
    let mut rngs: Vec<ChaCha8Rng> = (0..3).map(ChaCha8Rng::seed_from_u64).collect();
    let err = generate_groups(
        &model,
        &[&[1, 2], &[3, 4]],
        &cfg,
        &mut rngs,
        &device,
        &|_| false,
    )
    .unwrap_err();
    assert!(err.to_string().contains("3 rows for 2 prompts"), "{err}");
}
