//! RL prompt files: every layout (text, messages, GSM8K) from JSONL and Parquet, bad rows as
//! errors naming the file, line or row, and field, and the shipped `datasets/arith` files.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qwen_burn_data::{ChatTemplate, PromptSet, Tok, load_prompts};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tok() -> Tok {
    Tok::from_file(&root().join("datasets/tokenizer.json")).unwrap()
}

/// Writes `lines` as `dir/name`, one per line, and returns the path.
fn jsonl(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn load(path: &Path, max: Option<usize>) -> qwen_burn_data::Result<PromptSet> {
    load_prompts(path, &tok(), &ChatTemplate::chatml(), max)
}

#[test]
fn text_prompts_are_kept_as_given_and_number_answers_become_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = jsonl(
        dir.path(),
        "text.jsonl",
        &[
            r#"{"prompt": "What is 12 + 345?", "answer": "357"}"#,
            "",
            r#"{"prompt": "What is 3 - 10?", "answer": -7, "source": "ignored"}"#,
            r#"{"prompt": " Half of 3? ", "answer": 1.5}"#,
            r#"{"prompt": "Forty-two?", "answer": 42}"#,
        ],
    );
    let set = load(&path, None).unwrap();
    let tok = tok();
    let got: Vec<(&str, &str)> = set
        .items
        .iter()
        .map(|p| (p.text.as_str(), p.answer.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("What is 12 + 345?", "357"),
            ("What is 3 - 10?", "-7"),
            (" Half of 3? ", "1.5"),
            ("Forty-two?", "42"),
        ]
    );
    for p in &set.items {
        assert_eq!(p.ids, tok.encode(&p.text).unwrap());
    }
}

#[test]
fn message_prompts_are_rendered_with_the_generation_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let path = jsonl(
        dir.path(),
        "chat.jsonl",
        &[
            r#"{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}"#,
        ],
    );
    let set = load(&path, None).unwrap();
    let item = &set.items[0];
    assert_eq!(
        item.text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(item.answer, "4");
    let tok = tok();
    assert_eq!(item.ids, tok.encode(&item.text).unwrap());
    let im_start = tok.token_id("<|im_start|>").unwrap();
    assert_eq!(item.ids[0], im_start);
    assert_eq!(item.ids.iter().filter(|&&t| t == im_start).count(), 3);
}

#[test]
fn gsm8k_rows_keep_the_question_and_the_whole_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = jsonl(
        dir.path(),
        "gsm8k.jsonl",
        &[
            r#"{"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"}"#,
        ],
    );
    let set = load(&path, Some(64)).unwrap();
    assert_eq!(set.items.len(), 1);
    assert_eq!(
        set.items[0].text,
        "Tom has 3 apples and buys 4 more. How many apples does he have?"
    );
    assert_eq!(
        set.items[0].answer,
        "He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"
    );
}

/// Each bad row, on line 2 after a good one, and what the error must say besides the file
/// and line.
const BAD_ROWS: &[(&str, &[&str])] = &[
    (r#"{"answer": "1"}"#, &["\"prompt\"", "\"question\""]),
    (r#"{"prompt": "What is 1 + 0?"}"#, &["\"answer\""]),
    (r#"{"question": "What is 1 + 0?"}"#, &["\"answer\""]),
    (
        r#"{"prompt": "   ", "answer": "1"}"#,
        &["\"prompt\"", "empty"],
    ),
    (
        r#"{"question": "", "answer": "1"}"#,
        &["\"question\"", "empty"],
    ),
    (r#"{"prompt": [], "answer": "1"}"#, &["\"prompt\"", "empty"]),
    (
        r#"{"prompt": "Why?", "answer": ""}"#,
        &["\"answer\"", "empty"],
    ),
    (
        r#"{"prompt": 7, "answer": "1"}"#,
        &["\"prompt\"", "a number"],
    ),
    (
        r#"{"prompt": {"text": "hi"}, "answer": "1"}"#,
        &["\"prompt\"", "an object"],
    ),
    (
        r#"{"question": ["hi"], "answer": "1"}"#,
        &["\"question\"", "an array"],
    ),
    (
        r#"{"prompt": "Why?", "answer": null}"#,
        &["\"answer\"", "null"],
    ),
    (
        r#"{"prompt": "Why?", "answer": ["1"]}"#,
        &["\"answer\"", "an array"],
    ),
    (
        r#"{"prompt": [{"role": "user"}], "answer": "1"}"#,
        &["\"prompt\"[0]", "content"],
    ),
    (
        r#"{"prompt": [{"role": "user", "content": 3}], "answer": "1"}"#,
        &["\"prompt\"[0].content"],
    ),
    (
        r#"{"prompt": ["hi"], "answer": "1"}"#,
        &["\"prompt\"[0]", "role"],
    ),
    (
        r#"{"prompt": [{"role": "robot", "content": "hi"}], "answer": "1"}"#,
        &["\"prompt\"[0].role", "robot"],
    ),
    (r#"{"prompt": "Why?", "answer": "1""#, &["invalid JSON"]),
    (r#"["prompt", "answer"]"#, &["expected a JSON object"]),
];

#[test]
fn bad_rows_are_errors_naming_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (row, expected)) in BAD_ROWS.iter().enumerate() {
        let name = format!("bad{i}.jsonl");
        let path = jsonl(
            dir.path(),
            &name,
            &[r#"{"prompt": "What is 1 + 1?", "answer": "2"}"#, row],
        );
        let e = load(&path, None).unwrap_err().to_string();
        assert!(e.contains(&format!("{name}:2:")), "{row}: {e}");
        for word in *expected {
            assert!(e.contains(word), "{row}: {e} lacks {word}");
        }
    }
}

#[test]
fn a_template_that_fails_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tokenizer_config.json");
    let template = r#"{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"#;
    std::fs::write(
        &config,
        serde_json::json!({ "chat_template": template }).to_string(),
    )
    .unwrap();
    let template = ChatTemplate::from_tokenizer_config(&config)
        .unwrap()
        .unwrap();
    let path = jsonl(
        dir.path(),
        "sys.jsonl",
        &[
            r#"{"prompt": [{"role": "user", "content": "Hi?"}], "answer": "1"}"#,
            r#"{"prompt": [{"role": "system", "content": "Hi?"}], "answer": "1"}"#,
        ],
    );
    let e = load_prompts(&path, &tok(), &template, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sys.jsonl:2:") && e.contains("\"prompt\"") && e.contains("user first"),
        "{e}"
    );
}

#[test]
fn a_prompt_over_the_limit_names_file_line_field_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = jsonl(
        dir.path(),
        "long.jsonl",
        &[
            r#"{"prompt": "What is 1 + 1?", "answer": "2"}"#,
            r#"{"question": "What is 1 + 1? Think about it very carefully, step by step, and then answer.", "answer": "2"}"#,
        ],
    );
    let full = load(&path, None).unwrap();
    let longest = full.items.iter().map(|p| p.ids.len()).max().unwrap();
    assert!(load(&path, Some(longest)).is_ok());
    let limit = longest - 1;
    let e = load(&path, Some(limit)).unwrap_err().to_string();
    for word in [
        "long.jsonl:2:".to_string(),
        "\"question\"".into(),
        format!("{longest} tokens"),
        format!("max_prompt_tokens = {limit}"),
    ] {
        assert!(e.contains(&word), "{e} lacks {word}");
    }
    let e = load(&path, Some(0)).unwrap_err().to_string();
    assert!(e.contains("max_prompt_tokens"), "{e}");
}

#[test]
fn empty_and_missing_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for (name, lines) in [("empty.jsonl", &[][..]), ("blank.jsonl", &["", "  "][..])] {
        let path = jsonl(dir.path(), name, lines);
        let e = load(&path, None).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains("no prompt"), "{e}");
    }
    let e = load(&dir.path().join("absent.jsonl"), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("absent.jsonl") && e.contains("does not exist"),
        "{e}"
    );
}

/// Writes a Parquet file with a string column `text_col` and an `answer` column of strings or
/// (with `int_answers`) int64, one row group per two rows.
fn parquet(path: &Path, text_col: &str, texts: &[&str], answers: &[&str], int_answers: bool) {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    let answer_type = if int_answers {
        "int64 answer"
    } else {
        "binary answer (UTF8)"
    };
    let schema = Arc::new(
        parse_message_type(&format!(
            "message schema {{ required binary {text_col} (UTF8); required {answer_type}; \
             required int64 id; }}"
        ))
        .unwrap(),
    );
    let file = std::fs::File::create(path).unwrap();
    let props = Arc::new(WriterProperties::builder().build());
    let mut writer = SerializedFileWriter::new(file, schema, props).unwrap();
    for (g, (texts, answers)) in texts.chunks(2).zip(answers.chunks(2)).enumerate() {
        let mut rg = writer.next_row_group().unwrap();
        let mut index = 0;
        while let Some(mut col) = rg.next_column().unwrap() {
            let strings = |v: &[&str]| v.iter().map(|s| ByteArray::from(*s)).collect::<Vec<_>>();
            match index {
                0 => {
                    col.typed::<ByteArrayType>()
                        .write_batch(&strings(texts), None, None)
                        .unwrap();
                }
                1 if !int_answers => {
                    col.typed::<ByteArrayType>()
                        .write_batch(&strings(answers), None, None)
                        .unwrap();
                }
                _ => {
                    let ints: Vec<i64> = if index == 1 {
                        answers.iter().map(|a| a.parse().unwrap()).collect()
                    } else {
                        (0..texts.len()).map(|i| (2 * g + i) as i64).collect()
                    };
                    col.typed::<Int64Type>()
                        .write_batch(&ints, None, None)
                        .unwrap();
                }
            }
            col.close().unwrap();
            index += 1;
        }
        rg.close().unwrap();
    }
    writer.close().unwrap();
}

#[test]
fn parquet_files_load_as_the_same_rows_in_jsonl_do() {
    let dir = tempfile::tempdir().unwrap();
    let texts = [
        "What is 12 + 345?",
        "What is 3 - 10?",
        "Café: how many letters?",
    ];
    let answers = ["357", "-7", "4"];
    let lines: Vec<String> = texts
        .iter()
        .zip(answers)
        .map(|(t, a)| serde_json::json!({"prompt": t, "answer": a}).to_string())
        .collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let expected = load(&jsonl(dir.path(), "rows.jsonl", &lines), None).unwrap();
    for (col, ints) in [("prompt", false), ("prompt", true), ("question", false)] {
        let path = dir.path().join(format!("rows_{col}_{ints}.parquet"));
        parquet(&path, col, &texts, &answers, ints);
        assert_eq!(load(&path, None).unwrap(), expected, "{col} {ints}");
    }
}

#[test]
fn bad_parquet_rows_name_file_row_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.parquet");
    parquet(
        &path,
        "prompt",
        &["What is 1 + 1?", " "],
        &["2", "3"],
        false,
    );
    let e = load(&path, None).unwrap_err().to_string();
    assert!(
        e.contains("bad.parquet") && e.contains("row 1") && e.contains("\"prompt\" is empty"),
        "{e}"
    );
    let path = dir.path().join("noanswer.parquet");
    parquet(&path, "text", &["What is 1 + 1?"], &["2"], false);
    let e = load(&path, None).unwrap_err().to_string();
    assert!(
        e.contains("noanswer.parquet") && e.contains("row 0") && e.contains("\"question\""),
        "{e}"
    );
}

/// The question of a shipped arithmetic prompt, a user message rendered by ChatML.
fn question(text: &str) -> &str {
    text.strip_prefix("<|im_start|>user\n")
        .and_then(|t| t.strip_suffix("<|im_end|>\n<|im_start|>assistant\n"))
        .unwrap_or_else(|| panic!("not one rendered user message: {text:?}"))
}

#[test]
fn shipped_arith_prompts_load_and_are_disjoint() {
    let dir = root().join("datasets/arith");
    let train = load(&dir.join("train.jsonl"), Some(32)).unwrap();
    let heldout = load(&dir.join("heldout.jsonl"), Some(32)).unwrap();
    assert_eq!((train.items.len(), heldout.items.len()), (4000, 500));
    for set in [&train, &heldout] {
        for p in &set.items {
            let q = question(&p.text).strip_prefix("What is ").unwrap();
            let q = q.strip_suffix('?').unwrap();
            let parts: Vec<&str> = q.split(' ').collect();
            let (a, b): (i64, i64) = (parts[0].parse().unwrap(), parts[2].parse().unwrap());
            assert!(
                (0..1000).contains(&a) && (0..1000).contains(&b),
                "{}",
                p.text
            );
            let n = match parts[1] {
                "+" => a + b,
                "-" => a - b,
                op => panic!("operator {op}"),
            };
            assert_eq!(p.answer, n.to_string(), "{}", p.text);
        }
        let adds = set.items.iter().filter(|p| p.text.contains('+')).count();
        assert_eq!(2 * adds, set.items.len());
    }
    let seen: HashSet<&str> = train.items.iter().map(|p| p.text.as_str()).collect();
    assert!(
        heldout
            .items
            .iter()
            .all(|p| !seen.contains(p.text.as_str()))
    );
    assert_eq!(seen.len(), train.items.len());
}

#[test]
fn shipped_arith_sft_rows_answer_the_train_prompts() {
    for dir in ["datasets/arith", "datasets/arith/small"] {
        for file in ["sft.jsonl", "sft_columns.jsonl"] {
            check_sft_rows(&root().join(dir), file);
        }
    }
}

/// Checks one worked-answer line of `sft_columns.jsonl`: `x+y+c=s` or `x-y-c=d` holds.
fn column_holds(line: &str) -> bool {
    let Some((lhs, rhs)) = line.split_once('=') else {
        return false;
    };
    let op = if lhs.contains('+') { '+' } else { '-' };
    let terms: Vec<i64> = lhs.split(op).filter_map(|t| t.parse().ok()).collect();
    let Ok(r) = rhs.parse::<i64>() else {
        return false;
    };
    terms.len() == 3
        && r == match op {
            '+' => terms[0] + terms[1] + terms[2],
            _ => terms[0] - terms[1] - terms[2],
        }
}

fn check_sft_rows(dir: &Path, file: &str) {
    let train = load(&dir.join("train.jsonl"), None).unwrap();
    let sft = std::fs::read_to_string(dir.join(file)).unwrap();
    let rows: Vec<&str> = sft.lines().collect();
    assert_eq!(rows.len(), train.items.len(), "{file}");
    for (i, (line, p)) in rows.iter().zip(&train.items).enumerate() {
        let msgs =
            qwen_burn_data::conversation::parse_messages(Path::new(file), i + 1, line).unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            (msgs[0].role.as_str(), msgs[0].content.as_str()),
            ("user", question(&p.text))
        );
        assert_eq!(msgs[1].role, "assistant");
        let content = msgs[1].content.as_str();
        assert!(content.ends_with(&format!("\n#### {}", p.answer)), "{line}");
        if file == "sft_columns.jsonl" {
            // Every column line's sum or difference holds, units first: the last column's
            // result, then the earlier ones' units digits, spell the answer's magnitude.
            let lines: Vec<&str> = content.lines().collect();
            let cols: Vec<&str> = lines[..lines.len() - 1]
                .iter()
                .copied()
                .filter(|l| !l.starts_with("-("))
                .collect();
            assert!(cols.iter().all(|l| column_holds(l)), "{line}");
            let results: Vec<&str> = cols.iter().map(|l| l.split_once('=').unwrap().1).collect();
            let mut magnitude = results[results.len() - 1].to_string();
            for r in results[..results.len() - 1].iter().rev() {
                magnitude.push_str(&r[r.len() - 1..]);
            }
            let magnitude: i64 = magnitude.parse().unwrap();
            assert_eq!(
                magnitude.to_string(),
                p.answer.trim_start_matches('-'),
                "{line}"
            );
        }
    }
    // Every conversation fits the tiny model's 128-token context whole, and a GRPO row of
    // `training.seq_len` 64 (80 for the longer worked answers: configs/grpo.toml).
    let opts = qwen_burn_data::ChatOptions {
        seq_len: 127,
        ..Default::default()
    };
    let ds = qwen_burn_data::SftDataset::load(&dir.join(file), &tok(), &opts).unwrap();
    assert_eq!((ds.len(), ds.stats().truncated), (4000, 0));
    let longest = ds.rows().iter().map(|r| r.ids.len()).max().unwrap();
    let bound = if file == "sft.jsonl" { 64 } else { 80 };
    assert!(longest <= bound, "{file}: {longest} tokens");
}
