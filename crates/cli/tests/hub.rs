//! Hub ids (issue 42): `--model ORG/NAME[@REV]` and `model.from = "ORG/NAME"` resolve in a
//! Hugging Face cache laid out as huggingface_hub lays it out (`HF_HUB_CACHE`,
//! `models--ORG--NAME/refs/REV`, `snapshots/COMMIT/`, files as symlinks into `blobs/`); a
//! model that is not cached is an error naming where it looked and the download command.

mod common;
use common::*;

use std::path::Path;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// `hf` as a hub cache holding `ORG/NAME` at `main` = [`COMMIT`]: each file of `model` is a blob
/// named by a made-up hash, linked from the snapshot as huggingface_hub links it.
fn cache_with(model: &Path, cache: &Path, repo: &str) {
    let folder = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snapshot = folder.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(folder.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(folder.join("refs")).unwrap();
    std::fs::write(folder.join("refs/main"), COMMIT).unwrap();
    for (i, entry) in std::fs::read_dir(model).unwrap().enumerate() {
        let entry = entry.unwrap();
        let blob = folder.join("blobs").join(format!("blob{i:04}"));
        std::fs::copy(entry.path(), &blob).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(blob.file_name().unwrap()),
            snapshot.join(entry.file_name()),
        )
        .unwrap();
    }
}

#[test]
fn hub_ids_resolve_in_the_cache_for_generate_eval_and_train() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let cache = dir.path().join("hub-cache");
    cache_with(&hf, &cache, "tiny-org/tiny-qwen3");
    let env = [("HF_HUB_CACHE", s(&cache)), ("HF_HUB_OFFLINE", "1")];

    // The same text scored from the directory and by hub id (with and without @main).
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "It is a truth universally acknowledged, that a single man.",
    )
    .unwrap();
    let score = |model: &str| {
        ok(&qwen_burn(
            &[
                "eval",
                "--model",
                model,
                "--text",
                s(&text),
                "--context",
                "8",
                "--json",
            ],
            &env,
        ))
    };
    let by_path = score(s(&hf));
    assert_eq!(score("tiny-org/tiny-qwen3"), by_path);
    assert_eq!(score(&format!("tiny-org/tiny-qwen3@{COMMIT}")), by_path);
    let gen_args = |m: &'static str| {
        vec![
            "generate",
            "--model",
            m,
            "--prompt",
            "It is",
            "--max-new-tokens",
            "4",
            "--temperature",
            "0",
        ]
    };
    let generated = ok(&qwen_burn(&gen_args("tiny-org/tiny-qwen3@main"), &env));
    assert!(!generated.trim().is_empty());

    // A run fine-tuned from the hub id.
    let config = tiny_config(dir.path(), false, 2, 2, "");
    let run = dir.path().join("run");
    // tiny_config's [model] table holds the architecture, which `from` cannot be combined with:
    // the run's config gets a [model] table with `from` alone.
    let text_config = std::fs::read_to_string(&config).unwrap();
    let start = text_config.find("[model]").unwrap();
    let end = text_config[start + 1..].find("\n[").unwrap() + start + 1;
    let from_hub = format!(
        "{}[model]\nfrom = \"tiny-org/tiny-qwen3\"\n{}",
        &text_config[..start],
        &text_config[end + 1..]
    );
    // Without data.tokenizer: the model's own tokenizer.json, from the snapshot.
    let from_hub: String = from_hub
        .lines()
        .filter(|l| !l.starts_with("tokenizer ="))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!from_hub.contains("tokenizer ="));
    let hub_config = dir.path().join("from_hub.toml");
    std::fs::write(&hub_config, from_hub).unwrap();
    ok(&qwen_burn(
        &["train", "--config", s(&hub_config), "--run-dir", s(&run)],
        &env,
    ));
    assert!(run.join("checkpoints").is_dir());
    assert_eq!(
        std::fs::read(run.join("tokenizer.json")).unwrap(),
        std::fs::read(hf.join("tokenizer.json")).unwrap()
    );

    // Not cached: the error names the cache folder it looked in and the download command.
    let err = fails(&qwen_burn(
        &["eval", "--model", "tiny-org/absent", "--text", s(&text)],
        &env,
    ));
    assert!(err.contains("models--tiny-org--absent"), "{err}");
    assert!(err.contains("hf download tiny-org/absent"), "{err}");
    let err = fails(&qwen_burn(
        &[
            "train",
            "--config",
            s(&hub_config),
            "--run-dir",
            s(&dir.path().join("r2")),
            "--set",
            "model.from=\"tiny-org/absent@v2\"",
        ],
        &env,
    ));
    assert!(
        err.contains("refs/v2") && err.contains("hf download"),
        "{err}"
    );
}
