//! Multiple-choice tasks from the command line and during training: `eval --task` prints the
//! metrics (text or `--json`) and per-question records; `[eval] tasks` writes `"split": "task"`
//! records to `metrics.jsonl` at step 0, every `interval` steps and at the end, with the same
//! figures `eval --task` gives on the final checkpoint; `plot` draws them and the validation bits
//! per byte; a bad task file fails before the first step, naming the file and the fields.

mod common;
use common::*;

fn task_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("cloze.jsonl");
    let rows = [
        r#"{"context": "Shall I compare thee to a summer's", "choices": ["day?", "lamb", "shoe"], "gold": 0}"#,
        r#"{"context": "Thou art more lovely and more", "choices": ["temperate:", "green", "iron"], "gold": 0}"#,
        r#"{"context": "Rough winds do shake the darling buds of ", "choices": ["May,", "tea", "rain"], "gold": 0}"#,
        r#"{"context": "And summer's lease hath all too short a", "choices": ["date:", "cow", "pen"], "gold": 0}"#,
        r#"{"context": "", "choices": ["the", "zzz"], "gold": 0}"#,
    ];
    std::fs::write(&path, rows.join("\n")).unwrap();
    path
}

fn records(run: &std::path::Path, split: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == split)
        .collect()
}

#[test]
fn tasks_are_scored_during_training_and_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let task = task_file(tmp.path());
    let extra = format!(
        "\n[eval]\ntasks = [\"{}\"]\ninterval = 2\nlimit = 4\n",
        task.display()
    );
    let cfg = tiny_config(tmp.path(), false, 3, 3, &extra);
    let run = tmp.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&cfg), "--run-dir", s(&run)],
        &[],
    ));
    let tasks = records(&run, "task");
    let steps: Vec<u64> = tasks.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![0, 2, 3], "step 0, every 2 steps and the last");
    for r in &tasks {
        assert_eq!(r["task"], "cloze");
        assert_eq!(r["questions"], 4, "limit = 4");
        let acc = r["acc"].as_f64().unwrap();
        assert!(
            (0.0..=1.0).contains(&acc) && (acc * 4.0).fract() == 0.0,
            "{r}"
        );
        assert!((r["chance"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-12);
    }
    // Validation records carry bits per byte: the summed loss over the validation targets in
    // bits, over the UTF-8 bytes of their text (the document separator has none), decoded
    // here from the validation split the run read.
    let store = qwen_burn_data::TokenStore::open(
        &tmp.path().join("shards"),
        qwen_burn_data::Split::Val,
        None,
    )
    .unwrap();
    let tok = qwen_burn_data::Tok::from_file(&repo_root().join("datasets/tokenizer.json")).unwrap();
    let eos = tok.require_eos().unwrap();
    let (mut targets, mut bytes) = (0usize, 0usize);
    for batch in qwen_burn_data::eval_batches(&store, 4, 32, 2) {
        for row in batch.targets.chunks(batch.seq_len) {
            targets += row.len();
            let ids: Vec<u32> = row
                .iter()
                .map(|&t| t as u32)
                .filter(|&t| t != eos)
                .collect();
            bytes += tok.decode(&ids).unwrap().len();
        }
    }
    let val = records(&run, "val");
    assert!(!val.is_empty());
    for v in &val {
        let (loss, bpb) = (v["loss"].as_f64().unwrap(), v["bpb"].as_f64().unwrap());
        let expected = loss * targets as f64 / std::f64::consts::LN_2 / bytes as f64;
        assert!(
            (bpb - expected).abs() <= 1e-9 * expected,
            "{v}: bpb {bpb}, expected {expected} ({targets} targets, {bytes} bytes)"
        );
    }

    // The final checkpoint scored from the command line gives the last record's figures.
    let out = ok(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&run),
            "--task",
            s(&task),
            "--limit",
            "4",
            "--json",
            "--records",
            s(&tmp.path().join("records.jsonl")),
        ],
        &[],
    ));
    let cli: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let last = tasks.last().unwrap();
    for key in ["acc", "acc_norm", "acc_stderr", "acc_norm_stderr"] {
        assert_eq!(cli[key], last[key], "{key}");
    }
    assert_eq!(cli["layout"], "plain");
    let per_question: Vec<serde_json::Value> =
        std::fs::read_to_string(tmp.path().join("records.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(per_question.len(), 4);
    // The trailing space of question 3's context moved to its continuations.
    assert_eq!(per_question[2]["continuations"][0], "  May,");
    assert_eq!(per_question[2]["loglik"].as_array().unwrap().len(), 3);
    // All five questions, the empty context included (scored after the end-of-text token).
    let text = ok(&qwen_burn(
        &["eval", "--model", s(&run), "--task", s(&task)],
        &[],
    ));
    assert!(
        text.starts_with("cloze (plain, 5 questions, 0-shot): acc "),
        "{text}"
    );

    let out = ok(&qwen_burn(&["plot", s(&run)], &[]));
    for png in ["loss.png", "bpb.png", "tasks.png"] {
        assert!(out.contains(png), "{out}");
        assert!(run.join("plots").join(png).exists(), "{png}");
    }
}

#[test]
fn a_bad_task_file_fails_before_training_and_in_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, r#"{"prompt": "x", "answers": ["a", "b"]}"#).unwrap();
    let extra = format!("\n[eval]\ntasks = [\"{}\"]\n", bad.display());
    let cfg = tiny_config(tmp.path(), false, 3, 3, &extra);
    let run = tmp.path().join("run");
    let out = qwen_burn(&["train", "--config", s(&cfg), "--run-dir", s(&run)], &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("bad.jsonl: row 1: unknown task layout")
            && err.contains(r#"["answers", "prompt"]"#),
        "{err}"
    );
    assert!(!run.join("checkpoints").exists(), "no step was taken");
    // An unknown [eval] key is refused by name.
    let cfg = tiny_config(tmp.path(), false, 3, 3, "\n[eval]\ntask = []\n");
    let out = qwen_burn(&["train", "--config", s(&cfg), "--run-dir", s(&run)], &[]);
    assert!(stderr(&out).contains("eval.task"), "{}", stderr(&out));
}
