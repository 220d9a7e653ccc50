//! Prepared data that runs use (issue 42): `data prepare` and a run split a corpus by the same
//! rule (`data.val_fraction`, default 0.01), so a run whose `data.cache_dir` holds shards that
//! `data prepare` made from the same inputs and tokenizer trains on them as they are.

mod common;
use common::*;

fn modified(path: &std::path::Path) -> std::time::SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

#[test]
fn a_run_trains_on_shards_data_prepare_made() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shards = dir.path().join("shards");
    let input = repo_root().join("datasets/austen/austen_persuasion.txt.gz");
    let tokenizer = repo_root().join("datasets/tokenizer.json");
    ok(&qwen_burn(
        &[
            "data",
            "prepare",
            "--input",
            s(&input),
            "--tokenizer",
            s(&tokenizer),
            "--out",
            s(&shards),
            "--quiet",
        ],
        &[],
    ));
    let meta = shards.join("meta.json");
    let before: Vec<_> = std::fs::read_dir(&shards)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.clone(), modified(&p))
        })
        .collect();
    let text = std::fs::read_to_string(&meta).unwrap();

    let config = tiny_config(dir.path(), false, 2, 2, "");
    // Its [data] on the same input, the prepared shards as its cache, the default split.
    let body: String = std::fs::read_to_string(&config)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("val_fraction"))
        .map(|l| match l {
            l if l.starts_with("inputs = ") => format!("inputs = [\"{}\"]\n", input.display()),
            l if l.starts_with("cache_dir = ") => format!("cache_dir = \"{}\"\n", shards.display()),
            l => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&config, body).unwrap();
    let run = dir.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    assert!(run.join("checkpoints").is_dir());
    assert_eq!(
        std::fs::read_to_string(&meta).unwrap(),
        text,
        "meta.json unchanged"
    );
    for (path, time) in before {
        assert_eq!(modified(&path), time, "{} rewritten", path.display());
    }
}
