//! `qwen-burn batches`: the training batches of a run config, in the order `train` consumes
//! them (the cross-framework check in `experiments/002-*`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use qwen_burn_train::config::ModelSource;

use super::ConfigArgs;
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
    let mut data = DataPipeline::new(&config, None, vocab)?;
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for step in 1..=args.steps {
        for _ in 0..config.training.grad_accum {
            let (batch, _) = data.next_batch()?;
            let rows = |flat: Vec<serde_json::Value>| -> Vec<Vec<serde_json::Value>> {
                flat.chunks(batch.seq_len).map(<[_]>::to_vec).collect()
            };
            let record = serde_json::json!({
                "step": step,
                "inputs": rows(batch.inputs.iter().map(|&x| x.into()).collect()),
                "targets": rows(batch.targets.iter().map(|&x| x.into()).collect()),
                "attention_mask": batch.attention_mask.as_ref().map(|m| rows(m.iter().map(|&x| x.into()).collect())),
                "positions": batch.positions.as_ref().map(|p| rows(p.iter().map(|&x| x.into()).collect())),
                "document_starts": batch.positions.as_ref().map(|_| {
                    (0..batch.batch_size).map(|r| batch.document_starts(r)).collect::<Vec<_>>()
                }),
            });
            writeln!(out, "{record}").context("writing batches")?;
        }
    }
    out.flush().context("writing batches")?;
    println!(
        "wrote {} steps of batches to {}",
        args.steps,
        args.out.display()
    );
    Ok(())
}
