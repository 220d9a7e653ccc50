//! Regenerates `datasets/tokenizer.json`: a byte-level BPE with 8,192 ids (`<|endoftext|>` = 0,
//! `<|im_start|>` = 1, `<|im_end|>` = 2) trained on the shipped Austen and Shakespeare texts.
//!
//! ```text
//! cargo run --release -p qwen-burn-data --example train_default_tokenizer [-- OUT]
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use qwen_burn_data::{TrainBpeOptions, train_bpe};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let datasets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
    let out = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| datasets.join("tokenizer.json"));
    let opts = TrainBpeOptions {
        inputs: vec![datasets.join("austen"), datasets.join("shakespeare")],
        vocab_size: 8192,
        min_frequency: 2,
        ..TrainBpeOptions::default()
    };
    let t0 = Instant::now();
    let tok = train_bpe(&opts, &out)?;
    println!(
        "wrote {} ({} ids, sha256 {}) in {:.1}s",
        out.display(),
        tok.vocab_size(),
        tok.hash(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
