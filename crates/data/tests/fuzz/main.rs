//! Fuzz tests of the data crate's parsers of user files: `tokenizer.json` ([`Tok::from_file`],
//! then encoding and decoding with what loaded), `tokenizer_config.json`
//! ([`ChatTemplate::from_tokenizer_config`], then rendering a conversation), JSONL and text
//! corpora, plain and gzipped ([`ingest::load`]), chat JSONL ([`SftDataset::load`]) and Parquet
//! ([`ingest::load`], which reads row group by row group through `ParquetDocuments`), and
//! multiple-choice task files, JSONL and Parquet (`read_task`).
//!
//! Each parser runs 10,000 cases from mutated valid seeds (see the `qwen-burn-fuzz` crate) and each case
//! checks that the parser returns (no panic, no abort), that its peak allocation stays under
//! `A * input_len + B`, and that an error names the file it read.

use qwen_burn_fuzz as support;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use qwen_burn_data::ingest::{self, SourceFile, SourceKind};
use qwen_burn_data::{
    ChatOptions, ChatTemplate, DataError, Message, SftDataset, Tok, TrainBpeOptions, train_bpe,
};
use support::{Bound, Bytes, Dictionary, MIB, Tally};

#[global_allocator]
static ALLOC: support::Counting = support::Counting;

/// JSON and JSONL: a `serde_json::Value` costs tens of bytes per input byte; 64 per byte plus
/// 8 MiB admits that and rejects any allocation sized by a value rather than the input.
const JSON_BOUND: Bound = Bound {
    per_byte: 64,
    base: 8 * MIB,
};

/// `tokenizer.json`: the `tokenizers` crate compiles regexes (the byte-level split pattern,
/// the added-token matcher), a few MiB whatever the input, hence a larger constant term.
const TOKENIZER_BOUND: Bound = Bound {
    per_byte: 64,
    base: 32 * MIB,
};

/// Chat templates: the compiled template and the rendered text are a few times the input.
const TEMPLATE_BOUND: Bound = JSON_BOUND;

/// Parquet: a row group is decoded whole (its pages, then its strings). 64 bytes per file
/// byte plus 8 MiB; the length fields inside a file (page sizes, string lengths, counts) must
/// not size an allocation beyond that.
const PARQUET_BOUND: Bound = JSON_BOUND;

/// Gzip: deflate expands at most 1032:1, so a gzipped input is bounded by its decompressed
/// size, counted in its length for the bound.
const GZ_PER_DECOMPRESSED_BYTE: usize = 64;

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

/// The error names the file: its full path is in the message.
fn check_names_file(err: &DataError, path: &Path) -> Result<(), TestCaseError> {
    let message = err.to_string();
    prop_assert!(
        message.contains(&path.display().to_string()),
        "error does not name {}: {message}",
        path.display()
    );
    Ok(())
}

fn dictionary(seeds: Vec<Vec<u8>>, keys: &[&str]) -> Arc<Dictionary> {
    Arc::new(Dictionary {
        seeds,
        extremes: support::JSON_EXTREMES,
        keys: keys.iter().map(|k| k.to_string()).collect(),
    })
}

mod files;
mod tokenizers;

const JSONL_SEEDS: &[&str] = &[
    include_str!("../fixtures/parquet/docs.jsonl"),
    "{\"text\": \"one\", \"id\": 1}\n\n{\"text\": \"  \"}\n{\"text\": \"two\\nlines \\u00e9\", \"meta\": {\"a\": [1, 2]}}\n",
    "\u{feff}{\"content\": \"BOM first\"}\r\n{\"content\": \"crlf\"}\r\n",
    "Plain text, one document.\nSecond line.\n",
];

const JSONL_KEYS: &[&str] = &["text", "content", "id", "meta", ""];

/// How a corpus case is stored: the name decides the parser.
#[derive(Clone, Copy, Debug)]
enum Stored {
    Jsonl,
    JsonlGz,
    Text,
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn gunzip_len(bytes: &[u8]) -> usize {
    let mut out = Vec::new();
    let _ = std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(bytes), &mut out);
    out.len()
}

#[test]
fn jsonl_and_text() {
    let dir = tempfile::tempdir().unwrap();
    let dict = dictionary(
        JSONL_SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        JSONL_KEYS,
    );
    let strategy = (
        support::mutated(dict, support::edit().boxed()),
        prop_oneof![
            6 => Just(Stored::Jsonl),
            2 => Just(Stored::JsonlGz),
            1 => Just(Stored::Text),
        ],
        // Gzipped inputs: also corrupt the compressed stream.
        proptest::collection::vec(support::byte_edit(), 0..2),
        prop::sample::select(vec!["text", "content", ""]),
    );
    let gz_dict = Dictionary {
        seeds: vec![Vec::new()],
        extremes: support::JSON_EXTREMES,
        keys: Vec::new(),
    };
    let tally = Tally::default();
    support::run(
        "JSONL and text corpora (ingest::load)",
        strategy,
        &tally,
        |(Bytes(text), stored, gz_edits, field)| {
            let (name, bytes) = match stored {
                Stored::Jsonl => ("corpus.jsonl", text),
                Stored::Text => ("corpus.txt", text),
                Stored::JsonlGz => {
                    let mut gz = gzip(&text);
                    for e in &gz_edits {
                        gz_dict.apply(&mut gz, e);
                    }
                    ("corpus.jsonl.gz", gz)
                }
            };
            let path = dir.path().join(name);
            write(&path, &bytes);
            let src = SourceFile::from_path(&path);
            let (result, peak) = support::measure(&bytes, || ingest::load(&src, field));
            tally.add(result.is_ok(), bytes.len(), peak);
            let mut bound = JSON_BOUND;
            if src.gz {
                bound.base += GZ_PER_DECOMPRESSED_BYTE * gunzip_len(&bytes);
            }
            bound.check(name, bytes.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &path)?;
            }
            Ok(())
        },
    );
}

const CHAT_SEEDS: &[&str] = &[
    r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n6"}]}
"#,
    r#"{"conversations": [{"from": "human", "value": "Name a color."}, {"from": "gpt", "value": "Blue."}]}

{"conversations": [{"from": "system", "value": "x"}, {"from": "human", "value": "y"}, {"from": "gpt", "value": "z"}], "id": 7}
"#,
    r#"{"messages": [{"role": "user", "content": "only a question"}]}
{"messages": [{"role": "assistant", "content": "a reply with no question, and <|im_end|> inside"}]}
"#,
    r#"{"prompt": "The capital of France is", "completion": " Paris."}
{"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hello."}]}
{"text": "Now is the winter of our discontent<|endoftext|>"}
"#,
    r#"{"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hello."}], "chat_template_kwargs": {"enable_thinking": false}}
{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes."}], "chat_template_kwargs": {"enable_thinking": true}}
"#,
];

const CHAT_KEYS: &[&str] = &[
    "messages",
    "conversations",
    "role",
    "content",
    "from",
    "value",
    "system",
    "user",
    "assistant",
    "human",
    "gpt",
    "tool",
    "prompt",
    "completion",
    "text",
    "chat_template_kwargs",
    "enable_thinking",
    "",
];

#[test]
fn chat_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let tok = Tok::from_file(&trained_tokenizer(dir.path())).unwrap();
    let template_path = dir.path().join("tokenizer_config.json");
    write(&template_path, TEMPLATE_SEEDS[0].as_bytes());
    let qwen_template = Arc::new(
        ChatTemplate::from_tokenizer_config(&template_path)
            .unwrap()
            .unwrap(),
    );
    let path = dir.path().join("chat.jsonl");
    let dict = dictionary(
        CHAT_SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        CHAT_KEYS,
    );
    let strategy = (
        support::mutated(dict, support::edit().boxed()),
        prop::sample::select(vec![1usize, 4, 32, 512]),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    );
    let tally = Tally::default();
    support::run(
        "chat JSONL (SftDataset::load)",
        strategy,
        &tally,
        |(Bytes(input), seq_len, pack, system, qwen)| {
            write(&path, &input);
            let opts = ChatOptions {
                seq_len,
                pack,
                document_mask: true,
                packing: qwen_burn_data::Packing::default(),
                system_prompt: system.then(|| "You are helpful.".to_string()),
                template: qwen.then(|| qwen_template.clone()),
            };
            let (result, peak) = support::measure(&input, || {
                SftDataset::load(&path, &tok, &opts).map(|ds| ds.len())
            });
            tally.add(result.is_ok(), input.len(), peak);
            JSON_BOUND.check("chat JSONL", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &path)?;
            }
            Ok(())
        },
    );
}

/// A byte-level BPE of 300 tokens trained by [`train_bpe`] (Qwen's pipeline) on a few lines.
fn trained_tokenizer(dir: &Path) -> std::path::PathBuf {
    let corpus = dir.join("corpus.txt");
    let text = "It is a truth universally acknowledged, that a single man in possession of a \
                good fortune, must be in want of a wife.\nTo be, or not to be: that is the \
                question.\nCafé, naïve, 東京 123 456.\n"
        .repeat(20);
    write(&corpus, text.as_bytes());
    let out = dir.join("trained/tokenizer.json");
    train_bpe(
        &TrainBpeOptions {
            inputs: vec![corpus],
            vocab_size: 300,
            min_frequency: 1,
            ..TrainBpeOptions::default()
        },
        &out,
    )
    .unwrap();
    out
}

const TEMPLATE_SEEDS: &[&str] = &[
    include_str!("../fixtures/tokenizers/qwen3/tokenizer_config.json"),
    r#"{"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "eos_token": "<|im_end|>", "bos_token": null}"#,
    r#"{"chat_template": [{"name": "default", "template": "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content | trim }} [/INST]{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% else %}{{ raise_exception('bad role ' ~ m.role) }}{% endif %}{% endfor %}"}, {"name": "tool_use", "template": "{{ messages | length }}"}], "bos_token": {"content": "<s>"}, "eos_token": {"content": "</s>"}}"#,
    r#"{"chat_template": "{%- macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}{% for m in messages %}{{ m.content.split('\n')[0].startswith('x') }}{{ loop.index }}{% endfor %}"}"#,
    r#"{"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768}"#,
];
