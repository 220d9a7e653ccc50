//! A conversation's generation that keeps its KV cache between turns gives the tokens a fresh
//! generation of the whole prompt gives, greedy and sampled, when the new prompt extends the
//! cached tokens and when it departs from them midway (the cache is cut back to the common
//! head, and exactly that many tokens are reused); with dynamic NTK RoPE nothing is reused.

use burn::tensor::Device;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{
    PrefixCache, Qwen3Config, Qwen3ForCausalLM, SamplingConfig, generate, generate_continuing,
};
use serde_json::json;

fn tiny_model(device: &Device, rope_scaling: Option<serde_json::Value>) -> Qwen3ForCausalLM {
    let mut config = json!({
        "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "initializer_range": 0.5,
    });
    if let Some(r) = rope_scaling {
        config["rope_scaling"] = r;
    }
    let config = Qwen3Config::from_json(&config, true).unwrap();
    init_weights(Qwen3ForCausalLM::new(&config, device), 5)
}

fn sampling(temperature: f32, seed: u64) -> SamplingConfig {
    SamplingConfig {
        max_new_tokens: 12,
        temperature,
        seed,
        ..SamplingConfig::default()
    }
}

#[test]
fn kept_cache_turns_generate_what_fresh_prompts_generate() {
    let device = Device::flex();
    let model = tiny_model(&device, None);
    for (temperature, seed) in [(0.0, 0), (1.0, 1), (1.0, 2), (0.8, 3)] {
        let cfg = sampling(temperature, seed);
        let fresh = |prompt: &[u32]| {
            generate(&model, prompt, &cfg, &device, |_| {})
                .unwrap()
                .new_token_ids
        };
        let mut prefix = PrefixCache::new(&model);
        let mut turn = |prompt: &[u32]| {
            let c =
                generate_continuing(&model, &mut prefix, prompt, &cfg, &device, |_| {}).unwrap();
            (c.generation.new_token_ids, c.reused)
        };
        let first: Vec<u32> = vec![1, 2, 3, 4, 5];
        let (reply, reused) = turn(&first);
        assert_eq!((reply.clone(), reused), (fresh(&first), 0));
        // The next turn: the conversation so far plus a new message. Everything cached is
        // reused: the prompt and the reply but its last token, never computed.
        let mut second = first.clone();
        second.extend(&reply);
        second.extend([7, 8, 9]);
        let (reply2, reused) = turn(&second);
        assert_eq!(reused, first.len() + reply.len() - 1, "t = {temperature}");
        assert_eq!(reply2, fresh(&second), "t = {temperature}, seed {seed}");
        // A prompt that departs from the cached tokens at position 6: the cache is cut back.
        let mut third = second[..6].to_vec();
        third.extend([60, 61, 62, 63]);
        assert_ne!(second[6], 60);
        let (reply3, reused) = turn(&third);
        assert_eq!(reused, 6);
        assert_eq!(reply3, fresh(&third), "t = {temperature}, seed {seed}");
        // The same prompt again: all but its last token reused.
        let (again, reused) = turn(&third);
        assert_eq!((again, reused), (reply3, third.len() - 1));
    }
}

#[test]
fn dynamic_rope_reuses_nothing_and_bad_prompts_are_refused() {
    let device = Device::flex();
    let model = tiny_model(
        &device,
        Some(json!({"rope_type": "dynamic", "factor": 2.0})),
    );
    let cfg = sampling(0.0, 0);
    let mut prefix = PrefixCache::new(&model);
    let first = [1, 2, 3];
    let c = generate_continuing(&model, &mut prefix, &first, &cfg, &device, |_| {}).unwrap();
    let mut second = first.to_vec();
    second.extend(&c.generation.new_token_ids);
    second.push(4);
    let c2 = generate_continuing(&model, &mut prefix, &second, &cfg, &device, |_| {}).unwrap();
    assert_eq!(c2.reused, 0);
    let fresh = generate(&model, &second, &cfg, &device, |_| {}).unwrap();
    assert_eq!(c2.generation.new_token_ids, fresh.new_token_ids);
    // An out-of-range id is refused before anything changes.
    let kept = prefix.tokens().to_vec();
    let err = generate_continuing(&model, &mut prefix, &[1, 99], &cfg, &device, |_| {});
    assert!(
        err.unwrap_err()
            .to_string()
            .contains("out of range for vocab_size 64")
    );
    assert_eq!(prefix.tokens(), kept.as_slice());
    prefix.clear();
    assert!(prefix.tokens().is_empty());
}
