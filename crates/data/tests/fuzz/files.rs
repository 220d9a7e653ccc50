//! Fuzz cases of Parquet rows and multiple-choice task files.

use super::*;

/// Small valid Parquet files written with the `parquet` crate: a nullable UTF8 column beside
/// an INT64 one, several row groups and pages, each codec we read, with and without dictionary
/// encoding; and the fixture written by pyarrow.
fn parquet_seeds() -> Vec<Vec<u8>> {
    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    let schema = Arc::new(
        parse_message_type(
            "message schema { optional binary text (UTF8); required int64 id; optional binary raw; }",
        )
        .unwrap(),
    );
    let docs = [
        "It is a truth universally acknowledged",
        "",
        "To be, or not to be",
        "東京 Café",
        "   ",
        "last",
    ];
    let mut seeds = Vec::new();
    for (codec, dictionary) in [
        (Compression::UNCOMPRESSED, false),
        (Compression::SNAPPY, true),
        (Compression::LZ4_RAW, false),
        (Compression::LZ4, true),
    ] {
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(codec)
                .set_dictionary_enabled(dictionary)
                .set_data_page_row_count_limit(2)
                .set_write_batch_size(2)
                .build(),
        );
        let mut buf = Vec::new();
        let mut writer = SerializedFileWriter::new(&mut buf, schema.clone(), props).unwrap();
        for group in docs.chunks(3) {
            let mut rg = writer.next_row_group().unwrap();
            let mut index = 0;
            while let Some(mut col) = rg.next_column().unwrap() {
                match index {
                    0 | 2 => {
                        // Every third cell is null.
                        let defs: Vec<i16> =
                            (0..group.len()).map(|i| i16::from(i % 3 != 1)).collect();
                        let values: Vec<ByteArray> = group
                            .iter()
                            .zip(&defs)
                            .filter(|(_, d)| **d == 1)
                            .map(|(s, _)| ByteArray::from(*s))
                            .collect();
                        col.typed::<ByteArrayType>()
                            .write_batch(&values, Some(&defs), None)
                            .unwrap();
                    }
                    _ => {
                        let ids: Vec<i64> = (0..group.len() as i64).collect();
                        col.typed::<Int64Type>()
                            .write_batch(&ids, None, None)
                            .unwrap();
                    }
                }
                col.close().unwrap();
                index += 1;
            }
            rg.close().unwrap();
        }
        writer.close().unwrap();
        seeds.push(buf);
    }
    seeds.push(include_bytes!("../fixtures/parquet/docs.parquet").to_vec());
    seeds
}

#[test]
fn parquet_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    let dict = Arc::new(Dictionary {
        seeds: parquet_seeds(),
        extremes: support::JSON_EXTREMES,
        keys: Vec::new(),
    });
    let strategy = (
        support::mutated(dict, support::byte_edit().boxed()),
        prop::sample::select(vec!["text", "id", "raw", "missing"]),
    );
    let tally = Tally::default();
    support::run(
        "Parquet rows (ingest::load: ParquetDocuments::open, next_row_group)",
        strategy,
        &tally,
        |(Bytes(input), column)| {
            write(&path, &input);
            let src = SourceFile::from_path(&path);
            assert_eq!(src.kind, SourceKind::Parquet);
            let (result, peak) = support::measure(&input, || ingest::load(&src, column));
            tally.add(result.is_ok(), input.len(), peak);
            PARQUET_BOUND.check("parquet", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &path)?;
            }
            Ok(())
        },
    );
}

/// Multiple-choice task rows of every layout.
const TASK_SEEDS: &[&str] = &[
    r#"{"context": "The sky is", "choices": ["blue", "green"], "gold": 0}
{"context": "Grass is ", "choices": ["blue", "green", "red"], "gold": "1"}"#,
    r#"{"activity_label": "Baking", "ctx_a": "a man bakes.", "ctx_b": "he", "ctx": "x", "endings": ["eats [title] it.", "[header] sleeps."], "label": "1"}"#,
    r#"{"id": "q", "question": "Which?", "choices": {"text": ["a", "b", "c"], "label": ["A", "B", "C"]}, "answerKey": "C"}"#,
    r#"{"goal": "open a jar", "sol1": "twist", "sol2": "hit", "label": 0}"#,
    r#"{"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1}"#,
];
const TASK_KEYS: &[&str] = &[
    "context",
    "choices",
    "gold",
    "ctx",
    "ctx_a",
    "ctx_b",
    "endings",
    "label",
    "activity_label",
    "question",
    "answerKey",
    "text",
    "goal",
    "sol1",
    "sol2",
    "answer",
    "subject",
];

/// Task files (`read_task`, then every question's few-shot context): JSONL of every layout,
/// and Parquet (the ARC and HellaSwag fixtures, nested columns as HF `datasets` writes them).
#[test]
fn task_files() {
    let dir = tempfile::tempdir().unwrap();
    let dict = dictionary(
        TASK_SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        TASK_KEYS,
    );
    let jsonl = dir.path().join("task.jsonl");
    let tally = Tally::default();
    let read_all = |path: &Path| {
        qwen_burn_data::read_task(path).and_then(|task| {
            (0..task.items.len().min(64))
                .map(|i| task.context(i, 1.min(task.items.len() - 1), 7))
                .collect::<Result<Vec<_>, _>>()
        })
    };
    support::run(
        "task JSONL (read_task)",
        support::mutated(dict, support::edit().boxed()),
        &tally,
        |Bytes(input)| {
            write(&jsonl, &input);
            let (result, peak) = support::measure(&input, || read_all(&jsonl));
            tally.add(result.is_ok(), input.len(), peak);
            JSON_BOUND.check("task JSONL", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &jsonl)?;
            }
            Ok(())
        },
    );
    let parquet = dir.path().join("task.parquet");
    let dict = Arc::new(Dictionary {
        seeds: vec![
            include_bytes!("../fixtures/tasks/arc.parquet").to_vec(),
            include_bytes!("../fixtures/tasks/hellaswag.parquet").to_vec(),
        ],
        extremes: support::JSON_EXTREMES,
        keys: Vec::new(),
    });
    let tally = Tally::default();
    support::run(
        "task Parquet (read_task)",
        support::mutated(dict, support::byte_edit().boxed()),
        &tally,
        |Bytes(input)| {
            write(&parquet, &input);
            let (result, peak) = support::measure(&input, || read_all(&parquet));
            tally.add(result.is_ok(), input.len(), peak);
            PARQUET_BOUND.check("task parquet", input.len(), peak)?;
            if let Err(e) = &result {
                check_names_file(e, &parquet)?;
            }
            Ok(())
        },
    );
}
