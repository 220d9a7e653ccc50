//! `prepare` and `TokenStore`: stream contents, idempotence, dtype choice, multi-shard reads,
//! directory walking and the shipped corpus.

mod common;

use common::*;
use qwen_burn_data::{PrepareOptions, Split, TokenStore, prepare, prepare_with_shard_size};

#[test]
fn stream_is_documents_separated_by_eos_and_val_is_each_sources_tail() {
    let dir = tempfile::tempdir().unwrap();
    let a = prose(3);
    let jsonl = "{\"text\": \"First line document.\"}\n\n{\"text\": \"Second, with \\u00e9.\"}\n";
    let pa = write(dir.path(), "in/a.txt", a.as_bytes());
    let pb = write_gz(dir.path(), "in/b.jsonl.gz", jsonl);
    let out = dir.path().join("shards");
    let tok = default_tok();
    let meta = prepare(&prep_opts(vec![pa.clone(), pb.clone()], &out)).unwrap();

    let mut want = tok.encode(&a).unwrap();
    want.push(0);
    want.extend(tok.encode("First line document.").unwrap());
    want.push(0);
    want.extend(tok.encode("Second, with é.").unwrap());
    want.push(0);
    let store = TokenStore::open(&out, Split::Train, Some(&tok.hash())).unwrap();
    assert_eq!(store.read_vec(0, store.len()), want);
    assert_eq!(meta.train.documents, 3);
    assert_eq!(meta.sources.len(), 2);
    assert_eq!(meta.sources[1].documents, 2);
    assert_eq!(meta.eos_id, 0);
    assert_eq!(
        meta.sources.iter().map(|s| s.tokens).sum::<u64>(),
        want.len() as u64
    );

    // With a validation split, each source's tail goes to val.
    let out2 = dir.path().join("shards-val");
    let opts = PrepareOptions {
        val_fraction: 0.25,
        ..prep_opts(vec![pa], &out2)
    };
    let meta = prepare(&opts).unwrap();
    let mut full = tok.encode(&a).unwrap();
    full.push(0);
    let n_val = (full.len() as f64 * 0.25).round() as usize;
    let train = TokenStore::open(&out2, Split::Train, None).unwrap();
    let val = TokenStore::open(&out2, Split::Val, None).unwrap();
    assert_eq!(val.len(), n_val);
    assert_eq!(train.read_vec(0, train.len()), full[..full.len() - n_val]);
    assert_eq!(val.read_vec(0, val.len()), full[full.len() - n_val..]);
    assert_eq!((meta.train.documents, meta.val.documents), (1, 1));
}

#[test]
fn second_prepare_on_unchanged_inputs_does_no_work() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "in/a.txt", prose(20).as_bytes());
    let out = dir.path().join("shards");
    let opts = prep_opts(vec![dir.path().join("in")], &out);
    let first = prepare(&opts).unwrap();
    assert!(!first.reused);
    let meta_path = out.join("meta.json");
    let shard_path = out.join("train-00000.bin");
    let mtimes = || {
        (
            std::fs::metadata(&meta_path).unwrap().modified().unwrap(),
            std::fs::metadata(&shard_path).unwrap().modified().unwrap(),
        )
    };
    let before = mtimes();
    std::thread::sleep(std::time::Duration::from_millis(20));

    let second = prepare(&opts).unwrap();
    assert!(second.reused);
    assert_eq!(mtimes(), before, "nothing rewritten");
    assert_eq!(second.train, first.train);

    // Same bytes, new mtime: the hash check still reuses (and records the new mtime).
    std::fs::write(&input, prose(20)).unwrap();
    let third = prepare(&opts).unwrap();
    assert!(third.reused);
    assert_eq!(
        std::fs::metadata(&shard_path).unwrap().modified().unwrap(),
        before.1
    );

    // Changed content, another tokenizer or another split: tokenised again.
    std::fs::write(&input, prose(21)).unwrap();
    let fourth = prepare(&opts).unwrap();
    assert!(!fourth.reused);
    assert!(fourth.train.tokens > first.train.tokens);
    let with_val = PrepareOptions {
        val_fraction: 0.1,
        ..opts.clone()
    };
    assert!(!prepare(&with_val).unwrap().reused);
    assert!(prepare(&with_val).unwrap().reused);
    let gpt2 = PrepareOptions {
        tokenizer: gpt2_path(),
        ..with_val
    };
    assert!(!prepare(&gpt2).unwrap().reused);
}

#[test]
fn dtype_is_u16_for_small_vocabularies_and_u32_for_qwen() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "a.txt", "Hello world! Hello again.".as_bytes());
    for (tok_path, dtype, bytes) in [
        (default_tok_path(), "u16", 2),
        (gpt2_path(), "u16", 2),
        (qwen_path(), "u32", 4),
    ] {
        let out = dir.path().join(dtype).join(bytes.to_string());
        let opts = PrepareOptions {
            tokenizer: tok_path.clone(),
            ..prep_opts(vec![input.clone()], &out)
        };
        let meta = prepare(&opts).unwrap();
        assert_eq!(meta.dtype, dtype, "{}", tok_path.display());
        let n = meta.train.tokens;
        let file_len = std::fs::metadata(out.join("train-00000.bin"))
            .unwrap()
            .len();
        assert_eq!(file_len, 32 + n * bytes);
        let tok = qwen_burn_data::Tok::from_file(&tok_path).unwrap();
        let store = TokenStore::open(&out, Split::Train, Some(&tok.hash())).unwrap();
        let ids = store.read_vec(0, store.len());
        assert_eq!(Some(ids[ids.len() - 1]), tok.eos_id());
        assert_eq!(
            tok.decode(&ids[..ids.len() - 1]).unwrap(),
            "Hello world! Hello again."
        );
    }
}

#[test]
fn reads_across_shard_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "a.txt", prose(5).as_bytes());
    let one = dir.path().join("one");
    let many = dir.path().join("many");
    prepare(&prep_opts(vec![input.clone()], &one)).unwrap();
    let meta = prepare_with_shard_size(&prep_opts(vec![input], &many), 7).unwrap();
    assert!(meta.train.shards.len() > 10);
    assert!(meta.train.shards.iter().all(|s| s.tokens <= 7));
    let a = TokenStore::open(&one, Split::Train, None).unwrap();
    let b = TokenStore::open(&many, Split::Train, None).unwrap();
    assert_eq!(a.len(), b.len());
    for (start, len) in [(0, a.len()), (3, 20), (6, 2), (13, 1), (a.len() - 9, 9)] {
        assert_eq!(
            b.read_vec(start, len),
            a.read_vec(start, len),
            "{start}+{len}"
        );
    }
}

#[test]
fn directories_are_walked_recursively_for_text_and_jsonl_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("corpus");
    write(&root, "b/deep/x.txt", b"deep text");
    write(&root, "a.txt", b"top text");
    write_gz(&root, "b/y.txt.gz", "gzipped text");
    write(&root, "b/z.jsonl", b"{\"text\": \"json text\"}\n");
    write(&root, "README.md", b"not corpus");
    write(&root, ".hidden/w.txt", b"not corpus");
    write(&root, "b/.v.txt", b"not corpus");
    let meta = prepare(&prep_opts(vec![root.clone()], &dir.path().join("out"))).unwrap();
    let names: Vec<String> = meta
        .sources
        .iter()
        .map(|s| {
            std::path::Path::new(&s.path)
                .strip_prefix(&root)
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(names, ["a.txt", "b/deep/x.txt", "b/y.txt.gz", "b/z.jsonl"]);
    assert_eq!(meta.train.documents, 4);
}

#[test]
fn shipped_corpus_prepares_into_one_document_per_work() {
    let dir = tempfile::tempdir().unwrap();
    let opts = PrepareOptions {
        val_fraction: 0.05,
        ..prep_opts(
            vec![datasets().join("austen"), datasets().join("shakespeare")],
            dir.path(),
        )
    };
    let meta = prepare(&opts).unwrap();
    assert_eq!(meta.sources.len(), 48, "6 novels + 42 plays, no .md files");
    assert_eq!(meta.sources.iter().map(|s| s.documents).sum::<u64>(), 48);
    // Each work is one document whose tail is in val, so all 48 are in both splits.
    assert_eq!((meta.train.documents, meta.val.documents), (48, 48));
    let total = meta.train.tokens + meta.val.tokens;
    assert!((2_000_000..4_000_000).contains(&total), "{total} tokens");
    let val = TokenStore::open(dir.path(), Split::Val, None).unwrap();
    assert_eq!(val.read_vec(val.len() - 1, 1), [0]);
}

#[test]
fn output_does_not_depend_on_thread_count_and_text_field_is_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = vec![
        write(dir.path(), "in/a.txt", prose(40).as_bytes()),
        write_gz(dir.path(), "in/b.txt.gz", &prose(7)),
        write(
            dir.path(),
            "in/c.jsonl",
            b"{\"body\": \"A note.\", \"text\": 1}\n{\"body\": \"Another.\"}\n",
        ),
    ];
    let run = |threads, name: &str| {
        let out = dir.path().join(name);
        let opts = PrepareOptions {
            threads: Some(threads),
            val_fraction: 0.1,
            text_field: "body".into(),
            ..prep_opts(inputs.clone(), &out)
        };
        let meta = prepare(&opts).unwrap();
        assert_eq!(meta.sources[2].documents, 2);
        let read = |f: &str| std::fs::read(out.join(f)).unwrap();
        (read("train-00000.bin"), read("val-00000.bin"))
    };
    assert_eq!(run(1, "one"), run(2, "two"));
}
