//! Log-likelihoods of a task's choices: the harness's token split of each question
//! ([`encode_question`]), the checks a task passes before a run starts ([`check_task`]), and
//! the batched scoring of the choices with one shared context pass per question.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use qwen_burn_data::{McTask, Tok};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::loss::token_nll;
use serde::Serialize;

use crate::error::{Result, TrainError};

/// How to run a task.
#[derive(Debug, Clone, Copy)]
pub struct TaskOptions {
    /// Few-shot examples before each question.
    pub shots: usize,
    /// Score at most the first N questions (`None`: all).
    pub limit: Option<usize>,
    /// Seed of the few-shot draw.
    pub seed: u64,
    /// Questions whose contexts run in one forward, at most ([`DEFAULT_BATCH`]).
    pub batch: usize,
}

/// The tokens of one question: the context once, then each choice's continuation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EncodedQuestion {
    /// The context after the harness's whitespace move.
    pub context: String,
    /// Each continuation: the moved whitespace, `" "`, and the choice.
    pub continuations: Vec<String>,
    /// Tokens of the context.
    pub context_ids: Vec<u32>,
    /// Tokens of each continuation.
    pub continuation_ids: Vec<Vec<u32>>,
}

/// lm-evaluation-harness's `_encode_pair` for every choice of one context.
pub fn encode_question(tok: &Tok, context: &str, choices: &[String]) -> Result<EncodedQuestion> {
    let kept = context.trim_end().len();
    let (context, moved) = context.split_at(kept);
    let continuations: Vec<String> = choices
        .iter()
        .map(|c| format!("{moved}{}{c}", qwen_burn_data::tasks::TARGET_DELIMITER))
        .collect();
    if context.is_empty() {
        // The harness scores a context-free continuation after the end-of-text token.
        let eos = tok.require_eos()?;
        let continuation_ids = continuations
            .iter()
            .map(|c| tok.encode(c))
            .collect::<qwen_burn_data::Result<Vec<_>>>()?;
        return Ok(EncodedQuestion {
            context: String::new(),
            continuations,
            context_ids: vec![eos],
            continuation_ids,
        });
    }
    let context_ids = tok.encode(context)?;
    let mut continuation_ids = Vec::with_capacity(continuations.len());
    for c in &continuations {
        let whole = tok.encode(&format!("{context}{c}"))?;
        continuation_ids.push(whole.get(context_ids.len()..).unwrap_or_default().to_vec());
    }
    Ok(EncodedQuestion {
        context: context.to_string(),
        continuations,
        context_ids,
        continuation_ids,
    })
}

/// Every question scoring would take (`opts.limit` of them) prepared as scoring prepares it:
/// its few-shot context, its tokens, its fit to `max_position_embeddings`, without a forward.
/// A run checks its `[eval]` tasks so before it trains, so that a resumed or branched run,
/// whose first scoring comes `eval.interval` steps later, fails before it does any work.
pub fn check_task(
    model: &Qwen3ForCausalLM,
    tok: &Tok,
    task: &McTask,
    opts: &TaskOptions,
) -> Result<()> {
    let n = opts
        .limit
        .map_or(task.items.len(), |l| l.min(task.items.len()));
    for index in 0..n {
        let context = task.context(index, opts.shots, opts.seed)?;
        let encoded = encode_question(tok, &context, &task.items[index].choices)?;
        fitted(model, &encoded.context_ids, &encoded.continuation_ids).map_err(|e| {
            TrainError::Other(format!(
                "{}: question {}: {e}",
                task.path.display(),
                index + 1
            ))
        })?;
    }
    Ok(())
}

/// Logits one batched forward may hold, `[choices, tokens, vocab]` floats: 256 MiB.
pub(super) const MAX_LOGITS: usize = 1 << 26;
/// Questions scored together by default.
pub const DEFAULT_BATCH: usize = 32;

/// The log-likelihood of each continuation after `context_ids`, and how many context tokens were
/// dropped from the left to fit `max_position_embeddings`.
pub fn choice_logliks(
    model: &Qwen3ForCausalLM,
    context_ids: &[u32],
    continuation_ids: &[Vec<u32>],
    device: &Device,
) -> Result<(Vec<f64>, usize)> {
    let mut out = group_logliks(model, &[(context_ids, continuation_ids)], device)?;
    Ok(out.remove(0))
}

/// A question's context kept after left truncation: the newest tokens that fit with its
/// longest continuation.
pub(super) fn fitted<'a>(
    model: &Qwen3ForCausalLM,
    context_ids: &'a [u32],
    continuation_ids: &[Vec<u32>],
) -> Result<&'a [u32]> {
    let vocab = model.config.vocab_size;
    let max_len = model.config.max_position_embeddings;
    let longest = continuation_ids.iter().map(Vec::len).max().unwrap_or(0);
    if continuation_ids.is_empty() || continuation_ids.iter().any(Vec::is_empty) {
        return Err(TrainError::Other(
            "a choice encodes to no tokens after its context".into(),
        ));
    }
    if let Some(bad) = context_ids
        .iter()
        .chain(continuation_ids.iter().flatten())
        .find(|&&id| id as usize >= vocab)
    {
        return Err(TrainError::Other(format!(
            "token id {bad} is out of range for the model's vocab_size {vocab}"
        )));
    }
    if context_ids.is_empty() || longest >= max_len {
        return Err(TrainError::Other(format!(
            "a continuation of {longest} tokens leaves no room for its context within the \
             model's max_position_embeddings {max_len}"
        )));
    }
    let keep = context_ids.len().min(max_len - longest);
    Ok(&context_ids[context_ids.len() - keep..])
}

/// [`choice_logliks`] of several questions in two forwards: their contexts together (padded on
/// the left, so that every context ends at the last position and its choices follow it
/// directly) into one KV cache, then every choice of every question over its question's rows of
/// that cache. RoPE depends only on the distance between positions, so the padding changes a
/// score by float rounding only. The caller keeps the longest context plus the longest choice of
/// the group within `max_position_embeddings`.
pub(super) fn group_logliks(
    model: &Qwen3ForCausalLM,
    questions: &[(&[u32], &[Vec<u32>])],
    device: &Device,
) -> Result<Vec<(Vec<f64>, usize)>> {
    let vocab = model.config.vocab_size;
    let contexts = questions
        .iter()
        .map(|(c, k)| fitted(model, c, k))
        .collect::<Result<Vec<_>>>()?;
    let g = questions.len();
    let width = contexts.iter().map(|c| c.len()).max().unwrap_or(0);
    let pads: Vec<usize> = contexts.iter().map(|c| width - c.len()).collect();
    let padded = pads.iter().any(|&p| p > 0);

    // 1. The contexts once, into the cache; each one's last position predicts its choices'
    //    first tokens.
    let mut cache = model.new_cache();
    let mut ids = vec![0i64; g * width];
    let mut real = vec![true; g * width];
    for (q, c) in contexts.iter().enumerate() {
        for (i, &id) in c.iter().enumerate() {
            ids[q * width + pads[q] + i] = i64::from(id);
        }
        real[q * width..q * width + pads[q]].fill(false);
    }
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [g, width]), device);
    let mask =
        padded.then(|| Tensor::<2, Bool>::from_data(TensorData::new(real, [g, width]), device));
    let (hidden, _) = model.forward_hidden(input, mask, Some(&mut cache));
    let last = model.lm_head(hidden.narrow(1, width - 1, 1));
    let first = log_softmax(last.reshape([g, vocab]), 1)
        .try_into_vec_as::<f32>()
        .map_err(|e| TrainError::Device(format!("reading log-probabilities: {e:?}")))?;
    let mut out: Vec<(Vec<f64>, usize)> = questions
        .iter()
        .zip(&contexts)
        .enumerate()
        .map(|(q, ((c, k), kept))| {
            let logliks = k
                .iter()
                .map(|ids| f64::from(first[q * vocab + ids[0] as usize]))
                .collect();
            (logliks, c.len() - kept.len())
        })
        .collect();

    // 2. The rest of every choice in one batch over its question's cache rows. Choices are
    //    padded on the right: causal attention keeps that padding out of every real position.
    let owner: Vec<usize> = questions
        .iter()
        .enumerate()
        .flat_map(|(q, (_, k))| std::iter::repeat_n(q, k.len()))
        .collect();
    let choices: Vec<&Vec<u32>> = questions.iter().flat_map(|(_, k)| k.iter()).collect();
    let n = choices.len();
    let rest = choices.iter().map(|c| c.len()).max().unwrap_or(1) - 1;
    if rest == 0 {
        return Ok(out);
    }
    let rows = Tensor::<1, Int>::from_data(
        TensorData::new(owner.iter().map(|&q| q as i64).collect::<Vec<_>>(), [n]),
        device,
    );
    // Each layer's filled keys and values, row-selected into buffers of exactly the positions
    // this pass fills (the cache's own growth would round up to 256 positions a row).
    for layer in &mut cache.layers {
        let (k, v) = layer
            .views()
            .ok_or_else(|| TrainError::Other("the KV cache is empty after the context".into()))?;
        let room = |x: Tensor<4>| {
            let x = x.select(0, rows.clone());
            let [b, h, _, d] = x.dims();
            Tensor::cat(vec![x, Tensor::zeros([b, h, rest, d], device)], 2)
        };
        layer.keys = Some(room(k));
        layer.values = Some(room(v));
    }
    let mut inputs = vec![0i64; n * rest];
    let mut targets = vec![qwen_burn_data::IGNORE_INDEX; n * rest];
    for (j, ids) in choices.iter().enumerate() {
        for i in 0..ids.len() - 1 {
            inputs[j * rest + i] = i64::from(ids[i]);
            targets[j * rest + i] = i64::from(ids[i + 1]);
        }
    }
    let mask = padded.then(|| {
        let s = width + rest;
        let mut real = vec![true; n * s];
        for (j, &q) in owner.iter().enumerate() {
            real[j * s..j * s + pads[q]].fill(false);
        }
        Tensor::<2, Bool>::from_data(TensorData::new(real, [n, s]), device)
    });
    let input = Tensor::<2, Int>::from_data(TensorData::new(inputs, [n, rest]), device);
    let targets = Tensor::<2, Int>::from_data(TensorData::new(targets, [n, rest]), device);
    let logits = model.forward(input, mask, Some(&mut cache)).logits;
    let nll = token_nll(logits, targets)
        .try_into_vec_as::<f32>()
        .map_err(|e| TrainError::Device(format!("reading log-probabilities: {e:?}")))?;
    let mut rows = nll.chunks_exact(rest);
    for (logliks, _) in &mut out {
        for (l, row) in logliks.iter_mut().zip(rows.by_ref()) {
            *l -= row.iter().map(|&x| f64::from(x)).sum::<f64>();
        }
    }
    Ok(out)
}
