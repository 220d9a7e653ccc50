//! SFT lines in TRL's other layouts: prompt-completion (text and conversational) and plain
//! text, tokenised and masked as TRL 1.16.0's `SFTTrainer` does
//! (`fixtures/sft_layouts/make_fixture.py`), also with per-line `chat_template_kwargs` (a
//! template with a thinking switch), and malformed lines as errors naming the line.

use std::path::{Path, PathBuf};

use qwen_burn_data::{
    ChatOptions, ChatTemplate, DataError, SftDataset, SftExample, Tok, parse_example,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sft_layouts")
}

fn tok() -> Tok {
    Tok::from_file(&root().join("datasets/tokenizer.json")).unwrap()
}

#[test]
fn every_layout_trains_on_what_trl_trains_on() {
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    let tok = tok();
    for file in [
        "text_completion.jsonl",
        "chat_completion.jsonl",
        "chat_completion_kwargs.jsonl",
        "text.jsonl",
    ] {
        // The per-line variables' file is rendered with a template that reads them.
        let template = file.contains("kwargs").then(|| {
            let config = fixtures().join("tokenizer_config_think.json");
            std::sync::Arc::new(
                ChatTemplate::from_tokenizer_config(&config)
                    .unwrap()
                    .unwrap(),
            )
        });
        let opts = ChatOptions {
            seq_len: 255,
            pack: false,
            template,
            ..ChatOptions::default()
        };
        let ds = SftDataset::load(&fixtures().join(file), &tok, &opts).unwrap();
        let want = expected[file].as_array().unwrap();
        assert_eq!(ds.len(), want.len(), "{file}");
        for (i, (row, w)) in ds.rows().iter().zip(want).enumerate() {
            let ids: Vec<u32> = serde_json::from_value(w["ids"].clone()).unwrap();
            let mask: Vec<u8> = serde_json::from_value(w["mask"].clone()).unwrap();
            assert_eq!(row.ids, ids, "{file} example {i}: token ids");
            assert_eq!(row.loss_mask, mask, "{file} example {i}: loss mask");
        }
        // The batch trains exactly the masked tokens (position 0 is never a target).
        let b = ds.batch(&[0]);
        let trained = b.targets.iter().filter(|&&t| t >= 0).count();
        let mask: Vec<u8> = serde_json::from_value(want[0]["mask"].clone()).unwrap();
        assert_eq!(trained, mask.iter().skip(1).filter(|&&m| m == 1).count());
    }
}

#[test]
fn the_layouts_are_told_apart_and_bad_lines_name_their_fault() {
    let path = Path::new("data.jsonl");
    let parse = |line: &str| parse_example(path, 3, line);
    assert!(matches!(
        parse(r#"{"prompt": "a", "completion": "b", "source": 1}"#),
        Ok(SftExample::TextCompletion { .. })
    ));
    assert!(matches!(
        parse(r#"{"messages": [{"role": "user", "content": "hi"}]}"#),
        Ok(SftExample::Conversation { .. })
    ));
    assert!(matches!(parse(r#"{"text": "a"}"#), Ok(SftExample::Text(_))));
    for (line, says) in [
        (r#"{"prompt": "a"}"#, "no \"completion\""),
        (r#"{"completion": "a"}"#, "no \"prompt\""),
        (
            r#"{"prompt": "a", "completion": [{"role": "assistant", "content": "b"}]}"#,
            "both strings",
        ),
        (
            r#"{"prompt": [], "completion": []}"#,
            "\"completion\" has no message",
        ),
        (
            r#"{"prompt": [{"role": "user"}], "completion": [{"role": "assistant", "content": "b"}]}"#,
            "prompt[0] has no string field \"content\"",
        ),
        (
            r#"{"text": "a", "prompt": "b", "completion": "c"}"#,
            "more than one layout",
        ),
        (r#"{"text": 5}"#, "\"text\" is a number"),
        (r#"{"text": ""}"#, "\"text\" is empty"),
        (r#"{"answer": "a"}"#, "no \"messages\""),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": [1]}"#,
            "\"chat_template_kwargs\" is an array, expected an object",
        ),
        (
            r#"{"prompt": "a", "completion": "b", "chat_template_kwargs": {"enable_thinking": false}}"#,
            "on a text line",
        ),
        (
            r#"{"text": "a", "chat_template_kwargs": {"enable_thinking": false}}"#,
            "on a text line",
        ),
    ] {
        match parse(line) {
            Err(e @ DataError::Jsonl { line: 3, .. }) => {
                assert!(e.to_string().contains(says), "{line}: {e}")
            }
            other => panic!("{line}: {other:?}"),
        }
    }
}
