//! Hostile input, round three (found by the fifteenth session's own probing): outputs written over
//! the inputs of `batches` and `tokenizer train`, a run started inside a model directory, and a
//! resume that needs the config file the run was started with. Each used to overwrite a file the
//! command read (or reject a reasonable command); each now gets a clear error naming the flag, or
//! does what the help says.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// The tiny dense config reading copies of the shipped tokenizer and a corpus file inside `dir`
/// (so that a regression of the checks below damages only copies).
fn config_on_copies(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let root = repo_root();
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let corpus = data.join("sonnets.txt.gz");
    std::fs::copy(
        root.join("datasets/shakespeare/sonnets_gut.txt.gz"),
        &corpus,
    )
    .expect("copy");
    let tok = dir.join("tokenizer.json");
    std::fs::copy(root.join("datasets/tokenizer.json"), &tok).expect("copy");
    let config = tiny_config(dir, false, 2, 2, "");
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text
        .replace(
            &root
                .join("datasets/shakespeare/sonnets_gut.txt.gz")
                .display()
                .to_string(),
            s(&data),
        )
        .replace(
            &root.join("datasets/tokenizer.json").display().to_string(),
            s(&tok),
        );
    std::fs::write(&config, text).expect("config");
    (config, tok, corpus)
}

fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).expect("read")
}

#[test]
fn batches_never_writes_over_what_it_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, tok, corpus) = config_on_copies(dir.path());
    // The config, the tokenizer, a file inside a data directory: each refused, left as it was.
    for (target, named) in [
        (&config, &config),
        (&tok, &tok),
        (&corpus, &corpus.parent().expect("data dir").to_path_buf()),
    ] {
        let before = bytes(target);
        let err = fails(&qwen_burn(
            &[
                "batches",
                "--config",
                s(&config),
                "--steps",
                "1",
                "--out",
                s(target),
            ],
            &[],
        ));
        assert!(
            err.contains("--out") && err.contains(s(named)) && err.contains("reads"),
            "{}: {err}",
            target.display()
        );
        assert_eq!(bytes(target), before, "{} changed", target.display());
    }
    // A new file is written whole, with no temporary file left beside it.
    let out = dir.path().join("out/batches.jsonl");
    std::fs::create_dir_all(out.parent().expect("parent")).expect("mkdir");
    ok(&qwen_burn(
        &[
            "batches",
            "--config",
            s(&config),
            "--steps",
            "2",
            "--out",
            s(&out),
        ],
        &[],
    ));
    let lines = std::fs::read_to_string(&out).expect("batches");
    assert_eq!(lines.lines().count(), 2, "one line a micro-batch");
    let names: Vec<_> = std::fs::read_dir(out.parent().expect("parent"))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("batches.jsonl")]);
}

#[test]
fn tokenizer_training_never_writes_over_its_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = dir.path().join("corpus/a.txt");
    std::fs::create_dir_all(text.parent().expect("parent")).expect("mkdir");
    std::fs::write(&text, "hello world foo bar\nbaz qux hello world\n").expect("text");
    let before = bytes(&text);
    // Given as the file itself, and found inside a given directory.
    for input in [&text, &text.parent().expect("parent").to_path_buf()] {
        let err = fails(&qwen_burn(
            &[
                "tokenizer",
                "train",
                "--input",
                s(input),
                "--vocab-size",
                "300",
                "--out",
                s(&text),
            ],
            &[],
        ));
        assert!(
            err.contains("out") && err.contains("training input"),
            "{err}"
        );
        assert_eq!(bytes(&text), before, "the training text changed");
    }
}

#[test]
fn a_run_never_lands_in_a_model_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf(dir.path(), &[]);
    let config = tiny_config(dir.path(), false, 2, 2, "");
    let before = bytes(&hf.join("config.json"));
    let err = fails(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&hf)],
        &[],
    ));
    assert!(
        err.contains("--run-dir") && err.contains("holds a model"),
        "{err}"
    );
    assert_eq!(bytes(&hf.join("config.json")), before);
    let mut names: Vec<_> = std::fs::read_dir(&hf)
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("name"))
        .collect();
    names.sort();
    assert_eq!(names, ["config.json", "model.safetensors"], "nothing added");
}

#[test]
fn resume_reads_the_runs_own_config_when_none_is_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 2, 2, "");
    let run = dir.path().join("run");
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&run),
            "--set",
            "optimizer.lr=2e-3",
        ],
        &[],
    ));
    // Without the config file (moved away) and without repeating the `--set`.
    std::fs::rename(&config, dir.path().join("moved.toml")).expect("move");
    let out = qwen_burn(
        &[
            "train",
            "--resume",
            "--run-dir",
            s(&run),
            "--max-steps",
            "4",
        ],
        &[],
    );
    ok(&out);
    assert!(stderr(&out).contains("run.toml"), "{}", stderr(&out));
    let last = run.join("checkpoints/step-00000004/run.toml");
    let text = std::fs::read_to_string(&last).expect("run.toml");
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert!(lines.contains(&"lr = 0.002"), "the --set kept:\n{text}");
    assert!(lines.contains(&"max_steps = 4"), "{text}");
    let steps: Vec<u64> = train_losses(&run).iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    // Neither a config nor a run directory: a clear refusal.
    let err = fails(&qwen_burn(&["train", "--resume"], &[]));
    assert!(
        err.contains("--run-dir") && err.contains("--config"),
        "{err}"
    );
}
