//! Parquet input: the same documents as Parquet (two row groups) and as JSONL give exactly the
//! same token shards; re-running does no work; bad input names the file, the column and what
//! was expected. Fixture: `tests/fixtures/parquet/make_fixture.py`.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use qwen_burn_data::{PrepareOptions, ShardMeta, Split, TokenStore, prepare};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parquet")
        .join(name)
}

fn opts(input: PathBuf, out: &Path, field: &str) -> PrepareOptions {
    PrepareOptions {
        text_field: field.into(),
        val_fraction: 0.2,
        ..prep_opts(vec![input], out)
    }
}

fn tokens(dir: &Path, split: Split) -> Vec<u32> {
    let store = TokenStore::open(dir, split, None).unwrap();
    store.read_vec(0, store.len())
}

#[test]
fn parquet_writes_the_same_shards_as_jsonl() {
    let tmp = tempfile::tempdir().unwrap();
    let (pq_dir, jsonl_dir) = (tmp.path().join("pq"), tmp.path().join("jsonl"));
    let a: ShardMeta = prepare(&opts(fixture("docs.parquet"), &pq_dir, "text")).unwrap();
    let b: ShardMeta = prepare(&opts(fixture("docs.jsonl"), &jsonl_dir, "text")).unwrap();
    assert_eq!(a.sources[0].documents, 9);
    assert_eq!(
        (a.train.tokens, a.val.tokens),
        (b.train.tokens, b.val.tokens)
    );
    assert_eq!(
        (a.train.documents, a.val.documents),
        (b.train.documents, b.val.documents)
    );
    for split in [Split::Train, Split::Val] {
        assert_eq!(tokens(&pq_dir, split), tokens(&jsonl_dir, split));
    }
    // The shard files themselves are byte-identical.
    for (x, y) in a.train.shards.iter().zip(&b.train.shards) {
        assert_eq!(
            std::fs::read(pq_dir.join(&x.file)).unwrap(),
            std::fs::read(jsonl_dir.join(&y.file)).unwrap()
        );
    }
    // Unchanged input: nothing to do.
    let again = prepare(&opts(fixture("docs.parquet"), &pq_dir, "text")).unwrap();
    assert!(again.reused);
}

#[test]
fn bad_parquet_input_says_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let e = prepare(&opts(fixture("docs.parquet"), &out, "body"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("docs.parquet")
            && e.contains("no column `body`")
            && e.contains(r#"["id", "text"]"#),
        "{e}"
    );
    let e = prepare(&opts(fixture("docs.parquet"), &out, "id"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column `id` has type INT64") && e.contains("expected a string"),
        "{e}"
    );
    let bad = write(
        tmp.path(),
        "broken.parquet",
        b"PAR1 this is not parquet PAR1",
    );
    let e = prepare(&opts(bad, &out, "text")).unwrap_err().to_string();
    assert!(
        e.contains("broken.parquet") && e.contains("not a readable Parquet file"),
        "{e}"
    );
}
