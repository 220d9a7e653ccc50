//! A step's rollout: the group of completions of each prompt, decoded in batches of groups with the
//! policy as it is before the step, scored by the reward functions, turned into training rows
//! (prompt + completion, the loss on the completion's tokens) with their advantages.

use std::collections::BTreeMap;
use std::sync::Arc;

use burn::module::Module;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_data::{Batch, IGNORE_INDEX, PromptSet, Tok};
use qwen_burn_model::{GroupCompletion, Qwen3ForCausalLM, SamplingConfig, generate_groups};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::rewards::{Reward, Scored};
use crate::config::RlConfig;
use crate::error::{Result, TrainError};
use crate::step::batch::{batch_documents, input_tensors};

/// The prompts and tokenizer of an RL run.
#[derive(Clone)]
pub struct PromptSets {
    /// Training prompts (ids `0..train.items.len()` in prompt batches).
    pub train: Arc<PromptSet>,
    /// Held-out prompts (ids after the training ones).
    pub val: Arc<PromptSet>,
    /// The tokenizer, to decode completions for the rewards.
    pub tok: Arc<Tok>,
    /// Tokens that end a completion (EOS, `<|im_end|>`).
    pub stop_ids: Vec<u32>,
}

impl PromptSets {
    /// The prompt of id `id` (training ids first, then held-out ones).
    pub fn item(&self, id: u32) -> Result<&qwen_burn_data::PromptItem> {
        let id = id as usize;
        let n = self.train.items.len();
        if id < n {
            Ok(&self.train.items[id])
        } else {
            self.val
                .items
                .get(id - n)
                .ok_or_else(|| TrainError::Other(format!("prompt {id} is beyond the prompt sets")))
        }
    }

    /// A completion's text for the rewards: its tokens without a final stop token.
    pub fn completion_text(&self, ids: &[u32]) -> Result<String> {
        let ids = match ids.last() {
            Some(last) if self.stop_ids.contains(last) => &ids[..ids.len() - 1],
            _ => ids,
        };
        Ok(self.tok.decode(ids)?)
    }
}

/// A reward function with its weight and the name its figures carry.
pub struct NamedReward {
    pub reward: Reward,
    pub weight: f64,
    pub name: &'static str,
}

/// The sampling settings of `[rl]`.
pub fn sampling(config: &RlConfig, stop_ids: &[u32], greedy: bool) -> SamplingConfig {
    SamplingConfig {
        max_new_tokens: config.max_new_tokens,
        temperature: if greedy {
            0.0
        } else {
            config.temperature as f32
        },
        top_k: (config.top_k > 0).then_some(config.top_k),
        top_p: (config.top_p < 1.0).then_some(config.top_p as f32),
        seed: 0,
        stop_tokens: stop_ids.to_vec(),
        use_cache: true,
    }
}

/// The RNG of completion `row` of prompt `prompt` at step `step`: a function of the run's
/// seed and these three only, so a rollout is the same whatever came before it.
pub fn row_rng(seed: u64, step: usize, prompt: u32, row: usize) -> ChaCha8Rng {
    let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
    for v in [step as u64, u64::from(prompt), row as u64] {
        x = splitmix(x ^ v.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    }
    ChaCha8Rng::seed_from_u64(x)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The KV cache one decoding batch may hold (bytes): as many groups decode together as fit.
const DECODE_CACHE_BYTES: usize = 512 << 20;

/// `n` completions of every prompt of `ids`: the prompts of one token length decode together
/// (as many groups at once as `DECODE_CACHE_BYTES` of KV cache holds), each row with its own
/// [`row_rng`], so a completion does not depend on which prompts share its batch.
#[allow(clippy::too_many_arguments)]
pub fn complete(
    model: &Qwen3ForCausalLM,
    sets: &PromptSets,
    config: &RlConfig,
    ids: &[u32],
    n: usize,
    greedy: bool,
    seed: u64,
    step: usize,
    device: &Device,
) -> Result<Vec<Vec<GroupCompletion>>> {
    let cfg = sampling(config, &sets.stop_ids, greedy);
    let tok = &sets.tok;
    let stops = &config.stop;
    let stop = |ids: &[u32]| {
        !stops.is_empty()
            && tok
                .decode(ids)
                .is_ok_and(|text| stops.iter().any(|s| text.contains(s.as_str())))
    };
    let items = ids
        .iter()
        .map(|&id| sets.item(id))
        .collect::<Result<Vec<_>>>()?;
    let mut by_len: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (k, item) in items.iter().enumerate() {
        by_len.entry(item.ids.len()).or_default().push(k);
    }
    let c = &model.config;
    let per_position = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4;
    let mut out: Vec<Vec<GroupCompletion>> = vec![Vec::new(); ids.len()];
    for (len, members) in by_len {
        // The cache's buffers hold a power of two of positions, 256 at least (`kv_cache`).
        let positions = (len + cfg.max_new_tokens).next_power_of_two().max(256);
        let per_group = (n * positions * per_position).max(1);
        let at_once = (DECODE_CACHE_BYTES / per_group).max(1);
        for chunk in members.chunks(at_once) {
            let prompts: Vec<&[u32]> = chunk.iter().map(|&k| items[k].ids.as_slice()).collect();
            let mut rngs: Vec<ChaCha8Rng> = chunk
                .iter()
                .flat_map(|&k| (0..n).map(move |r| row_rng(seed, step, ids[k], r)))
                .collect();
            let groups = generate_groups(model, &prompts, &cfg, &mut rngs, device, &stop)?;
            for (&k, group) in chunk.iter().zip(groups) {
                out[k] = group;
            }
        }
    }
    Ok(out)
}

/// The weighted reward of every completion, and each function's rewards.
pub fn score(
    rewards: &[NamedReward],
    sets: &PromptSets,
    prompts: &[u32],
    completions: &[Vec<GroupCompletion>],
) -> Result<(Vec<f64>, Vec<Vec<f64>>)> {
    let mut texts = Vec::new();
    let mut owners = Vec::new();
    for (&id, group) in prompts.iter().zip(completions) {
        let item = sets.item(id)?;
        for c in group {
            texts.push(sets.completion_text(&c.ids)?);
            owners.push(item);
        }
    }
    let items: Vec<Scored<'_>> = owners
        .iter()
        .zip(&texts)
        .map(|(item, text)| Scored {
            prompt: &item.text,
            completion: text,
            answer: &item.answer,
        })
        .collect();
    let mut total = vec![0.0; items.len()];
    let mut each = Vec::with_capacity(rewards.len());
    for r in rewards {
        let values = r
            .reward
            .score(&items)
            .map_err(|e| TrainError::Other(format!("reward `{}`: {e}", r.name)))?;
        for (t, v) in total.iter_mut().zip(&values) {
            *t += r.weight * v;
        }
        each.push(values);
    }
    Ok((total, each))
}

/// Training rows of `prompts`' completions: prompt + completion, padded to the longest, the
/// targets on the completion's tokens; `first_row` numbers the rows (`Batch::pairs`).
pub fn rows_batch(
    sets: &PromptSets,
    prompts: &[u32],
    completions: &[Vec<GroupCompletion>],
    pad: u32,
    first_row: u32,
) -> Result<Batch> {
    let mut seqs = Vec::new();
    for (&id, group) in prompts.iter().zip(completions) {
        let prompt = &sets.item(id)?.ids;
        for c in group {
            seqs.push((prompt, &c.ids));
        }
    }
    let t = seqs
        .iter()
        .map(|(p, c)| p.len() + c.len())
        .max()
        .unwrap_or(1);
    let rows = seqs.len();
    let (mut inputs, mut targets, mut mask) = (
        Vec::with_capacity(rows * t),
        Vec::with_capacity(rows * t),
        Vec::with_capacity(rows * t),
    );
    for (prompt, completion) in &seqs {
        let ids: Vec<u32> = prompt.iter().chain(completion.iter()).copied().collect();
        for p in 0..t {
            if p < ids.len() {
                inputs.push(ids[p]);
                mask.push(1);
                let next = p + 1;
                targets.push(if next >= prompt.len() && next < ids.len() {
                    i64::from(ids[next])
                } else {
                    IGNORE_INDEX
                });
            } else {
                inputs.push(pad);
                mask.push(0);
                targets.push(IGNORE_INDEX);
            }
        }
    }
    Ok(Batch {
        batch_size: rows,
        seq_len: t,
        inputs,
        targets,
        attention_mask: Some(mask),
        positions: None,
        pairs: Some((0..rows as u32).map(|r| first_row + r).collect()),
    })
}

/// The per-token log-probabilities of `batch`'s targets, `[rows, T]` (where no target, that of
/// token 0: the loss masks it), and the per-token entropies of the model's distributions there; differentiable through
/// `hidden` (the model's final hidden states of the batch).
pub fn token_logps(
    model: &Qwen3ForCausalLM,
    hidden: Tensor<3>,
    batch: &Batch,
    device: &Device,
) -> (Tensor<2>, Tensor<2>) {
    let (b, t) = (batch.batch_size, batch.seq_len);
    let logp = log_softmax(model.lm_head(hidden), 2);
    let index: Vec<i64> = batch.targets.iter().map(|&x| x.max(0)).collect();
    let index = Tensor::<2, Int>::from_data(TensorData::new(index, [b, t]), device);
    let picked = logp
        .clone()
        .gather(2, index.unsqueeze_dim::<3>(2))
        .reshape([b, t]);
    let p = logp.clone().detach().exp();
    let entropy = (p * logp.detach()).sum_dim(2).reshape([b, t]).neg();
    (picked, entropy)
}

/// The final hidden states scaled by `1 / temperature`, so that the LM head (which has no bias)
/// gives the logits divided by the sampling temperature: the log-probabilities the loss takes
/// are those of the distribution the completions were sampled from. TRL's `GRPOTrainer`
/// divides its logits by `temperature` likewise, for the policy, the old and the reference
/// log-probabilities.
pub fn tempered(hidden: Tensor<3>, temperature: f64) -> Tensor<3> {
    if temperature == 1.0 {
        hidden
    } else {
        hidden.div_scalar(temperature)
    }
}

/// [`token_logps`] of `batch` at `temperature` ([`tempered`]) through a model without
/// autodiff, row-major on the host.
pub fn host_token_logps(
    model: &Qwen3ForCausalLM,
    batch: &Batch,
    temperature: f64,
) -> Result<Vec<f32>> {
    let device = model
        .devices()
        .first()
        .cloned()
        .ok_or_else(|| TrainError::Other("a model without a device".into()))?;
    let (inputs, mask) = input_tensors(batch, &device);
    let docs = batch_documents(batch, model)?;
    let (hidden, _) = model.forward_hidden_packed(inputs, mask, docs.as_ref());
    let (logps, _) = token_logps(model, tempered(hidden, temperature), batch, &device);
    logps
        .try_into_vec_as::<f32>()
        .map_err(|e| TrainError::Device(format!("{e:?}")))
}
