//! Log-likelihoods of a task's choices: the harness's token split of each question
//! ([`encode_question`]), the checks a task passes before a run starts ([`check_task`]), and
//! the batched scoring of the choices with one shared context pass per question.

use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_data::{McTask, Tok};
use qwen_burn_model::Qwen3ForCausalLM;
use qwen_burn_model::kv_cache::KvCache;
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

/// [`choice_logliks`] of several questions, each question's numbers the same bits whatever
/// else shares its forwards (issue 40, L1):
///
/// 1. Every context but its last token, padded on the right (so each starts at position 0 and
///    causal attention keeps the padding out of it), in one forward that fills a KV cache.
/// 2. For each context length in turn, the questions of that length: their cache rows, cut to
///    that length (a question alone would hold exactly them), repeated for each choice; then
///    every choice after its context's last token in one forward, padded on the right, each
///    token's log-probability from the positions before it.
///
/// Both forwards hold at least two positions per row and two rows (a duplicated row or a
/// padding position where needed): with fewer, the projections and the attention would take
/// their one-token decoding kernels, whose sums run in another order. The caller keeps each
/// context plus the group's longest choice within `max_position_embeddings`.
pub(super) fn group_logliks(
    model: &Qwen3ForCausalLM,
    questions: &[(&[u32], &[Vec<u32>])],
    device: &Device,
) -> Result<Vec<(Vec<f64>, usize)>> {
    let contexts = questions
        .iter()
        .map(|(c, k)| fitted(model, c, k))
        .collect::<Result<Vec<_>>>()?;
    // 1. The contexts without their last tokens, into one cache.
    let heads: Vec<&[u32]> = contexts.iter().map(|c| &c[..c.len() - 1]).collect();
    let filled = heads.iter().map(|h| h.len()).max().unwrap_or(0);
    let cache = if filled == 0 {
        None
    } else {
        let width = filled.max(2);
        let rows = heads.len().max(2);
        let mut ids = vec![0i64; rows * width];
        for (q, h) in heads.iter().enumerate() {
            for (i, &id) in h.iter().enumerate() {
                ids[q * width + i] = i64::from(id);
            }
        }
        let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [rows, width]), device);
        let mut cache = model.new_cache();
        let _ = model.forward_hidden(input, None, Some(&mut cache));
        Some(cache)
    };
    let mut out: Vec<(Vec<f64>, usize)> = contexts
        .iter()
        .zip(questions)
        .map(|(kept, (c, k))| (vec![0.0; k.len()], c.len() - kept.len()))
        .collect();
    // 2. The choices, one forward per context length.
    let mut lengths: Vec<usize> = heads.iter().map(|h| h.len()).collect();
    lengths.sort_unstable();
    lengths.dedup();
    for len in lengths {
        let members: Vec<usize> = (0..questions.len())
            .filter(|&q| heads[q].len() == len)
            .collect();
        let logliks = choices_after(
            model,
            questions,
            &contexts,
            &members,
            cache.as_ref(),
            len,
            device,
        )?;
        for (q, values) in members.into_iter().zip(logliks) {
            out[q].0 = values;
        }
    }
    Ok(out)
}

/// Step 2 of [`group_logliks`] for the questions `members`, whose contexts all hold `len + 1`
/// tokens: the summed log-probability of each choice, per question.
fn choices_after(
    model: &Qwen3ForCausalLM,
    questions: &[(&[u32], &[Vec<u32>])],
    contexts: &[&[u32]],
    members: &[usize],
    filled: Option<&KvCache>,
    len: usize,
    device: &Device,
) -> Result<Vec<Vec<f64>>> {
    // Rows: each member's choices, each as its context's last token then the choice.
    let mut owner = Vec::new();
    let mut rows: Vec<Vec<u32>> = Vec::new();
    for &q in members {
        let last = contexts[q][len];
        for choice in questions[q].1 {
            owner.push(q);
            rows.push(
                std::iter::once(last)
                    .chain(choice.iter().copied())
                    .collect(),
            );
        }
    }
    let real = rows.len();
    if real == 1 {
        owner.push(owner[0]);
        rows.push(rows[0].clone());
    }
    let n = rows.len();
    let rest = rows.iter().map(Vec::len).max().unwrap_or(2).max(3) - 1;
    let mut cache = model.new_cache();
    if let Some(filled) = filled.filter(|_| len > 0) {
        let index = Tensor::<1, Int>::from_data(
            TensorData::new(owner.iter().map(|&q| q as i64).collect::<Vec<_>>(), [n]),
            device,
        );
        for (layer, source) in cache.layers.iter_mut().zip(&filled.layers) {
            let (k, v) = source.views().ok_or_else(|| {
                TrainError::Other("the KV cache is empty after the contexts".into())
            })?;
            // The member rows, cut to their `len` positions, with room for this pass's.
            let room = |x: Tensor<4>| {
                let x = x.select(0, index.clone()).narrow(2, 0, len);
                let [b, h, _, d] = x.dims();
                Tensor::cat(vec![x, Tensor::zeros([b, h, rest, d], device)], 2)
            };
            layer.keys = Some(room(k));
            layer.values = Some(room(v));
            layer.len = len;
        }
        cache.seq_len = len;
        cache.rope_seq_len = len;
    }
    let mut inputs = vec![0i64; n * rest];
    let mut targets = vec![qwen_burn_data::IGNORE_INDEX; n * rest];
    for (j, ids) in rows.iter().enumerate() {
        for i in 0..ids.len() - 1 {
            inputs[j * rest + i] = i64::from(ids[i]);
            targets[j * rest + i] = i64::from(ids[i + 1]);
        }
    }
    let input = Tensor::<2, Int>::from_data(TensorData::new(inputs, [n, rest]), device);
    let targets = Tensor::<2, Int>::from_data(TensorData::new(targets, [n, rest]), device);
    let logits = model.forward(input, None, Some(&mut cache)).logits;
    let nll = token_nll(logits, targets)
        .try_into_vec_as::<f32>()
        .map_err(|e| TrainError::Device(format!("reading log-probabilities: {e:?}")))?;
    let mut sums = nll
        .chunks_exact(rest)
        .take(real)
        .map(|row| -row.iter().map(|&x| f64::from(x)).sum::<f64>());
    Ok(members
        .iter()
        .map(|&q| sums.by_ref().take(questions[q].1.len()).collect())
        .collect())
}
