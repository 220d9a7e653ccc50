//! Multiple-choice task files: each layout renders the lm-evaluation-harness prompt, choices and
//! answer; Parquet (HF `datasets`' nested columns) reads the same as JSONL; few-shot contexts
//! are seeded and never include the question itself; bad rows name the file, row and field.
//! Fixtures: `tests/fixtures/tasks/make_task_fixtures.py`.

use std::path::{Path, PathBuf};

use qwen_burn_data::{DataError, FewshotSampler, Layout, McItem, read_task};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tasks")
        .join(name)
}

fn write(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

fn item(prompt: &str, choices: &[&str], gold: usize) -> McItem {
    McItem {
        description: String::new(),
        prompt: prompt.into(),
        choices: choices.iter().map(|c| c.to_string()).collect(),
        gold,
    }
}

#[test]
fn parquet_and_jsonl_read_the_same_arc_and_hellaswag() {
    for name in ["arc", "hellaswag"] {
        let a = read_task(&fixture(&format!("{name}.jsonl"))).unwrap();
        let b = read_task(&fixture(&format!("{name}.parquet"))).unwrap();
        assert_eq!(a.items, b.items, "{name}");
        assert_eq!(a.layout, b.layout);
    }
    let arc = read_task(&fixture("arc.parquet")).unwrap();
    assert_eq!(arc.layout, Layout::Arc);
    assert_eq!(
        arc.items,
        vec![
            item(
                "Question: Which gas do plants take in?\nAnswer:",
                &["oxygen", "carbon dioxide", "helium", "neon"],
                1
            ),
            // Numeric labels: the answer is found by label, not by letter.
            item(
                "Question: What melts ice?\nAnswer:",
                &["heat", "cold", "dark"],
                0
            ),
        ]
    );
    let hs = read_task(&fixture("hellaswag.parquet")).unwrap();
    assert_eq!(hs.layout, Layout::HellaSwag);
    // ctx_a + " " + ctx_b capitalised (not `ctx`), behind the activity label; label "3".
    assert_eq!(
        hs.items[0].prompt,
        "Removing ice from car: Then, the man writes over the snow covering the window of a car, \
         and a woman wearing winter clothes smiles. Then"
    );
    assert_eq!(
        hs.items[0].choices[3],
        ", the man continues removing the snow on his car."
    );
    assert_eq!(hs.items[0].gold, 3);
}

#[test]
fn every_layout_renders_the_harness_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let piqa = write(
        tmp.path(),
        "piqa.jsonl",
        &[r#"{"goal": "Open a jar", "sol1": "twist the lid", "sol2": "hit it", "label": 0}"#],
    );
    assert_eq!(
        read_task(&piqa).unwrap().items,
        vec![item(
            "Question: Open a jar\nAnswer:",
            &["twist the lid", "hit it"],
            0
        )]
    );
    let mmlu = write(
        tmp.path(),
        "mmlu.jsonl",
        &[
            r#"{"question": " What is 2+2? ", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "22"], "answer": 1}"#,
        ],
    );
    let t = read_task(&mmlu).unwrap();
    assert_eq!(t.layout, Layout::Mmlu);
    assert_eq!(
        t.items[0].description,
        "The following are multiple choice questions (with answers) about elementary mathematics.\n\n"
    );
    assert_eq!(
        t.items[0].prompt,
        "What is 2+2?\nA. 3\nB. 4\nC. 5\nD. 22\nAnswer:"
    );
    assert_eq!(t.items[0].choices, ["A", "B", "C", "D"]);
    let hs = write(
        tmp.path(),
        "hs.jsonl",
        &[
            r#"{"ctx": "A man [header] sits  down.", "endings": ["He [title] stands", "He sits"], "label": 1}"#,
        ],
    );
    // No activity label and no ctx_a/ctx_b: `ctx` alone, preprocessed.
    assert_eq!(
        read_task(&hs).unwrap().items,
        vec![item("A man sits down.", &["He. stands", "He sits"], 1)]
    );
    let plain = write(
        tmp.path(),
        "plain.jsonl",
        &[
            r#"{"context": "The sky is", "choices": ["blue", "green"], "gold": 0}"#,
            "",
            r#"{"context": "Grass is ", "choices": ["blue", "green"], "gold": 1}"#,
        ],
    );
    let t = read_task(&plain).unwrap();
    assert_eq!(t.layout, Layout::Plain);
    assert_eq!(t.items.len(), 2, "blank lines are skipped");
    assert_eq!(t.items[1].prompt, "Grass is ");
}

#[test]
fn few_shot_contexts_are_seeded_and_leave_the_question_out() {
    let tmp = tempfile::tempdir().unwrap();
    let rows: Vec<String> = (0..6)
        .map(|i| format!(r#"{{"context": "q{i}", "choices": ["a{i}", "b{i}"], "gold": 1}}"#))
        .collect();
    let refs: Vec<&str> = rows.iter().map(String::as_str).collect();
    let task = read_task(&write(tmp.path(), "t.jsonl", &refs)).unwrap();
    assert_eq!(task.context(2, 0, 1).unwrap(), "q2");
    for index in 0..6 {
        let ctx = task.context(index, 5, 7).unwrap();
        // Every other question once, each as prompt + " " + gold choice + blank line.
        for j in (0..6).filter(|&j| j != index) {
            assert_eq!(ctx.matches(&format!("q{j} b{j}\n\n")).count(), 1, "{ctx:?}");
        }
        assert!(ctx.ends_with(&format!("\n\nq{index}")), "{ctx:?}");
        assert!(!ctx.contains(&format!("q{index} ")), "{ctx:?}");
        assert_eq!(
            ctx,
            task.context(index, 5, 7).unwrap(),
            "same seed, same shots"
        );
    }
    // Two shots: different seeds draw different examples for some question.
    let differs = (0..6).any(|i| task.context(i, 2, 1).unwrap() != task.context(i, 2, 2).unwrap());
    assert!(differs);
    let err = task.context(0, 6, 1).unwrap_err().to_string();
    assert!(err.contains("only 5 other questions"), "{err}");
}

/// With a few-shot split (`--fewshot-file`), the examples come from it: `first_n` takes its
/// first questions for every question (the harness's MMLU dev examples), `random` a seeded
/// draw from it; never the task's own questions. Too few examples name the split's file.
#[test]
fn few_shot_examples_come_from_the_fewshot_split() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = |tag: &str, n: usize| -> Vec<String> {
        (0..n)
            .map(|i| {
                format!(r#"{{"context": "{tag}{i}", "choices": ["a{i}", "b{i}"], "gold": 1}}"#)
            })
            .collect()
    };
    let (test, dev) = (rows("q", 4), rows("d", 5));
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let task = read_task(&write(tmp.path(), "test.jsonl", &refs(&test))).unwrap();
    let split = || read_task(&write(tmp.path(), "dev.jsonl", &refs(&dev))).unwrap();
    let first = task.clone().with_fewshot(split(), FewshotSampler::FirstN);
    for index in 0..4 {
        assert_eq!(
            first.context(index, 2, 9).unwrap(),
            format!("d0 b0\n\nd1 b1\n\nq{index}")
        );
    }
    let random = task.with_fewshot(split(), FewshotSampler::Random);
    let mut seen = std::collections::BTreeSet::new();
    for index in 0..4 {
        let ctx = random.context(index, 3, 9).unwrap();
        assert_eq!(ctx.matches(" b").count(), 3, "{ctx:?}");
        assert!((0..4).all(|j| !ctx.contains(&format!("q{j} "))), "{ctx:?}");
        assert_eq!(ctx, random.context(index, 3, 9).unwrap());
        seen.insert(ctx);
    }
    assert!(seen.len() > 1, "the draw depends on the question");
    let err = first.context(0, 6, 1).unwrap_err().to_string();
    assert!(
        err.contains("dev.jsonl") && err.contains("has only 5"),
        "{err}"
    );
}

#[test]
fn bad_task_rows_name_the_file_row_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &[r#"{"prompt": "x", "options": ["a", "b"], "answer": 0}"#],
            r#"row 1: unknown task layout: the row has fields ["answer", "options", "prompt"]"#,
        ),
        (
            &[
                r#"{"context": "x", "choices": ["a", "b"], "gold": 0}"#,
                r#"{"context": "y", "choices": ["a", "b"], "gold": 2}"#,
            ],
            "row 2: plain layout: `gold` is 2 but there are 2 choices",
        ),
        (
            &[r#"{"context": "x", "choices": ["a"], "gold": 0}"#],
            "`choices` has 1 entries, expected 2 to 64 choices",
        ),
        (
            &[r#"{"context": "x", "choices": ["a", 3], "gold": 0}"#],
            "`choices[1]` is a number, expected a string",
        ),
        (
            &[r#"{"context": "x", "choices": ["a", "b"], "gold": -1}"#],
            "`gold` is -1, expected a choice index",
        ),
        (
            &[
                r#"{"question": "x", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}"#,
            ],
            r#"arc layout: `answerKey` "C" is not one of `choices.label` ["A", "B"]"#,
        ),
        (
            &[
                r#"{"goal": "x", "sol1": "a", "sol2": "b", "label": 0}"#,
                "[1, 2]",
            ],
            "row 2: expected a JSON object, found a list",
        ),
        (&[r#"{"context": "x""#], "row 1: not valid JSON"),
        (&["", "  "], "row 1: the task file has no questions"),
    ];
    for (i, (lines, expected)) in cases.iter().enumerate() {
        let path = write(tmp.path(), &format!("bad{i}.jsonl"), lines);
        let err = read_task(&path).unwrap_err();
        assert!(matches!(err, DataError::Task { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&*path.to_string_lossy()), "{msg}");
        assert!(
            msg.contains(expected),
            "case {i}: {msg}\nexpected: {expected}"
        );
    }
    let missing = read_task(&tmp.path().join("nope.jsonl")).unwrap_err();
    assert!(
        matches!(missing, DataError::MissingPath { .. }),
        "{missing:?}"
    );
    let not_parquet = write(tmp.path(), "x.parquet", &["hello"]);
    let err = read_task(&not_parquet).unwrap_err().to_string();
    assert!(err.contains("not a readable Parquet file"), "{err}");
}
