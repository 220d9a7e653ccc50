//! The data of a preference run (`data.kind = "preference"`): pairs read and tokenised as TRL
//! does (`qwen_burn_data::preference`), sampled in seeded shuffled epochs, `training.batch_size`
//! pairs (twice as many rows) a micro-batch; validation on `data.val_inputs` or the first pairs.

use std::sync::Arc;

use qwen_burn_data::{
    Batch, ChatTemplate, Cursor, PreferenceData, Prefetcher, SftSampler, Tok, Truncation,
    completion_eos, load_preferences,
};

use crate::config::{RunConfig, TruncationMode};
use crate::error::{Result, TrainError};

/// The training and validation pairs of a run; validation pairs are numbered after the
/// training ones in `Batch::pairs`.
#[derive(Clone)]
pub struct PreferenceSets {
    /// Training pairs (ids `0..train.pairs.len()`).
    pub train: Arc<PreferenceData>,
    /// Validation pairs (ids from `train.pairs.len()`).
    pub val: Arc<PreferenceData>,
    /// Positions of a row (`training.seq_len`).
    pub seq_len: usize,
    /// The padding id.
    pub pad: u32,
}

/// The prefetcher of training batches, the validation batches and the pair sets.
pub(super) fn open(
    config: &RunConfig,
    tok: &Tok,
    template: &ChatTemplate,
    cursor: Option<&Cursor>,
) -> Result<(Prefetcher, Vec<Batch>, PreferenceSets)> {
    let d = &config.data;
    let t = &config.training;
    if d.inputs.len() != 1 {
        return Err(TrainError::config(
            "data.inputs",
            "preference data takes exactly one JSONL file",
        ));
    }
    let eos = completion_eos(tok, template)?;
    let truncation = match config.preference.truncation {
        TruncationMode::KeepStart => Truncation::KeepStart,
        TruncationMode::KeepEnd => Truncation::KeepEnd,
    };
    let max_length = Some(t.seq_len);
    let load = |path| load_preferences(path, tok, template, &eos, max_length, truncation);
    let train = Arc::new(load(&d.inputs[0])?);
    {
        let s = &train.stats;
        if s.identical + s.dropped + s.truncated > 0 {
            eprintln!(
                "note: {}: {} pairs; {} with identical completions (they teach nothing), {} \
                 dropped (prompt of {} tokens or more), {} sequences cut to {} tokens",
                d.inputs[0].display(),
                s.pairs,
                s.identical,
                s.dropped,
                t.seq_len,
                s.truncated,
                t.seq_len
            );
        }
    }
    let val = match d.val_inputs.first() {
        Some(path) => Arc::new(load(path)?),
        None => train.clone(),
    };
    let pad = tok.require_eos()?;
    let mut sampler = SftSampler::new(train.pairs.len(), t.batch_size, t.seq_len, t.seed)?
        .with_global_batch(t.batch_size * t.grad_accum)?;
    if let Some(c) = cursor {
        sampler.restore(c)?;
    }
    let first_val = train.pairs.len() as u32;
    let val_pairs = val.pairs.len().min(t.eval_batches * t.batch_size);
    let val_batches = (0..val_pairs)
        .collect::<Vec<_>>()
        .chunks(t.batch_size)
        .map(|pairs| val.batch_to_longest(pairs, t.seq_len, pad, first_val))
        .collect();
    let (data, seq_len) = (train.clone(), t.seq_len);
    let prefetcher = Prefetcher::spawn(d.prefetch, move || {
        let batch = data.batch_to_longest(&sampler.next_rows(), seq_len, pad, 0);
        (batch, sampler.cursor())
    });
    let sets = PreferenceSets {
        train,
        val,
        seq_len,
        pad,
    };
    Ok((prefetcher, val_batches, sets))
}
