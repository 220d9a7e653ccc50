//! The periodic samples a run prints and records in `samples.jsonl`.

use burn::tensor::Device;
use qwen_burn_data::Tok;
use qwen_burn_model::{Qwen3ForCausalLM, SamplingConfig, generate};

use crate::error::Result;

/// One periodic sample of a run: `(prompt text, generated text)`. The prompt is
/// `training.sample_prompt` (a newline when empty); top-k 50; the seed is the run's plus the
/// step, so a resumed run prints the same samples.
pub fn sample_text(
    model: &Qwen3ForCausalLM,
    tok: &Tok,
    prompt_text: &str,
    max_new_tokens: usize,
    temperature: f32,
    seed: u64,
    device: &Device,
) -> Result<(String, String)> {
    let prompt_text = if prompt_text.is_empty() {
        "\n"
    } else {
        prompt_text
    };
    let mut prompt = tok.encode(prompt_text)?;
    if prompt.is_empty() {
        prompt = tok.eos_id().into_iter().collect();
    }
    let cfg = SamplingConfig {
        max_new_tokens,
        temperature,
        top_k: Some(50),
        seed,
        stop_tokens: tok.stop_ids(),
        ..SamplingConfig::default()
    };
    let out = generate(model, &prompt, &cfg, device, |_| {})?;
    Ok((prompt_text.to_string(), tok.decode(&out.new_token_ids)?))
}
