//! `qwen-burn batches`: the training batches of a run config, in the order `train` consumes
//! them (the cross-framework check in `experiments/002-*`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use qwen_burn_train::config::ModelSource;

use super::ConfigArgs;
use qwen_burn_data::Batch;
use qwen_burn_train::run::data::DataPipeline;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArgs,
    /// Optimizer steps to dump (each has training.grad_accum micro-batches).
    #[arg(long)]
    steps: usize,
    /// Output JSONL: one line per micro-batch with `step`, `inputs` and `targets` ([B, T] rows),
    /// the padding `attention_mask`, and for packed rows with the document mask `positions`
    /// (each input's position in its document, [B, T]) and `document_starts` (per row).
    #[arg(long)]
    out: PathBuf,
}

/// Dump the training batches of the first `steps` steps, exactly as `train` consumes them.
pub fn run(args: Args) -> Result<()> {
    let config = args.config.load(&[])?;
    let vocab = match &config.model {
        ModelSource::Scratch(c) => c.vocab_size,
        ModelSource::Pretrained(dir) => {
            qwen_burn_model::Qwen3Config::from_file(&dir.join("config.json"))?.vocab_size
        }
    };
    // Everything the config reads, so that --out never replaces one of them.
    let mut inputs: Vec<&Path> = vec![
        args.config.config.as_path(),
        config.data.tokenizer.as_path(),
    ];
    inputs.extend(config.data.inputs.iter().map(PathBuf::as_path));
    inputs.extend(config.data.val_inputs.iter().map(PathBuf::as_path));
    inputs.extend(config.data.cache_dir.as_deref());
    if let ModelSource::Pretrained(dir) = &config.model {
        inputs.push(dir.as_path());
    }
    super::outputs::check_file_out("--out", &args.out, &inputs)?;
    let mut data = DataPipeline::new(&config, None, vocab)?;
    super::outputs::write_atomic(&args.out, |out| {
        for step in 1..=args.steps {
            for _ in 0..config.training.grad_accum {
                let (batch, _) = data.next_batch()?;
                writeln!(out, "{}", record(step, &batch)).context("writing batches")?;
            }
        }
        Ok(())
    })?;
    println!(
        "wrote {} steps of batches to {}",
        args.steps,
        args.out.display()
    );
    Ok(())
}

/// One micro-batch as a JSON line: its rows, padding mask and document layout.
fn record(step: usize, batch: &Batch) -> serde_json::Value {
    let rows = |flat: Vec<serde_json::Value>| -> Vec<Vec<serde_json::Value>> {
        flat.chunks(batch.seq_len).map(<[_]>::to_vec).collect()
    };
    serde_json::json!({
        "step": step,
        "inputs": rows(batch.inputs.iter().map(|&x| x.into()).collect()),
        "targets": rows(batch.targets.iter().map(|&x| x.into()).collect()),
        "attention_mask": batch.attention_mask.as_ref().map(|m| rows(m.iter().map(|&x| x.into()).collect())),
        "positions": batch.positions.as_ref().map(|p| rows(p.iter().map(|&x| x.into()).collect())),
        "document_starts": batch.positions.as_ref().map(|_| {
            (0..batch.batch_size).map(|r| batch.document_starts(r)).collect::<Vec<_>>()
        }),
    })
}
