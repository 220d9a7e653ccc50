//! Tokenizer loading, the Qwen3 reference ids, BPE training and parallel-chunking neutrality.

mod common;

use common::*;
use qwen_burn_data::ingest::chunk_text;
use qwen_burn_data::{Tok, TrainBpeOptions, train_bpe};

#[test]
fn qwen3_encodes_hello_world_to_reference_ids_and_back() {
    let tok = qwen();
    let ids = tok.encode("Hello world!").unwrap();
    assert_eq!(ids, vec![9707, 1879, 0]);
    assert_eq!(tok.decode(&ids).unwrap(), "Hello world!");
    assert_eq!(tok.eos_id(), Some(151643));
    assert_eq!(tok.token_id("<|im_start|>"), Some(151644));
    // Qwen3's generation_config.json stops on both.
    assert_eq!(tok.stop_ids(), vec![151643, 151645]);
    assert_eq!(tok.vocab_size(), 151669);
    // PROVENANCE.md records this hash of the file.
    assert_eq!(
        tok.hash(),
        "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
    );
    // Special tokens written in text are recognised, and decoding keeps them.
    let chat = "<|im_start|>user\nHi<|im_end|>\n";
    let ids = tok.encode(chat).unwrap();
    assert_eq!(ids[0], 151644);
    assert_eq!(tok.decode(&ids).unwrap(), chat);
}

#[test]
fn gpt2_loads_with_endoftext() {
    let tok = Tok::from_file(&gpt2_path()).unwrap();
    assert_eq!(tok.eos_id(), Some(50256));
    assert_eq!(tok.stop_ids(), vec![50256]);
    assert_eq!(tok.vocab_size(), 50257);
    let text = "The quick brown fox.";
    assert_eq!(tok.decode(&tok.encode(text).unwrap()).unwrap(), text);
}

#[test]
fn default_tokenizer_has_specials_first_and_round_trips() {
    let tok = default_tok();
    assert_eq!(tok.vocab_size(), 8192);
    assert_eq!(tok.eos_id(), Some(0));
    assert_eq!(tok.token_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    let text = "Mr. Darcy's pride, and Elizabeth's prejudice!\n\n  To be, or not to be: that \
                is the question. Naïve café, 東京 🙂";
    let ids = tok.encode(text).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // Trained on the corpus: common words are single tokens.
    assert_eq!(tok.encode(" Elizabeth").unwrap().len(), 1);
    assert!(
        ids.len() < text.len() / 2,
        "{} ids for {} bytes",
        ids.len(),
        text.len()
    );
}

#[test]
fn trains_small_bpe_with_custom_specials_from_text_and_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let txt = write(dir.path(), "a/prose.txt", prose(30).as_bytes());
    let lines: String = (0..20)
        .map(|i| format!("{{\"body\": \"line {i}: the single man of good fortune\"}}\n"))
        .collect();
    let jsonl = write_gz(dir.path(), "b/lines.jsonl.gz", &lines);
    let out = dir.path().join("tok/tokenizer.json");
    let opts = TrainBpeOptions {
        inputs: vec![txt, jsonl],
        vocab_size: 400,
        special_tokens: vec!["<|endoftext|>".into(), "<pad>".into()],
        min_frequency: 2,
        text_field: "body".into(),
    };
    let tok = train_bpe(&opts, &out).unwrap();
    assert!(out.exists());
    assert_eq!(tok.vocab_size(), 400);
    assert_eq!(tok.token_id("<|endoftext|>"), Some(0));
    assert_eq!(tok.token_id("<pad>"), Some(1));
    assert_eq!(tok.token_id("<|im_start|>"), None);
    for text in [
        "a single man in possession of a good fortune",
        "unseen words: zebra quixotic 42 ünïcödé",
        "<pad>the end<|endoftext|>",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    // Words seen often are merged into one token.
    assert_eq!(tok.encode(" fortune").unwrap().len(), 1);
    // Loading the written file gives the same tokenizer.
    let again = Tok::from_file(&out).unwrap();
    assert_eq!(again.hash(), tok.hash());
}

/// Tokenising pieces cut by `chunk_text` and concatenating equals tokenising the whole text,
/// for every byte-level tokenizer we use; `prepare` relies on it for parallelism.
#[test]
fn chunked_tokenisation_equals_whole_text() {
    let texts: Vec<String> = ["austen/austen_emma.txt.gz", "shakespeare/hamlet_gut.txt.gz"]
        .iter()
        .map(|p| qwen_burn_data::ingest::read_text_file(&datasets().join(p)).unwrap())
        .collect();
    let toks = [qwen(), Tok::from_file(&gpt2_path()).unwrap(), default_tok()];
    for tok in &toks {
        for text in &texts {
            let whole = tok.encode(text).unwrap();
            let pieces = chunk_text(text, 4096);
            assert!(pieces.len() > 20);
            let chunked: Vec<u32> = pieces.iter().flat_map(|p| tok.encode(p).unwrap()).collect();
            assert_eq!(chunked, whole, "tokenizer {}", tok.path().display());
        }
    }
}

/// Bits per byte divides by the bytes each token stands for: over any text, the bytes of its
/// tokens add up to the text's UTF-8 length, multi-byte characters split across tokens
/// included; special tokens stand for none.
#[test]
fn token_bytes_add_up_to_the_text_length() {
    let texts = [
        "Hello world! It is a truth universally acknowledged.\n\n  Tabs\tand spaces ",
        "café – naïve façade; 日本語のテキスト, 🙂🚀 and Ελληνικά",
        "<think>\nreasoning\n</think>\n\nanswer",
    ];
    for tok in [qwen(), default_tok(), Tok::from_file(&gpt2_path()).unwrap()] {
        let bytes = tok.token_bytes();
        assert_eq!(bytes.len(), tok.vocab_size());
        for text in texts {
            let ids = tok.encode(text).unwrap();
            let total: u64 = ids.iter().map(|&i| u64::from(bytes[i as usize])).sum();
            assert_eq!(
                total,
                text.len() as u64,
                "{}: {text:?}",
                tok.path().display()
            );
        }
        let eos = tok.eos_id().unwrap();
        assert_eq!(bytes[eos as usize], 0, "a special token stands for no text");
    }
    // Qwen3's `<think>` is an added token that is not special: it is its literal text.
    let qwen = qwen();
    let think = qwen.token_id("<think>").unwrap();
    assert_eq!(qwen.token_bytes()[think as usize], 7);
    assert_eq!(
        qwen.token_bytes()[qwen.token_id("<|im_start|>").unwrap() as usize],
        0
    );
}
