//! Multiple-choice evaluation by log-likelihood, the lm-evaluation-harness way.
//!
//! Each choice is scored as the summed log-probability of its continuation tokens given the
//! context. The split into tokens is the harness's `_encode_pair`: the context's trailing
//! whitespace moves to the continuation, the whole text `context + continuation` is encoded,
//! and the continuation's tokens are the whole's tokens after as many as the context alone
//! encodes to. (An empty context is the document separator alone.) `acc` counts questions whose
//! highest log-likelihood is the right choice; `acc_norm` divides each log-likelihood by the
//! choice's length in characters first (the harness's `len(choice)`, Unicode code points) and
//! `acc_bytes` by its length in UTF-8 bytes (the harness's `acc_bytes`); the two differ only
//! on non-ASCII choices. Ties go to the first choice, as `numpy.argmax` does. Standard errors
//! are the harness's: the sample standard deviation over questions divided by `sqrt(n)`.
//!
//! The context is computed once per question: one forward fills a KV cache with the contexts
//! (but their last tokens) of up to `TaskOptions::batch` questions (32 by default; padded on the
//! right, so each starts at position 0), and for each context length in turn the questions of
//! that length take their cache rows, cut to that length, once per choice; one forward then
//! scores every choice's tokens after its context's last token. A question's log-likelihoods are
//! then the same bits at any `--batch-questions` (issue 40, L1; dense models). A context too
//! long for `max_position_embeddings` together with the longest continuation loses its oldest
//! tokens,
//! as the harness's left truncation does.

mod loglik;

use burn::tensor::Device;
use qwen_burn_data::{McTask, Tok};
use qwen_burn_model::Qwen3ForCausalLM;
use serde::Serialize;

use crate::error::{Result, TrainError};

pub use loglik::{
    DEFAULT_BATCH, EncodedQuestion, TaskOptions, check_task, choice_logliks, encode_question,
};
use loglik::{MAX_LOGITS, fitted, group_logliks};

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
    /// Characters (code points) of each choice (the `acc_norm` divisor).
    pub choice_chars: Vec<usize>,
    /// UTF-8 bytes of each choice (the `acc_bytes` divisor).
    pub choice_bytes: Vec<usize>,
    /// The right choice.
    pub gold: usize,
    /// The choice with the highest log-likelihood.
    pub pred: usize,
    /// The choice with the highest log-likelihood per character.
    pub pred_norm: usize,
    /// The choice with the highest log-likelihood per byte.
    pub pred_bytes: usize,
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

/// The choice `acc` picks (highest log-likelihood) and the one a length-normalised accuracy
/// picks (highest log-likelihood per unit of `lengths`: characters for `acc_norm`, bytes for
/// `acc_bytes`; an empty choice keeps its plain score).
pub fn predictions(loglik: &[f64], lengths: &[usize]) -> (usize, usize) {
    let pred = argmax(loglik.iter().copied());
    let pred_norm = argmax(
        loglik
            .iter()
            .zip(lengths)
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
    /// Accuracy with log-likelihoods per character of the choice.
    pub acc_norm: f64,
    /// Its standard error.
    pub acc_norm_stderr: f64,
    /// Accuracy with log-likelihoods per UTF-8 byte of the choice.
    pub acc_bytes: f64,
    /// Its standard error.
    pub acc_bytes_stderr: f64,
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
    let (max_len, vocab) = (
        model.config.max_position_embeddings,
        model.config.vocab_size,
    );
    let mut index = 0;
    while index < n {
        // A group: as many of the next questions as keep the padded contexts plus the longest
        // choice within the model's positions, and the choices' logits within MAX_LOGITS.
        let mut group: Vec<(usize, EncodedQuestion)> = Vec::new();
        let (mut width, mut longest, mut choices) = (0, 0, 0);
        while index < n && group.len() < opts.batch.max(1) {
            let item = &task.items[index];
            let context = task.context(index, opts.shots, opts.seed)?;
            let encoded = encode_question(tok, &context, &item.choices)?;
            let own_longest = encoded.continuation_ids.iter().map(Vec::len).max();
            let own_longest = own_longest.unwrap_or(0);
            let own_width = fitted(model, &encoded.context_ids, &encoded.continuation_ids)
                .map_err(|e| {
                    TrainError::Other(format!(
                        "{}: question {}: {e}",
                        task.path.display(),
                        index + 1
                    ))
                })?
                .len();
            let w = width.max(own_width);
            let l = longest.max(own_longest);
            let c = choices + encoded.continuation_ids.len();
            if !group.is_empty() && (w + l > max_len || c * l * vocab > MAX_LOGITS) {
                break;
            }
            if group.is_empty() && c * l * vocab > MAX_LOGITS {
                // One question alone over the usual bound: scored if the machine holds it.
                model
                    .config
                    .forward_estimate(c, l, "its choices x its longest choice")
                    .check(&format!(
                        "{}: question {}'s forward",
                        task.path.display(),
                        index + 1
                    ))?;
            }
            (width, longest, choices) = (w, l, c);
            group.push((index, encoded));
            index += 1;
        }
        let questions: Vec<(&[u32], &[Vec<u32>])> = group
            .iter()
            .map(|(_, e)| (e.context_ids.as_slice(), e.continuation_ids.as_slice()))
            .collect();
        let results = group_logliks(model, &questions, device).map_err(|e| {
            let (first, last) = (group[0].0 + 1, group[group.len() - 1].0 + 1);
            TrainError::Other(format!(
                "{}: questions {first}-{last}: {e}",
                task.path.display()
            ))
        })?;
        for ((q, encoded), (loglik, truncated)) in group.into_iter().zip(results) {
            let item = &task.items[q];
            let choice_chars: Vec<usize> = item.choices.iter().map(|c| c.chars().count()).collect();
            let choice_bytes: Vec<usize> = item.choices.iter().map(String::len).collect();
            let (pred, pred_norm) = predictions(&loglik, &choice_chars);
            let (_, pred_bytes) = predictions(&loglik, &choice_bytes);
            scores.push(QuestionScore {
                index: q,
                encoded,
                loglik,
                choice_chars,
                choice_bytes,
                gold: item.gold,
                pred,
                pred_norm,
                pred_bytes,
                truncated,
            });
        }
        progress(index);
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
    let correct_bytes: Vec<bool> = scores.iter().map(|s| s.pred_bytes == s.gold).collect();
    let (acc, acc_stderr) = mean_stderr(&correct);
    let (acc_norm, acc_norm_stderr) = mean_stderr(&correct_norm);
    let (acc_bytes, acc_bytes_stderr) = mean_stderr(&correct_bytes);
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
            acc_bytes,
            acc_bytes_stderr,
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
        // "é" is 1 character but 2 bytes: per character -2/1 beats -3/1, per byte -3/2 beats -2/1.
        assert_eq!(
            predictions(&[-2.0, -3.0], &[1, "é".chars().count()]),
            (0, 0)
        );
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
