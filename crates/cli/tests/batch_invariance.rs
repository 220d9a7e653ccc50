//! L1 of reproducibility (issue 40): a question's, a pair's or a window's numbers are the same
//! bits whatever else shares their forward: `eval --task --records` at `--batch-questions` 1, 7
//! and 32, `eval --pairs` and `eval --text` at several `--batch-size`s, dense and MoE.

mod common;
use common::*;

fn stdout_of(args: &[&str]) -> String {
    let out = qwen_burn(args, &[]);
    ok(&out);
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The tiny config's step-0 weights as an HF directory with the shipped tokenizer.
fn tiny_model(dir: &std::path::Path, moe: bool) -> std::path::PathBuf {
    let config = tiny_config(dir, moe, 3, 3, "");
    let out = dir.join(if moe { "hf-moe" } else { "hf-dense" });
    ok(&qwen_burn(
        &["init", "--config", s(&config), "--out", s(&out)],
        &[],
    ));
    std::fs::copy(
        repo_root().join("datasets/tokenizer.json"),
        out.join("tokenizer.json"),
    )
    .expect("tokenizer");
    out
}

#[test]
fn eval_numbers_do_not_depend_on_the_batch() {
    for moe in [false, true] {
        same_numbers_at_every_batch(moe);
    }
}

fn same_numbers_at_every_batch(moe: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(dir.path(), moe);
    let root = repo_root();
    let task = root.join("datasets/tasks/austen_cloze.jsonl");
    let records: Vec<String> = ["1", "7", "32"]
        .iter()
        .map(|b| {
            let path = dir.path().join(format!("records-{b}.jsonl"));
            stdout_of(&[
                "eval",
                "--model",
                s(&model),
                "--task",
                s(&task),
                "--limit",
                "40",
                "--batch-questions",
                b,
                "--records",
                s(&path),
                "--json",
            ]);
            std::fs::read_to_string(&path).expect("records")
        })
        .collect();
    assert_eq!(records[0].lines().count(), 40);
    assert!(
        records[0].contains("loglik"),
        "{}",
        &records[0][..200.min(records[0].len())]
    );
    for (b, r) in ["7", "32"].iter().zip(&records[1..]) {
        assert!(
            r == &records[0],
            "eval --task records at --batch-questions {b} differ from 1"
        );
    }

    let pairs = root.join("datasets/preference/austen_style_val.jsonl");
    let figures: Vec<String> = ["1", "3", "16"]
        .iter()
        .map(|b| {
            stdout_of(&[
                "eval",
                "--model",
                s(&model),
                "--pairs",
                s(&pairs),
                "--loss",
                "simpo",
                "--batch-size",
                b,
                "--json",
            ])
        })
        .collect();
    assert!(figures[0].contains("logps_chosen"), "{}", figures[0]);
    assert!(
        figures.iter().all(|f| f == &figures[0]),
        "eval --pairs: {figures:?}"
    );

    let text = root.join("datasets/tasks/README.md");
    let losses: Vec<String> = ["1", "4", "9"]
        .iter()
        .map(|b| {
            stdout_of(&[
                "eval",
                "--model",
                s(&model),
                "--text",
                s(&text),
                "--context",
                "32",
                "--batch-size",
                b,
                "--json",
            ])
        })
        .collect();
    assert!(
        losses.iter().all(|f| f == &losses[0]),
        "eval --text: {losses:?}"
    );
}
