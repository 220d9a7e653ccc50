//! Fuzz cases of tokenizer.json and tokenizer_config.json (chat templates).

use super::*;

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
