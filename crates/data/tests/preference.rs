//! Preference pairs (issue 38): TRL 1.16.0's tokenisation of every layout
//! (`fixtures/preference/make_fixture.py` ran its `DPOTrainer`), and bad rows as errors naming
//! the file, line and field.

use std::path::{Path, PathBuf};

use qwen_burn_data::{ChatTemplate, Tok, Truncation, load_preferences};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/preference")
}

fn tok() -> Tok {
    Tok::from_file(&root().join("datasets/tokenizer.json")).unwrap()
}

#[test]
fn every_layout_tokenises_as_trl_does() {
    let data = load_preferences(
        &fixtures().join("pairs.jsonl"),
        &tok(),
        &ChatTemplate::chatml(),
        "<|endoftext|>",
        None,
        Truncation::KeepStart,
    )
    .unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("trl_tokens.json")).unwrap())
            .unwrap();
    let rows = expected["rows"].as_array().unwrap();
    assert_eq!(data.pairs.len(), rows.len());
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    for (i, (pair, row)) in data.pairs.iter().zip(rows).enumerate() {
        let prompt = &pair.chosen.ids[..pair.chosen.prompt_len];
        assert_eq!(
            prompt,
            ids(&row["prompt_ids"]).as_slice(),
            "row {i}: prompt"
        );
        assert_eq!(
            &pair.rejected.ids[..pair.rejected.prompt_len],
            prompt,
            "row {i}"
        );
        assert_eq!(
            pair.chosen.completion(),
            ids(&row["chosen_ids"]).as_slice(),
            "row {i}: chosen"
        );
        assert_eq!(
            pair.rejected.completion(),
            ids(&row["rejected_ids"]).as_slice(),
            "row {i}: rejected"
        );
    }
    assert_eq!(data.stats.identical, 0);
}

fn load_text(dir: &Path, text: &str) -> qwen_burn_data::Result<qwen_burn_data::PreferenceData> {
    let path = dir.join("pairs.jsonl");
    std::fs::write(&path, text).unwrap();
    load_preferences(
        &path,
        &tok(),
        &ChatTemplate::chatml(),
        "<|endoftext|>",
        Some(12),
        Truncation::KeepStart,
    )
}

#[test]
fn bad_rows_are_errors_naming_the_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"{"prompt": "a b", "chosen": " c", "rejected": " d"}"#;
    for (row, says) in [
        (
            r#"{"prompt": "a", "chosen": " c"}"#,
            "no \"rejected\" field",
        ),
        (
            r#"{"prompt": "a", "chosen": " c", "rejected": " d", "score": 1}"#,
            "unknown field \"score\"",
        ),
        (
            r#"{"prompt": "a", "chosen": "", "rejected": " d"}"#,
            "\"chosen\" is empty",
        ),
        (
            r#"{"prompt": "a", "chosen": " c", "rejected": [{"role": "assistant", "content": "d"}]}"#,
            "both strings",
        ),
        (
            r#"{"prompt": 3, "chosen": " c", "rejected": " d"}"#,
            "\"prompt\" is a number",
        ),
        (
            r#"{"prompt": [{"role": "user"}], "chosen": [{"role": "assistant", "content": "x"}], "rejected": [{"role": "assistant", "content": "y"}]}"#,
            "prompt[0] has no string field \"content\"",
        ),
        (r#"[1, 2]"#, "expected a JSON object"),
    ] {
        let err = load_text(dir.path(), &format!("{good}\n{row}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pairs.jsonl:2") || err.contains("line 2"),
            "{row}: {err}"
        );
        assert!(err.contains(says), "{row}: expected `{says}` in: {err}");
    }
    assert!(
        load_text(dir.path(), "\n")
            .unwrap_err()
            .to_string()
            .contains("no preference pair")
    );
}

#[test]
fn identical_pairs_are_counted_and_long_ones_cut_as_trl_cuts_them() {
    let dir = tempfile::tempdir().unwrap();
    let long = "x ".repeat(40);
    let text = [
        r#"{"prompt": "a b", "chosen": " c", "rejected": " c"}"#.to_string(),
        format!(r#"{{"prompt": "a", "chosen": " {long}", "rejected": " d"}}"#),
        format!(r#"{{"prompt": "{long}", "chosen": " c", "rejected": " d"}}"#),
    ]
    .join("\n");
    let data = load_text(dir.path(), &text).unwrap();
    assert_eq!(data.stats.identical, 1);
    assert_eq!(
        data.stats.dropped, 1,
        "a prompt that fills max_length is dropped (keep_start)"
    );
    assert_eq!(data.pairs.len(), 2);
    assert_eq!(data.pairs[1].chosen.ids.len(), 12, "cut to max_length");
    assert_eq!(data.stats.truncated, 1);
    let path = dir.path().join("pairs.jsonl");
    let end = load_preferences(
        &path,
        &tok(),
        &ChatTemplate::chatml(),
        "<|endoftext|>",
        Some(12),
        Truncation::KeepEnd,
    )
    .unwrap();
    assert_eq!(end.pairs.len(), 3, "keep_end drops nothing");
    let last = &end.pairs[2].chosen;
    assert_eq!(last.ids.len(), 12);
    assert_eq!(
        last.completion().len(),
        2,
        "the completion (` c` and EOS) is kept whole"
    );
}

#[test]
fn training_rows_are_as_long_as_the_longest_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let text = [
        r#"{"prompt": "a b", "chosen": " c d e f g", "rejected": " c"}"#,
        r#"{"prompt": "a", "chosen": " b", "rejected": " d e"}"#,
    ]
    .join("\n");
    let data = load_text(dir.path(), &text).unwrap();
    let longest = |pairs: &[usize]| {
        pairs
            .iter()
            .flat_map(|&i| {
                [
                    data.pairs[i].chosen.ids.len(),
                    data.pairs[i].rejected.ids.len(),
                ]
            })
            .max()
            .unwrap()
    };
    for pairs in [vec![0, 1], vec![1]] {
        let t = longest(&pairs);
        let short = data.batch_to_longest(&pairs, 64, 0, 5);
        let full = data.batch(&pairs, 64, 0, 5);
        assert_eq!((short.seq_len, short.batch_size), (t, 2 * pairs.len()));
        assert_eq!(short.pairs, full.pairs);
        // Each row is the full row's first `t` columns; the rest of the full row is padding.
        for r in 0..short.batch_size {
            let cut = |v: &[i64]| v[r * 64..r * 64 + t].to_vec();
            let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
            let row = r * t..(r + 1) * t;
            assert_eq!(widen(&short.inputs[row.clone()]), cut(&widen(&full.inputs)));
            assert_eq!(short.targets[row.clone()].to_vec(), cut(&full.targets));
            let (ms, mf) = (short.attention_mask.as_ref(), full.attention_mask.as_ref());
            assert_eq!(ms.unwrap()[row], mf.unwrap()[r * 64..r * 64 + t]);
            assert!(
                mf.unwrap()[r * 64 + t..(r + 1) * 64]
                    .iter()
                    .all(|&m| m == 0)
            );
        }
    }
    // Never longer than seq_len.
    assert_eq!(data.batch_to_longest(&[0, 1], 3, 0, 0).seq_len, 3);
}
