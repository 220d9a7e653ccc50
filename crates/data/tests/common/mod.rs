//! Paths and small helpers shared by the integration tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use qwen_burn_data::{PrepareOptions, Tok};

/// The vendored test tokenizers (see `tests/fixtures/tokenizers/PROVENANCE.md`).
pub fn fixture_tokenizers() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers")
}

/// The project's `datasets/` folder.
pub fn datasets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets")
}

pub fn qwen_path() -> PathBuf {
    fixture_tokenizers().join("qwen3/tokenizer.json.gz")
}

pub fn gpt2_path() -> PathBuf {
    fixture_tokenizers().join("gpt2/tokenizer.json.gz")
}

pub fn default_tok_path() -> PathBuf {
    datasets().join("tokenizer.json")
}

pub fn qwen() -> Tok {
    Tok::from_file(&qwen_path()).expect("qwen3 tokenizer loads")
}

pub fn default_tok() -> Tok {
    Tok::from_file(&default_tok_path()).expect("default tokenizer loads")
}

/// Writes `bytes` to `dir/name` (creating parent folders) and returns the path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Writes `text` gzip-compressed to `dir/name`.
pub fn write_gz(dir: &Path, name: &str, text: &str) -> PathBuf {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).unwrap();
    write(dir, name, &enc.finish().unwrap())
}

/// Prepare options with the default tokenizer, no validation split, no progress bar.
pub fn prep_opts(inputs: Vec<PathBuf>, out: &Path) -> PrepareOptions {
    PrepareOptions {
        inputs,
        tokenizer: default_tok_path(),
        out: out.to_path_buf(),
        val_fraction: 0.0,
        text_field: "text".into(),
        threads: Some(2),
        progress: false,
    }
}

/// Some prose with repetition, enough for small BPE training and a few windows.
pub fn prose(paragraphs: usize) -> String {
    let base = "It is a truth universally acknowledged, that a single man in possession of a \
                good fortune, must be in want of a wife.\nHowever little known the feelings or \
                views of such a man may be on his first entering a neighbourhood, this truth \
                is so well fixed in the minds of the surrounding families.\n";
    (0..paragraphs)
        .map(|i| format!("Chapter {i}\n{base}\n"))
        .collect()
}
