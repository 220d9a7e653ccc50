//! Multiple-choice tasks: reading the common benchmark layouts (JSONL or Parquet) into prompts
//! and choices, as lm-evaluation-harness's default task templates render them.
//!
//! A task file holds one question per row. The layout is recognised from the first row's fields:
//!
//! | layout | fields | prompt (`doc_to_text`) | choices | gold |
//! |---|---|---|---|---|
//! | HellaSwag | `ctx` (or `ctx_a` + `ctx_b`), `endings`, `label`, optional `activity_label` | `preprocess(activity_label + ": " + ctx)` | `preprocess(ending)` | `label` |
//! | ARC | `question`, `choices.text`, `choices.label`, `answerKey` | `"Question: {question}\nAnswer:"` | `choices.text` | index of `answerKey` in `choices.label` |
//! | PIQA | `goal`, `sol1`, `sol2`, `label` | `"Question: {goal}\nAnswer:"` | `sol1`, `sol2` | `label` |
//! | MMLU | `question`, `choices`, `answer`, optional `subject` | question, then `"\nA. {c0}\nB. {c1}..."` and `"\nAnswer:"` | `"A"`, `"B"`, ... | `answer` |
//! | plain | `context`, `choices`, `gold` | `context` | `choices` | `gold` |
//!
//! HellaSwag's `ctx` is `ctx_a + " " + capitalize(ctx_b)` when both parts are present, and
//! `preprocess` is lm-evaluation-harness's: strip, `" [title]"` becomes `". "`, other `[...]`
//! tags are removed, double spaces become one. MMLU rows with a `subject` get the harness's
//! description, "The following are multiple choice questions (with answers) about {subject}.",
//! before the prompt and its few-shot examples.
//!
//! A choice is scored as the continuation `" " + choice` of the prompt (the harness's
//! `target_delimiter`); few-shot examples are `prompt + " " + gold choice`, each followed by a
//! blank line (its `fewshot_delimiter`).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{DataError, Result};

/// Separates a prompt from a choice (lm-evaluation-harness's `target_delimiter`).
pub const TARGET_DELIMITER: &str = " ";
/// Follows each few-shot example (the harness's `fewshot_delimiter`).
pub const FEWSHOT_DELIMITER: &str = "\n\n";
/// Rows a task file may hold: far above any benchmark (MMLU's test split has 14042), and a
/// bound on what a hostile file can make the reader allocate row by row.
pub const MAX_ROWS: usize = 1_000_000;
/// Choices a question may have.
pub const MAX_CHOICES: usize = 64;

/// The row layouts [`read_task`] recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `ctx` / `ctx_a` + `ctx_b`, `endings`, `label`.
    HellaSwag,
    /// `question`, `choices.{text,label}`, `answerKey`.
    Arc,
    /// `goal`, `sol1`, `sol2`, `label`.
    Piqa,
    /// `question`, `choices`, `answer`.
    Mmlu,
    /// `context`, `choices`, `gold`.
    Plain,
}

impl Layout {
    /// The layout's name as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Layout::HellaSwag => "hellaswag",
            Layout::Arc => "arc",
            Layout::Piqa => "piqa",
            Layout::Mmlu => "mmlu",
            Layout::Plain => "plain",
        }
    }

    /// The layout whose required fields `row` has.
    fn detect(row: &Map<String, Value>) -> Option<Layout> {
        let has = |k: &str| row.contains_key(k);
        if has("endings") && has("label") && (has("ctx") || (has("ctx_a") && has("ctx_b"))) {
            Some(Layout::HellaSwag)
        } else if has("question")
            && has("answerKey")
            && row.get("choices").is_some_and(Value::is_object)
        {
            Some(Layout::Arc)
        } else if has("goal") && has("sol1") && has("sol2") && has("label") {
            Some(Layout::Piqa)
        } else if has("question")
            && has("answer")
            && row.get("choices").is_some_and(Value::is_array)
        {
            Some(Layout::Mmlu)
        } else if has("context") && has("choices") && has("gold") {
            Some(Layout::Plain)
        } else {
            None
        }
    }
}

/// The fields each layout needs, for the error on an unknown one.
const LAYOUTS_EXPECTED: &str = "HellaSwag (ctx or ctx_a+ctx_b, endings, label), ARC (question, \
     choices.text, choices.label, answerKey), PIQA (goal, sol1, sol2, label), MMLU (question, \
     choices, answer) or plain (context, choices, gold)";

/// One question, rendered.
#[derive(Debug, Clone, PartialEq)]
pub struct McItem {
    /// Text that goes once before the few-shot examples and the prompt (MMLU's subject line,
    /// with its blank line), else empty.
    pub description: String,
    /// The prompt (`doc_to_text`).
    pub prompt: String,
    /// The choices, without the target delimiter.
    pub choices: Vec<String>,
    /// Index of the right choice.
    pub gold: usize,
}

impl McItem {
    /// This question as a few-shot example: the prompt and its right answer.
    pub(crate) fn as_example(&self) -> String {
        format!(
            "{}{TARGET_DELIMITER}{}{FEWSHOT_DELIMITER}",
            self.prompt, self.choices[self.gold]
        )
    }
}

/// A task file, read.
#[derive(Debug, Clone)]
pub struct McTask {
    /// The file.
    pub path: PathBuf,
    /// Its layout.
    pub layout: Layout,
    /// Its questions, in file order.
    pub items: Vec<McItem>,
    /// Where few-shot examples come from when not from the task's other questions: a train or
    /// dev split ([`McTask::with_fewshot`]).
    pub fewshot: Option<Fewshot>,
}

/// A few-shot split: its file, examples and how they are picked.
#[derive(Debug, Clone)]
pub struct Fewshot {
    /// The file.
    pub path: PathBuf,
    /// Its questions, in file order.
    pub items: Vec<McItem>,
    /// How `shots` of them are picked.
    pub sampler: FewshotSampler,
}

/// lm-evaluation-harness's few-shot samplers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FewshotSampler {
    /// The split's first `shots` questions, for every question (the harness's `first_n`, what
    /// MMLU uses with its dev split): the harness's exact examples.
    FirstN,
    /// A uniform draw without replacement, seeded by the seed and the question's index (the
    /// harness's `default` sampler draws with Python's `random.Random(1234)` across questions
    /// in order: the same law, other draws).
    Random,
}

fn task_error(path: &Path, row: usize, message: impl Into<String>) -> DataError {
    DataError::Task {
        path: path.to_path_buf(),
        row: row + 1,
        message: message.into(),
    }
}

/// Read a multiple-choice task: Parquet when the name ends in `.parquet`, else JSONL (one JSON
/// object per line; `.gz` read transparently). The layout is taken from the first row; every
/// row must then have that layout's fields, and an error names the file, the row and the field.
pub fn read_task(path: &Path) -> Result<McTask> {
    let rows = if path.extension().is_some_and(|e| e == "parquet") {
        crate::parquet_source::read_rows(path, MAX_ROWS)?
    } else {
        read_jsonl_rows(path)?
    };
    let Some((_, first)) = rows.first() else {
        return Err(task_error(path, 0, "the task file has no questions"));
    };
    let Some(layout) = Layout::detect(first) else {
        let mut found: Vec<&str> = first.keys().map(String::as_str).collect();
        found.sort_unstable();
        return Err(task_error(
            path,
            rows[0].0,
            format!(
                "unknown task layout: the row has fields {found:?}; expected {LAYOUTS_EXPECTED}"
            ),
        ));
    };
    let items = rows
        .iter()
        .map(|(row, fields)| {
            parse_item(layout, fields)
                .map_err(|m| task_error(path, *row, format!("{} layout: {m}", layout.name())))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(McTask {
        fewshot: None,
        path: path.to_path_buf(),
        layout,
        items,
    })
}

/// The objects of a JSONL file with their 0-based line numbers (blank lines skipped).
fn read_jsonl_rows(path: &Path) -> Result<Vec<(usize, Map<String, Value>)>> {
    let text = crate::ingest::read_text_file(path)?;
    let mut rows = Vec::new();
    for (line, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        if rows.len() == MAX_ROWS {
            return Err(task_error(
                path,
                line,
                format!("more than {MAX_ROWS} questions"),
            ));
        }
        match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(map)) => rows.push((line, map)),
            Ok(other) => {
                return Err(task_error(
                    path,
                    line,
                    format!("expected a JSON object, found {}", json_kind(&other)),
                ));
            }
            Err(e) => return Err(task_error(path, line, format!("not valid JSON: {e}"))),
        }
    }
    Ok(rows)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn field<'a>(row: &'a Map<String, Value>, key: &str) -> std::result::Result<&'a Value, String> {
    row.get(key).ok_or_else(|| format!("missing field `{key}`"))
}

fn string(row: &Map<String, Value>, key: &str) -> std::result::Result<String, String> {
    match field(row, key)? {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!(
            "`{key}` is {}, expected a string",
            json_kind(other)
        )),
    }
}

fn strings(v: &Value, key: &str) -> std::result::Result<Vec<String>, String> {
    let Value::Array(list) = v else {
        return Err(format!(
            "`{key}` is {}, expected a list of strings",
            json_kind(v)
        ));
    };
    if list.len() < 2 || list.len() > MAX_CHOICES {
        return Err(format!(
            "`{key}` has {} entries, expected 2 to {MAX_CHOICES} choices",
            list.len()
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, c)| match c {
            Value::String(s) => Ok(s.clone()),
            other => Err(format!(
                "`{key}[{i}]` is {}, expected a string",
                json_kind(other)
            )),
        })
        .collect()
}

/// An answer index given as a number or a numeral string (HellaSwag's `label` is `"2"`).
fn index(
    row: &Map<String, Value>,
    key: &str,
    choices: usize,
) -> std::result::Result<usize, String> {
    let v = field(row, key)?;
    let i = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("`{key}` is {v}, expected a choice index (a non-negative integer)"))?;
    if i as usize >= choices || i > u32::MAX as u64 {
        return Err(format!(
            "`{key}` is {i} but there are {choices} choices (0-based)"
        ));
    }
    Ok(i as usize)
}

fn parse_item(layout: Layout, row: &Map<String, Value>) -> std::result::Result<McItem, String> {
    let mut description = String::new();
    let (prompt, choices, gold) = match layout {
        Layout::HellaSwag => {
            let ctx = match (row.get("ctx_a"), row.get("ctx_b")) {
                (Some(_), Some(_)) => {
                    format!(
                        "{} {}",
                        string(row, "ctx_a")?,
                        capitalize(&string(row, "ctx_b")?)
                    )
                }
                _ => string(row, "ctx")?,
            };
            let query = match row.get("activity_label") {
                Some(_) => format!("{}: {ctx}", string(row, "activity_label")?),
                None => ctx,
            };
            let choices: Vec<String> = strings(field(row, "endings")?, "endings")?
                .iter()
                .map(|e| hellaswag_preprocess(e))
                .collect();
            let gold = index(row, "label", choices.len())?;
            (hellaswag_preprocess(&query), choices, gold)
        }
        Layout::Arc => {
            let question = string(row, "question")?;
            let Value::Object(c) = field(row, "choices")? else {
                return Err("`choices` must be an object with `text` and `label` lists".into());
            };
            let text = strings(
                c.get("text").ok_or("missing field `choices.text`")?,
                "choices.text",
            )?;
            let labels = strings(
                c.get("label").ok_or("missing field `choices.label`")?,
                "choices.label",
            )?;
            if labels.len() != text.len() {
                return Err(format!(
                    "`choices.text` has {} entries but `choices.label` has {}",
                    text.len(),
                    labels.len()
                ));
            }
            let key = string(row, "answerKey")?;
            let gold = labels.iter().position(|l| *l == key).ok_or_else(|| {
                format!("`answerKey` {key:?} is not one of `choices.label` {labels:?}")
            })?;
            (format!("Question: {question}\nAnswer:"), text, gold)
        }
        Layout::Piqa => {
            let choices = vec![string(row, "sol1")?, string(row, "sol2")?];
            let gold = index(row, "label", 2)?;
            (
                format!("Question: {}\nAnswer:", string(row, "goal")?),
                choices,
                gold,
            )
        }
        Layout::Mmlu => {
            let options = strings(field(row, "choices")?, "choices")?;
            if options.len() > 26 {
                return Err(format!(
                    "`choices` has {} entries; MMLU letters go to Z (26)",
                    options.len()
                ));
            }
            let gold = index(row, "answer", options.len())?;
            if row.contains_key("subject") {
                description = format!(
                    "The following are multiple choice questions (with answers) about {}.{FEWSHOT_DELIMITER}",
                    string(row, "subject")?.replace('_', " ")
                );
            }
            let mut prompt = string(row, "question")?.trim().to_string();
            let letters: Vec<String> = (b'A'..)
                .take(options.len())
                .map(|b| (b as char).to_string())
                .collect();
            for (letter, option) in letters.iter().zip(&options) {
                prompt.push_str(&format!("\n{letter}. {option}"));
            }
            prompt.push_str("\nAnswer:");
            (prompt, letters, gold)
        }
        Layout::Plain => {
            let choices = strings(field(row, "choices")?, "choices")?;
            let gold = index(row, "gold", choices.len())?;
            (string(row, "context")?, choices, gold)
        }
    };
    Ok(McItem {
        description,
        prompt,
        choices,
        gold,
    })
}

/// Python's `str.capitalize`: the first char upper case, the rest lower case. (Python title-cases
/// the first char: that differs from upper case only for a few chars such as `ß` and the
/// `ǆ` digraphs.)
fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

/// lm-evaluation-harness's HellaSwag `preprocess`: strip; `" [title]"` becomes `". "`; other
/// bracketed tags are removed; double spaces become single (one pass, as `str.replace` does).
pub fn hellaswag_preprocess(text: &str) -> String {
    let text = text.trim().replace(" [title]", ". ");
    // re.sub("\\[.*?\\]", "", text): each `[` up to the nearest `]` goes; a `[` with no `]`
    // after it stays.
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out.replace("  ", " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preprocess_matches_the_harness() {
        assert_eq!(
            hellaswag_preprocess("  A man [title] is seen [header] talking.  Then  "),
            "A man. is seen talking. Then"
        );
        // An unclosed bracket stays; `"   "` -> `"  "` after one pass of replace.
        assert_eq!(hellaswag_preprocess("a [b c"), "a [b c");
        assert_eq!(hellaswag_preprocess("a    b"), "a  b");
    }

    #[test]
    fn capitalize_is_pythons() {
        assert_eq!(capitalize("hELLO World"), "Hello world");
        assert_eq!(capitalize(""), "");
    }
}
