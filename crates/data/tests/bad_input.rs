//! Every bad input of issue 3 item 6 fails with a message naming the file, line or field.

mod common;

use common::*;
use qwen_burn_data::{
    ChatOptions, PrepareOptions, SampleMode, SftDataset, Split, TokenStore, TrainBpeOptions,
    WindowSampler, prepare, train_bpe,
};

fn prepare_err(opts: &PrepareOptions) -> String {
    prepare(opts).unwrap_err().to_string()
}

#[test]
fn missing_input_path_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "a.txt", b"some text");
    let missing = dir.path().join("nope/corpus.txt");
    let msg = prepare_err(&prep_opts(
        vec![good, missing.clone()],
        &dir.path().join("out"),
    ));
    assert_eq!(
        msg,
        format!("input path {} does not exist", missing.display())
    );
    let opts = TrainBpeOptions {
        inputs: vec![missing.clone()],
        ..TrainBpeOptions::default()
    };
    let msg = train_bpe(&opts, &dir.path().join("t.json"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        format!("input path {} does not exist", missing.display())
    );
    let tok_missing = PrepareOptions {
        tokenizer: dir.path().join("no-tokenizer.json"),
        ..prep_opts(vec![dir.path().join("a.txt")], &dir.path().join("out"))
    };
    assert!(prepare_err(&tok_missing).contains("no-tokenizer.json does not exist"));
}

#[test]
fn empty_corpus_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty_dir = dir.path().join("empty");
    write(&empty_dir, "notes.md", b"not a corpus file");
    let msg = prepare_err(&prep_opts(vec![empty_dir.clone()], &dir.path().join("o1")));
    assert_eq!(
        msg,
        format!(
            "empty corpus: no .txt/.jsonl(.gz)/.parquet files found (inputs: {})",
            empty_dir.display()
        )
    );
    let blank = write(dir.path(), "blank.txt", b"  \n\n");
    let blank_jsonl = write(dir.path(), "blank.jsonl", b"{\"text\": \"\"}\n\n");
    let msg = prepare_err(&prep_opts(
        vec![blank.clone(), blank_jsonl],
        &dir.path().join("o2"),
    ));
    assert!(
        msg.starts_with("empty corpus: 2 files but no non-empty documents (inputs: "),
        "{msg}"
    );
    assert!(msg.contains("blank.txt"), "{msg}");
}

#[test]
fn invalid_utf8_names_file_byte_offset_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(dir.path(), "bad.txt", b"hello\nwor\xffld\n");
    let msg = prepare_err(&prep_opts(vec![bad.clone()], &dir.path().join("o")));
    assert_eq!(
        msg,
        format!(
            "{}: invalid UTF-8 at byte offset 9 (line 2); the corpus must be UTF-8 text",
            bad.display()
        )
    );
    // In a .gz file the offset is in the decompressed stream, and says so.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, b"ok\nok\n\xc3(").unwrap();
    let gz = write(dir.path(), "bad.txt.gz", &enc.finish().unwrap());
    let msg = prepare_err(&prep_opts(vec![gz.clone()], &dir.path().join("o2")));
    assert!(
        msg.starts_with(&format!(
            "{}: invalid UTF-8 at byte offset 6 (line 3, of the decompressed stream)",
            gz.display()
        )),
        "{msg}"
    );
}

#[test]
fn jsonl_line_without_text_field_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let lines = b"{\"text\": \"one\"}\n\n{\"body\": \"two\", \"id\": 2}\n";
    let path = write(dir.path(), "docs.jsonl", lines);
    let msg = prepare_err(&prep_opts(vec![path.clone()], &dir.path().join("o")));
    assert_eq!(
        msg,
        format!(
            "{}:3: missing text field \"text\" (the line has fields [\"body\", \"id\"]; choose the field with --text-field)",
            path.display()
        )
    );
    let wrong_type = write(dir.path(), "num.jsonl", b"{\"text\": 5}\n");
    let msg = prepare_err(&prep_opts(vec![wrong_type.clone()], &dir.path().join("o2")));
    assert_eq!(
        msg,
        format!(
            "{}:1: text field \"text\" is a number, expected a string",
            wrong_type.display()
        )
    );
    let broken = write(
        dir.path(),
        "broken.jsonl",
        b"{\"text\": \"a\"}\n{\"text\": \n",
    );
    let msg = prepare_err(&prep_opts(vec![broken.clone()], &dir.path().join("o3")));
    assert!(
        msg.starts_with(&format!("{}:2: invalid JSON: ", broken.display())),
        "{msg}"
    );
}

#[test]
fn corpus_shorter_than_one_window_names_split_dir_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "tiny.txt", b"To be, or not to be.");
    let out = dir.path().join("tiny");
    prepare(&prep_opts(vec![input], &out)).unwrap();
    let store = TokenStore::open(&out, Split::Train, None).unwrap();
    let n = store.len();
    let msg = WindowSampler::for_store(&store, 4, 256, SampleMode::Random, 0)
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        format!(
            "corpus of {n} tokens (train split of {}) is shorter than one window of 257 tokens (seq_len 256 + 1); use a shorter seq_len or more data",
            out.display()
        )
    );
}

#[test]
fn shards_from_another_tokenizer_are_refused_naming_both_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "a.txt", prose(2).as_bytes());
    let out = dir.path().join("shards");
    prepare(&prep_opts(vec![input], &out)).unwrap();
    let configured = qwen().hash();
    let msg = TokenStore::open(&out, Split::Train, Some(&configured))
        .unwrap_err()
        .to_string();
    let made_with = default_tok().hash();
    assert_eq!(
        msg,
        format!(
            "token shards in {d} were prepared with tokenizer sha256 {made_with}, but the configured tokenizer has sha256 {configured}; re-run `qwen-burn data prepare --out {d}` with the configured tokenizer",
            d = out.display()
        )
    );
    let msg = TokenStore::open(&dir.path().join("nothing"), Split::Train, None)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("meta.json: no token shards here; prepare them with `qwen-burn data prepare"),
        "{msg}"
    );
}

#[test]
fn corrupt_shard_and_bad_tokenizer_file_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "a.txt", prose(2).as_bytes());
    let out = dir.path().join("shards");
    prepare(&prep_opts(vec![input], &out)).unwrap();
    let shard = out.join("train-00000.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes.truncate(bytes.len() - 2);
    std::fs::write(&shard, bytes).unwrap();
    let msg = TokenStore::open(&out, Split::Train, None)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with(&format!("corrupt token shard {}: file is", shard.display())),
        "{msg}"
    );

    let bad_tok = write(dir.path(), "tokenizer.json", b"{\"not\": \"a tokenizer\"}");
    let opts = PrepareOptions {
        tokenizer: bad_tok.clone(),
        ..prep_opts(vec![dir.path().join("a.txt")], &out)
    };
    assert!(
        prepare_err(&opts).starts_with(&format!("cannot load tokenizer {}: ", bad_tok.display()))
    );
}

#[test]
fn bad_options_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "a.txt", b"text");
    let opts = PrepareOptions {
        val_fraction: 1.0,
        ..prep_opts(vec![input.clone()], dir.path())
    };
    assert_eq!(
        prepare_err(&opts),
        "invalid val_fraction: 1 is outside [0, 1)"
    );
    let opts = TrainBpeOptions {
        inputs: vec![input],
        vocab_size: 100,
        ..TrainBpeOptions::default()
    };
    let msg = train_bpe(&opts, &dir.path().join("t.json"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("invalid vocab_size: 100 is too small: need at least 260"),
        "{msg}"
    );
}

#[test]
fn bad_chat_lines_name_line_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let tok = default_tok();
    let opts = ChatOptions::default();
    let cases: [(&[u8], &str); 6] = [
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n{\"answer\": \"x\"}\n",
         "2: no \"messages\" or \"conversations\" (a conversation), \"prompt\" and \"completion\", or \"text\" field"),
        (b"{\"messages\": [{\"role\": \"narrator\", \"content\": \"x\"}]}\n",
         "1: messages[0].role is \"narrator\", an unknown role (expected system, user, assistant or tool)"),
        (b"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"robot\", \"value\": \"b\"}]}\n",
         "1: conversations[1].from is \"robot\", an unknown role"),
        (b"{\"messages\": [{\"role\": \"user\"}]}\n", "1: messages[0] has no string field \"content\""),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": 3}]}\n", "1: messages[0].content is a number, expected a string"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"no answer\"}]}\n", "none of 1 examples has a token to train on"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = write(dir.path(), &format!("c{i}.jsonl"), text);
        let msg = SftDataset::load(&path, &tok, &opts)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(want), "{msg}\nwanted: {want}");
    }
    // A tokenizer without the chat markers is refused by name.
    let gpt2 = qwen_burn_data::Tok::from_file(&gpt2_path()).unwrap();
    let path = write(
        dir.path(),
        "ok.jsonl",
        b"{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}\n",
    );
    let msg = SftDataset::load(&path, &gpt2, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("has no \"<|im_end|>\" token, needed by the Qwen chat template"),
        "{msg}"
    );
}
