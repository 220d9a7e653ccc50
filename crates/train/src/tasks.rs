//! Multiple-choice evaluation by log-likelihood, the lm-evaluation-harness way.
//!
//! Each choice is scored as the summed log-probability of its continuation tokens given the
//! context. The split into tokens is the harness's `_encode_pair`: the context's trailing
//! whitespace moves to the continuation, the whole text `context + continuation` is encoded,
//! and the continuation's tokens are the whole's tokens after as many as the context alone
//! encodes to. (An empty context is the document separator alone.) `acc` counts questions whose
//! highest log-likelihood is the right choice; `acc_norm` divides each log-likelihood by the
//! choice's length in UTF-8 bytes first (the harness divides by `len(choice)` in characters:
//! the same for ASCII). Ties go to the first choice, as `numpy.argmax` does. Standard errors
//! are the harness's: the sample standard deviation over questions divided by `sqrt(n)`.
//!
//! The context is computed once per question: one forward fills a KV cache, the cache is
//! repeated for the choices, and one batched forward scores every choice's tokens after the
//! first (the first is predicted by the context's last position). A context too long for
//! `max_position_embeddings` together with the longest continuation loses its oldest tokens,
//! as the harness's left truncation does.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
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

/// The log-likelihood of each continuation after `context_ids`, and how many context tokens were
/// dropped from the left to fit `max_position_embeddings`.
pub fn choice_logliks(
    model: &Qwen3ForCausalLM,
    context_ids: &[u32],
    continuation_ids: &[Vec<u32>],
    device: &Device,
) -> Result<(Vec<f64>, usize)> {
    let vocab = model.config.vocab_size;
    let max_len = model.config.max_position_embeddings;
    let longest = continuation_ids.iter().map(Vec::len).max().unwrap_or(0);
    if continuation_ids.iter().any(Vec::is_empty) {
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
    // Left truncation: keep the newest context tokens that fit with the longest continuation.
    let keep = context_ids.len().min(max_len - longest);
    let dropped = context_ids.len() - keep;
    let context_ids = &context_ids[dropped..];

    // 1. The context once, into the cache; its last position predicts each choice's first
    //    token.
    let mut cache = model.new_cache();
    let c = context_ids.len();
    let input = Tensor::<2, Int>::from_data(
        TensorData::new(context_ids.iter().map(|&i| i64::from(i)).collect(), [1, c]),
        device,
    );
    let (hidden, _) = model.forward_hidden(input, None, Some(&mut cache));
    let last = model.lm_head(hidden.narrow(1, c - 1, 1));
    let first = log_softmax(last.reshape([1, vocab]), 1)
        .try_into_vec_as::<f32>()
        .map_err(|e| TrainError::Device(format!("reading log-probabilities: {e:?}")))?;
    let mut logliks: Vec<f64> = continuation_ids
        .iter()
        .map(|ids| f64::from(first[ids[0] as usize]))
        .collect();

    // 2. The rest of every choice in one batch over the repeated cache. Rows are padded on the
    //    right: causal attention keeps the padding out of every real position.
    let (n, width) = (continuation_ids.len(), longest - 1);
    if width > 0 {
        for layer in &mut cache.layers {
            layer.keys = layer.keys.take().map(|k| k.repeat_dim(0, n));
            layer.values = layer.values.take().map(|v| v.repeat_dim(0, n));
        }
        let mut inputs = vec![0i64; n * width];
        let mut targets = vec![qwen_burn_data::IGNORE_INDEX; n * width];
        for (j, ids) in continuation_ids.iter().enumerate() {
            for i in 0..ids.len() - 1 {
                inputs[j * width + i] = i64::from(ids[i]);
                targets[j * width + i] = i64::from(ids[i + 1]);
            }
        }
        let input = Tensor::<2, Int>::from_data(TensorData::new(inputs, [n, width]), device);
        let targets = Tensor::<2, Int>::from_data(TensorData::new(targets, [n, width]), device);
        let logits = model.forward(input, None, Some(&mut cache)).logits;
        let nll = token_nll(logits, targets)
            .try_into_vec_as::<f32>()
            .map_err(|e| TrainError::Device(format!("reading log-probabilities: {e:?}")))?;
        for (j, row) in nll.chunks_exact(width).enumerate() {
            logliks[j] -= row.iter().map(|&x| f64::from(x)).sum::<f64>();
        }
    }
    Ok((logliks, dropped))
}

/// One question's scores (the per-question records of `eval --task --records`).
#[derive(Debug, Clone, Serialize)]
pub struct QuestionScore {
    /// 0-based index of the question in the task file.
    pub index: usize,
    /// Its tokens.
    #[serde(flatten)]
    pub encoded: EncodedQuestion,
    /// Log-likelihood of each continuation.
    pub loglik: Vec<f64>,
    /// UTF-8 bytes of each choice (the `acc_norm` divisor).
    pub choice_bytes: Vec<usize>,
    /// The right choice.
    pub gold: usize,
    /// The choice with the highest log-likelihood.
    pub pred: usize,
    /// The choice with the highest log-likelihood per byte.
    pub pred_norm: usize,
    /// Context tokens dropped on the left to fit the model.
    pub truncated: usize,
}

/// Index of the first maximum (`numpy.argmax`); NaN never wins.
fn argmax(values: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

/// The choice `acc` picks (highest log-likelihood) and the one `acc_norm` picks (highest
/// log-likelihood per UTF-8 byte of the choice; an empty choice keeps its plain score).
pub fn predictions(loglik: &[f64], choice_bytes: &[usize]) -> (usize, usize) {
    let pred = argmax(loglik.iter().copied());
    let pred_norm = argmax(
        loglik
            .iter()
            .zip(choice_bytes)
            .map(|(&l, &b)| if b == 0 { l } else { l / b as f64 }),
    );
    (pred, pred_norm)
}

/// Mean and the harness's standard error (`sample std / sqrt(n)`) of 0/1 outcomes.
pub fn mean_stderr(outcomes: &[bool]) -> (f64, f64) {
    let n = outcomes.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = outcomes.iter().filter(|&&x| x).count() as f64 / n as f64;
    if n == 1 {
        return (mean, f64::NAN);
    }
    let var = outcomes
        .iter()
        .map(|&x| (f64::from(u8::from(x)) - mean).powi(2))
        .sum::<f64>()
        / (n - 1) as f64;
    (mean, (var / n as f64).sqrt())
}

/// A task's metrics.
#[derive(Debug, Clone, Serialize)]
pub struct TaskResult {
    /// The task's name (its file stem).
    pub task: String,
    /// The layout it was read as.
    pub layout: String,
    /// Questions scored.
    pub questions: usize,
    /// Few-shot examples per question.
    pub shots: usize,
    /// Accuracy.
    pub acc: f64,
    /// Its standard error.
    pub acc_stderr: f64,
    /// Accuracy with log-likelihoods per byte of the choice.
    pub acc_norm: f64,
    /// Its standard error.
    pub acc_norm_stderr: f64,
    /// Expected accuracy of a uniform guess (mean of 1 / choices).
    pub chance: f64,
    /// Questions whose context was cut on the left to fit the model.
    pub truncated_questions: usize,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// The name of a task file: its name without `.jsonl`, `.json`, `.parquet` or `.gz`.
pub fn task_name(path: &std::path::Path) -> String {
    let mut name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    for ext in [".gz", ".jsonl", ".json", ".parquet"] {
        if let Some(stem) = name.strip_suffix(ext) {
            name = stem.to_string();
        }
    }
    name
}

/// Score `task` with `model`: metrics and the per-question scores. `progress` gets the
/// questions scored so far.
pub fn evaluate_task(
    model: &Qwen3ForCausalLM,
    tok: &Tok,
    task: &McTask,
    opts: &TaskOptions,
    device: &Device,
    mut progress: impl FnMut(usize),
) -> Result<(TaskResult, Vec<QuestionScore>)> {
    let started = std::time::Instant::now();
    let (tok_vocab, model_vocab) = (tok.vocab_size(), model.config.vocab_size);
    if tok_vocab > model_vocab {
        return Err(TrainError::Other(format!(
            "tokenizer {} has {tok_vocab} tokens but the model's vocab_size is {model_vocab}: it \
             is not this model's tokenizer",
            tok.path().display()
        )));
    }
    let n = opts
        .limit
        .map_or(task.items.len(), |l| l.min(task.items.len()));
    let mut scores = Vec::with_capacity(n);
    for index in 0..n {
        let item = &task.items[index];
        let context = task.context(index, opts.shots, opts.seed)?;
        let encoded = encode_question(tok, &context, &item.choices)?;
        let (loglik, truncated) = choice_logliks(
            model,
            &encoded.context_ids,
            &encoded.continuation_ids,
            device,
        )
        .map_err(|e| {
            TrainError::Other(format!(
                "{}: question {}: {e}",
                task.path.display(),
                index + 1
            ))
        })?;
        let choice_bytes: Vec<usize> = item.choices.iter().map(String::len).collect();
        let (pred, pred_norm) = predictions(&loglik, &choice_bytes);
        scores.push(QuestionScore {
            index,
            encoded,
            loglik,
            choice_bytes,
            gold: item.gold,
            pred,
            pred_norm,
            truncated,
        });
        progress(index + 1);
    }
    if let Some(bad) = scores
        .iter()
        .find(|s| s.loglik.iter().any(|l| !l.is_finite()))
    {
        return Err(TrainError::Other(format!(
            "{}: question {}: a log-likelihood is not finite ({:?}); the model's weights or \
             logits are broken",
            task.path.display(),
            bad.index + 1,
            bad.loglik
        )));
    }
    let correct: Vec<bool> = scores.iter().map(|s| s.pred == s.gold).collect();
    let correct_norm: Vec<bool> = scores.iter().map(|s| s.pred_norm == s.gold).collect();
    let (acc, acc_stderr) = mean_stderr(&correct);
    let (acc_norm, acc_norm_stderr) = mean_stderr(&correct_norm);
    let chance = scores
        .iter()
        .map(|s| 1.0 / s.loglik.len() as f64)
        .sum::<f64>()
        / n.max(1) as f64;
    Ok((
        TaskResult {
            task: task_name(&task.path),
            layout: task.layout.name().to_string(),
            questions: n,
            shots: opts.shots,
            acc,
            acc_stderr,
            acc_norm,
            acc_norm_stderr,
            chance,
            truncated_questions: scores.iter().filter(|s| s.truncated > 0).count(),
            seconds: started.elapsed().as_secs_f64(),
        },
        scores,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_maximum_and_never_nan() {
        assert_eq!(argmax([1.0, 3.0, 3.0].into_iter()), 1);
        assert_eq!(argmax([f64::NAN, -1.0].into_iter()), 1);
    }

    #[test]
    fn acc_and_acc_norm_pick_by_hand_checked_scores() {
        // A long right answer loses on the total but wins per byte: -12/10 > -10/2.
        assert_eq!(predictions(&[-10.0, -12.0], &[2, 10]), (0, 1));
        // Per byte: -6/3 = -2.0 vs -9/4 = -2.25 vs -4/1 = -4: the first wins both ways.
        assert_eq!(predictions(&[-6.0, -9.0, -4.0], &[3, 4, 1]), (2, 0));
        // Ties go to the first choice in both.
        assert_eq!(predictions(&[-4.0, -4.0], &[2, 2]), (0, 0));
        // Multi-byte choices divide by bytes: "é" is 2 bytes, so -3/2 beats -2/1.
        assert_eq!(predictions(&[-2.0, -3.0], &[1, "é".len()]), (0, 1));
    }

    #[test]
    fn stderr_is_the_sample_std_over_sqrt_n() {
        // 3 of 4: mean 0.75, sample variance (3 * 0.0625 + 0.5625) / 3 = 0.25.
        let (m, se) = mean_stderr(&[true, true, false, true]);
        assert_eq!(m, 0.75);
        assert!((se - (0.25f64 / 4.0).sqrt()).abs() < 1e-15);
        assert!(mean_stderr(&[true]).1.is_nan());
    }

    #[test]
    fn task_names_drop_the_extensions() {
        assert_eq!(task_name(std::path::Path::new("a/b/hs.jsonl.gz")), "hs");
        assert_eq!(task_name(std::path::Path::new("arc.parquet")), "arc");
    }
}
