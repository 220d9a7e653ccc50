//! The data of an RL run (`data.kind = "prompts"`): prompts with their reference answers
//! (`qwen_burn_data::prompts`), sampled in seeded shuffled epochs, `training.batch_size`
//! prompts a micro-batch (each becomes `rl.group_size` rows when the step generates);
//! validation on `data.val_inputs` or the first prompts.
//!
//! A prompt batch holds one row per prompt: the prompt's tokens, padded, and no target; its
//! `Batch::pairs` are the prompts' ids (held-out prompts numbered after the training ones).
//! Validation batches append each prompt's reference `answer` text as its targets: an RL run's
//! validation loss is the next-token loss of the reference answers right after their prompts
//! (the greedy rewards are the objective's validation figures).

use std::sync::Arc;

use qwen_burn_data::{
    Batch, ChatTemplate, Cursor, IGNORE_INDEX, Prefetcher, PromptSet, SftSampler, Tok, load_prompts,
};

use crate::config::RunConfig;
use crate::error::{Result, TrainError};
use crate::objective::rl::PromptSets;

/// One row per prompt of `ids` (numbered from `first_id`), followed by its `answers` tokens
/// as targets when given.
fn prompt_batch(
    set: &PromptSet,
    ids: &[usize],
    first_id: u32,
    pad: u32,
    answers: Option<&[Vec<u32>]>,
) -> Batch {
    let row = |i: usize| -> (Vec<u32>, usize) {
        let prompt = &set.items[i].ids;
        let mut ids = prompt.clone();
        if let Some(a) = answers {
            ids.extend(&a[i]);
        }
        (ids, prompt.len())
    };
    let rows: Vec<(Vec<u32>, usize)> = ids.iter().map(|&i| row(i)).collect();
    let t = rows.iter().map(|(r, _)| r.len()).max().unwrap_or(1).max(1);
    let (mut inputs, mut mask, mut targets) = (Vec::new(), Vec::new(), Vec::new());
    for (r, prompt_len) in &rows {
        for k in 0..t {
            inputs.push(r.get(k).copied().unwrap_or(pad));
            mask.push(u8::from(k < r.len()));
            targets.push(match r.get(k + 1) {
                Some(&next) if k + 1 >= *prompt_len => i64::from(next),
                _ => IGNORE_INDEX,
            });
        }
    }
    Batch {
        batch_size: ids.len(),
        seq_len: t,
        targets,
        inputs,
        attention_mask: Some(mask),
        positions: None,
        pairs: Some(ids.iter().map(|&i| first_id + i as u32).collect()),
    }
}

/// The prefetcher of prompt batches, the validation prompt batches and the prompt sets.
pub(super) fn open(
    config: &RunConfig,
    tok: &Tok,
    template: &ChatTemplate,
    cursor: Option<&Cursor>,
) -> Result<(Prefetcher, Vec<Batch>, PromptSets)> {
    let d = &config.data;
    let t = &config.training;
    if d.inputs.len() != 1 {
        return Err(TrainError::config(
            "data.inputs",
            "prompt data takes exactly one JSONL or Parquet file",
        ));
    }
    // A prompt and its completion must fit a row of training.seq_len tokens.
    let room = t
        .seq_len
        .checked_sub(config.rl.max_new_tokens)
        .filter(|&r| r > 0);
    let Some(room) = room else {
        return Err(TrainError::config(
            "rl.max_new_tokens",
            format!(
                "is {}, which leaves no room for a prompt in training.seq_len = {} tokens",
                config.rl.max_new_tokens, t.seq_len
            ),
        ));
    };
    let load = |path| load_prompts(path, tok, template, Some(room));
    let train = Arc::new(load(&d.inputs[0])?);
    let val = match d.val_inputs.first() {
        Some(path) => Arc::new(load(path)?),
        None => train.clone(),
    };
    let pad = tok.require_eos()?;
    let mut sampler = SftSampler::new(train.items.len(), t.batch_size, 1, t.seed)?
        .with_global_batch(t.batch_size * t.grad_accum)?;
    if let Some(c) = cursor {
        sampler.restore(c)?;
    }
    let first_val = train.items.len() as u32;
    let val_count = val.items.len().min(t.eval_batches * t.batch_size);
    let answers = val
        .items
        .iter()
        .map(|item| tok.encode(&item.answer))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let val_batches = (0..val_count)
        .collect::<Vec<_>>()
        .chunks(t.batch_size)
        .map(|ids| prompt_batch(&val, ids, first_val, pad, Some(&answers)))
        .collect();
    let data = train.clone();
    let prefetcher = Prefetcher::spawn(d.prefetch, move || {
        let batch = prompt_batch(&data, &sampler.next_rows(), 0, pad, None);
        (batch, sampler.cursor())
    });
    let mut stop_ids = tok.stop_ids();
    stop_ids.dedup();
    let sets = PromptSets {
        train,
        val,
        tok: Arc::new(tok.clone()),
        stop_ids,
    };
    Ok((prefetcher, val_batches, sets))
}
