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

const WORDLEVEL: &str = r#"{"version":"1.0","truncation":null,"padding":null,
"added_tokens":[{"id":0,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":{"type":"Lowercase"},"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"<|endoftext|>":0,"hello":1,"world":2,"[UNK]":3},"unk_token":"[UNK]"}}"#;

const WORDPIECE: &str = r###"{"version":"1.0",
"truncation":{"direction":"Right","max_length":8,"strategy":"LongestFirst","stride":2},
"padding":{"strategy":{"Fixed":8},"direction":"Right","pad_to_multiple_of":4,"pad_id":0,"pad_type_id":0,"pad_token":"[PAD]"},
"added_tokens":[{"id":0,"content":"[PAD]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":1,"content":"[UNK]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":2,"content":"[CLS]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":3,"content":"[SEP]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":{"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":true},
"pre_tokenizer":{"type":"BertPreTokenizer"},
"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"[CLS]","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"[SEP]","type_id":0}}],
"pair":[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],
"special_tokens":{"[CLS]":{"id":"[CLS]","ids":[2],"tokens":["[CLS]"]},"[SEP]":{"id":"[SEP]","ids":[3],"tokens":["[SEP]"]}}},
"decoder":{"type":"WordPiece","prefix":"##","cleanup":true},
"model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##","max_input_chars_per_word":100,
"vocab":{"[PAD]":0,"[UNK]":1,"[CLS]":2,"[SEP]":3,"hello":4,"world":5,"wor":6,"##ld":7,"h":8,"##e":9}}}"###;

const UNIGRAM: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Replace","pattern":{"String":" "},"content":"▁"},{"type":"Prepend","prepend":"▁"}]},
"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},
"post_processor":null,
"decoder":{"type":"Sequence","decoders":[{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0.0],["▁hello",-1.0],["▁world",-2.0],["▁",-3.0],["h",-4.0],["<0x41>",-5.0]],"byte_fallback":true}}"#;

const BPE_SMALL: &str = r#"{"version":"1.0","truncation":null,"padding":null,
"added_tokens":[{"id":5,"content":"<|im_start|>","single_word":false,"lstrip":true,"rstrip":true,"normalized":false,"special":true}],
"normalizer":{"type":"NFC"},
"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+|\\w+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},
"post_processor":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false},
"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false},
"model":{"type":"BPE","dropout":null,"unk_token":"a","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,
"vocab":{"a":0,"b":1,"ab":2,"c":3,"abc":4},"merges":[["a","b"],["ab","c"]]}}"#;

const TOKENIZER_KEYS: &[&str] = &[
    "version",
    "truncation",
    "padding",
    "added_tokens",
    "normalizer",
    "pre_tokenizer",
    "post_processor",
    "decoder",
    "model",
    "type",
    "vocab",
    "merges",
    "unk_token",
    "unk_id",
    "max_length",
    "stride",
    "pad_to_multiple_of",
    "pad_id",
    "Fixed",
    "BatchLongest",
    "id",
    "content",
    "special",
    "pattern",
    "Regex",
    "String",
    "behavior",
    "replacement",
    "prepend_scheme",
    "dropout",
    "byte_fallback",
    "BPE",
    "WordPiece",
    "WordLevel",
    "Unigram",
    "ByteLevel",
    "Metaspace",
    "Sequence",
    "Split",
    "Strip",
    "Replace",
    "TemplateProcessing",
    "RobertaProcessing",
    "single",
    "pair",
    "special_tokens",
    "max_input_chars_per_word",
    "continuing_subword_prefix",
    "end_of_word_suffix",
    "bogus",
];

/// Text that exercises added tokens, normalizers and byte fallback when a tokenizer loads.
const PROBE: &str = "Hello world <|im_start|>user\nCafé 東京 123\t\u{0}<|endoftext|>";

#[test]
fn tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    let trained = std::fs::read(trained_tokenizer(dir.path())).unwrap();
    let path = dir.path().join("tokenizer.json");
    let seeds = vec![
        trained,
        WORDLEVEL.as_bytes().to_vec(),
        WORDPIECE.as_bytes().to_vec(),
        UNIGRAM.as_bytes().to_vec(),
        BPE_SMALL.as_bytes().to_vec(),
    ];
    let dict = dictionary(seeds, TOKENIZER_KEYS);
    let tally = Tally::default();
    support::run(
        "tokenizer.json (Tok::from_file, encode, decode)",
        support::mutated(dict, support::edit().boxed()),
        &tally,
        |Bytes(input)| {
            write(&path, &input);
            let (result, peak) = support::measure(&input, || {
                let tok = Tok::from_file(&path)?;
                // Whatever loaded must also encode and decode without panicking; those errors
                // come from the tokenizers crate and are only required not to panic.
                if let Ok(ids) = tok.encode(PROBE) {
                    let _ = tok.decode(&ids);
                }
                let _ = tok.encode_with_offsets(PROBE);
                let _ = tok.decode(&[0, 1, 2, 3, u32::MAX]);
                Ok::<_, DataError>(tok.vocab_size())
            });
            tally.add(result.is_ok(), input.len(), peak);
            TOKENIZER_BOUND.check("tokenizer.json", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &path)?;
            }
            Ok(())
        },
    );
}

const TEMPLATE_SEEDS: &[&str] = &[
    include_str!("fixtures/tokenizers/qwen3/tokenizer_config.json"),
    r#"{"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "eos_token": "<|im_end|>", "bos_token": null}"#,
    r#"{"chat_template": [{"name": "default", "template": "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content | trim }} [/INST]{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% else %}{{ raise_exception('bad role ' ~ m.role) }}{% endif %}{% endfor %}"}, {"name": "tool_use", "template": "{{ messages | length }}"}], "bos_token": {"content": "<s>"}, "eos_token": {"content": "</s>"}}"#,
    r#"{"chat_template": "{%- macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}{% for m in messages %}{{ m.content.split('\n')[0].startswith('x') }}{{ loop.index }}{% endfor %}"}"#,
    r#"{"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768}"#,
];

const TEMPLATE_KEYS: &[&str] = &[
    "chat_template",
    "bos_token",
    "eos_token",
    "content",
    "name",
    "template",
    "default",
    "messages",
    "role",
    "add_generation_prompt",
    "tools",
    "bogus",
];

#[test]
fn tokenizer_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer_config.json");
    let seeds = TEMPLATE_SEEDS
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let dict = dictionary(seeds, TEMPLATE_KEYS);
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hello\nthere"),
        Message::new("assistant", "<think>\nhm\n</think>\n\nHi."),
        Message::new("user", "x"),
    ];
    let tally = Tally::default();
    support::run(
        "tokenizer_config.json (ChatTemplate::from_tokenizer_config, render)",
        support::mutated(dict, support::edit().boxed()),
        &tally,
        |Bytes(input)| {
            write(&path, &input);
            let (result, peak) = support::measure(&input, || {
                match ChatTemplate::from_tokenizer_config(&path)? {
                    Some(template) => {
                        template.render(&messages, true)?;
                        template.render(&messages[..1], false).map(Some)
                    }
                    None => Ok(None),
                }
            });
            tally.add(result.is_ok(), input.len(), peak);
            TEMPLATE_BOUND.check("tokenizer_config.json", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &path)?;
            }
            Ok(())
        },
    );
}

const JSONL_SEEDS: &[&str] = &[
    include_str!("fixtures/parquet/docs.jsonl"),
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

/// Small valid Parquet files written with the `parquet` crate: a nullable UTF8 column beside
/// an INT64 one, several row groups and pages, each codec we read, with and without dictionary
/// encoding; and the fixture written by pyarrow.
fn parquet_seeds() -> Vec<Vec<u8>> {
    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    let schema = Arc::new(
        parse_message_type(
            "message schema { optional binary text (UTF8); required int64 id; optional binary raw; }",
        )
        .unwrap(),
    );
    let docs = [
        "It is a truth universally acknowledged",
        "",
        "To be, or not to be",
        "東京 Café",
        "   ",
        "last",
    ];
    let mut seeds = Vec::new();
    for (codec, dictionary) in [
        (Compression::UNCOMPRESSED, false),
        (Compression::SNAPPY, true),
        (Compression::LZ4_RAW, false),
        (Compression::LZ4, true),
    ] {
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(codec)
                .set_dictionary_enabled(dictionary)
                .set_data_page_row_count_limit(2)
                .set_write_batch_size(2)
                .build(),
        );
        let mut buf = Vec::new();
        let mut writer = SerializedFileWriter::new(&mut buf, schema.clone(), props).unwrap();
        for group in docs.chunks(3) {
            let mut rg = writer.next_row_group().unwrap();
            let mut index = 0;
            while let Some(mut col) = rg.next_column().unwrap() {
                match index {
                    0 | 2 => {
                        // Every third cell is null.
                        let defs: Vec<i16> =
                            (0..group.len()).map(|i| i16::from(i % 3 != 1)).collect();
                        let values: Vec<ByteArray> = group
                            .iter()
                            .zip(&defs)
                            .filter(|(_, d)| **d == 1)
                            .map(|(s, _)| ByteArray::from(*s))
                            .collect();
                        col.typed::<ByteArrayType>()
                            .write_batch(&values, Some(&defs), None)
                            .unwrap();
                    }
                    _ => {
                        let ids: Vec<i64> = (0..group.len() as i64).collect();
                        col.typed::<Int64Type>()
                            .write_batch(&ids, None, None)
                            .unwrap();
                    }
                }
                col.close().unwrap();
                index += 1;
            }
            rg.close().unwrap();
        }
        writer.close().unwrap();
        seeds.push(buf);
    }
    seeds.push(include_bytes!("fixtures/parquet/docs.parquet").to_vec());
    seeds
}

#[test]
fn parquet_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    let dict = Arc::new(Dictionary {
        seeds: parquet_seeds(),
        extremes: support::JSON_EXTREMES,
        keys: Vec::new(),
    });
    let strategy = (
        support::mutated(dict, support::byte_edit().boxed()),
        prop::sample::select(vec!["text", "id", "raw", "missing"]),
    );
    let tally = Tally::default();
    support::run(
        "Parquet rows (ingest::load: ParquetDocuments::open, next_row_group)",
        strategy,
        &tally,
        |(Bytes(input), column)| {
            write(&path, &input);
            let src = SourceFile::from_path(&path);
            assert_eq!(src.kind, SourceKind::Parquet);
            let (result, peak) = support::measure(&input, || ingest::load(&src, column));
            tally.add(result.is_ok(), input.len(), peak);
            PARQUET_BOUND.check("parquet", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &path)?;
            }
            Ok(())
        },
    );
}

/// Multiple-choice task rows of every layout.
const TASK_SEEDS: &[&str] = &[
    r#"{"context": "The sky is", "choices": ["blue", "green"], "gold": 0}
{"context": "Grass is ", "choices": ["blue", "green", "red"], "gold": "1"}"#,
    r#"{"activity_label": "Baking", "ctx_a": "a man bakes.", "ctx_b": "he", "ctx": "x", "endings": ["eats [title] it.", "[header] sleeps."], "label": "1"}"#,
    r#"{"id": "q", "question": "Which?", "choices": {"text": ["a", "b", "c"], "label": ["A", "B", "C"]}, "answerKey": "C"}"#,
    r#"{"goal": "open a jar", "sol1": "twist", "sol2": "hit", "label": 0}"#,
    r#"{"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1}"#,
];
const TASK_KEYS: &[&str] = &[
    "context",
    "choices",
    "gold",
    "ctx",
    "ctx_a",
    "ctx_b",
    "endings",
    "label",
    "activity_label",
    "question",
    "answerKey",
    "text",
    "goal",
    "sol1",
    "sol2",
    "answer",
    "subject",
];

/// Task files (`read_task`, then every question's few-shot context): JSONL of every layout,
/// and Parquet (the ARC and HellaSwag fixtures, nested columns as HF `datasets` writes them).
#[test]
fn task_files() {
    let dir = tempfile::tempdir().unwrap();
    let dict = dictionary(
        TASK_SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        TASK_KEYS,
    );
    let jsonl = dir.path().join("task.jsonl");
    let tally = Tally::default();
    let read_all = |path: &Path| {
        qwen_burn_data::read_task(path).and_then(|task| {
            (0..task.items.len().min(64))
                .map(|i| task.context(i, 1.min(task.items.len() - 1), 7))
                .collect::<Result<Vec<_>, _>>()
        })
    };
    support::run(
        "task JSONL (read_task)",
        support::mutated(dict, support::edit().boxed()),
        &tally,
        |Bytes(input)| {
            write(&jsonl, &input);
            let (result, peak) = support::measure(&input, || read_all(&jsonl));
            tally.add(result.is_ok(), input.len(), peak);
            JSON_BOUND.check("task JSONL", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &jsonl)?;
            }
            Ok(())
        },
    );
    let parquet = dir.path().join("task.parquet");
    let dict = Arc::new(Dictionary {
        seeds: vec![
            include_bytes!("fixtures/tasks/arc.parquet").to_vec(),
            include_bytes!("fixtures/tasks/hellaswag.parquet").to_vec(),
        ],
        extremes: support::JSON_EXTREMES,
        keys: Vec::new(),
    });
    let tally = Tally::default();
    support::run(
        "task Parquet (read_task)",
        support::mutated(dict, support::byte_edit().boxed()),
        &tally,
        |Bytes(input)| {
            write(&parquet, &input);
            let (result, peak) = support::measure(&input, || read_all(&parquet));
            tally.add(result.is_ok(), input.len(), peak);
            PARQUET_BOUND.check("task parquet", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &parquet)?;
            }
            Ok(())
        },
    );
}

/// The minimal input the fuzz found: a `decoder` object whose key is an invalid escape makes
/// the `tokenizers` crate panic (`expect("Helper")`); it must be a load error naming the file.
#[test]
fn tokenizer_json_that_panics_the_tokenizers_crate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    let text = BPE_SMALL.replace(
        r#""decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}"#,
        r#""decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"\ud800":false}"#,
    );
    assert_ne!(text, BPE_SMALL);
    write(&path, text.as_bytes());
    let e = Tok::from_file(&path).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
}

/// The minimal input the fuzz found (seed 7) whose corrupt page makes the `parquet` crate's
/// decoder panic (slice index out of range in `bit_util`): it must be an error naming the file.
#[test]
fn parquet_page_that_panics_the_parquet_crate() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parquet/fuzz_bit_util_panic.parquet");
    let e = ingest::load(&SourceFile::from_path(&path), "text")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("corrupt Parquet data"),
        "{e}"
    );
}

/// The minimal input the fuzz found (seed 12345): truncation with `stride` 2 and `max_length`
/// 1 makes the `tokenizers` crate panic while encoding. Truncation and padding are switched
/// off at load, so the tokenizer encodes whole texts.
#[test]
fn tokenizer_json_truncation_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    let text = WORDPIECE.replace(r#""max_length":8"#, r#""max_length":1"#);
    assert_ne!(text, WORDPIECE);
    write(&path, text.as_bytes());
    let tok = Tok::from_file(&path).unwrap();
    let words = "hello world ".repeat(10);
    assert_eq!(tok.encode(&words).unwrap().len(), 20);
    assert_eq!(tok.encode_with_offsets(&words).unwrap().0.len(), 20);
}
