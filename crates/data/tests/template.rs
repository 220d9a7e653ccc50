//! Chat templates: Qwen3's real `chat_template` rendered by us is byte-identical to HF
//! transformers' `apply_chat_template` (fixture made by
//! `tests/fixtures/chat_template/make_fixture.py`), for multi-turn conversations with and
//! without a system prompt and with and without the generation prompt; and the SFT loss mask
//! of a template-rendered conversation covers exactly the assistants' replies and their
//! `<|im_end|>`.

mod common;

use common::*;
use qwen_burn_data::{ChatTemplate, Message};

fn qwen_template() -> ChatTemplate {
    ChatTemplate::beside(&qwen_path())
        .unwrap()
        .expect("the vendored Qwen3 tokenizer_config.json has a chat_template")
}

#[test]
fn qwen3_template_renders_byte_identical_to_hf() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat_template/qwen3_rendered.json");
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    assert_eq!(cases.len(), 8);
    let template = qwen_template();
    for case in &cases {
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let prompt = case["add_generation_prompt"].as_bool().unwrap();
        let ours = template.render(&messages, prompt).unwrap();
        assert_eq!(
            ours,
            case["text"].as_str().unwrap(),
            "{} (add_generation_prompt = {prompt})",
            case["name"]
        );
    }
}

#[test]
fn template_loss_mask_covers_the_replies_and_their_end_token_only() {
    let tok = qwen();
    let template = qwen_template();
    let messages = vec![
        Message::new("system", "You are terse."),
        Message::new("user", "Who wrote Emma?"),
        Message::new("assistant", "Jane Austen."),
        Message::new("user", "And Hamlet?"),
        Message::new("assistant", "Shakespeare, around 1600."),
    ];
    let (ids, mask) = template.tokenize(&tok, &messages).unwrap();
    assert_eq!(ids.len(), mask.len());
    // The ids are the tokens of the rendered text.
    let text = template.render(&messages, false).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // Masked tokens, as runs of consecutive positions, decode to the replies + <|im_end|>;
    // the empty <think></think> block Qwen3 adds to the last reply is not trained.
    let mut runs: Vec<Vec<u32>> = Vec::new();
    for (i, (&id, &m)) in ids.iter().zip(&mask).enumerate() {
        if m == 1 {
            if i == 0 || mask[i - 1] == 0 {
                runs.push(Vec::new());
            }
            runs.last_mut().unwrap().push(id);
        }
    }
    let decoded: Vec<String> = runs.iter().map(|r| tok.decode(r).unwrap()).collect();
    assert_eq!(
        decoded,
        vec![
            "Jane Austen.<|im_end|>".to_string(),
            "Shakespeare, around 1600.<|im_end|>".to_string()
        ]
    );
    assert!(text.contains("<think>\n\n</think>\n\nShakespeare"));
}

#[test]
fn no_template_means_chatml_and_a_broken_one_names_the_file() {
    // The shipped tokenizer has no tokenizer_config.json beside it.
    assert!(ChatTemplate::beside(&default_tok_path()).unwrap().is_none());
    let chatml = ChatTemplate::chatml();
    let text = chatml.render(&[Message::new("user", "Hi")], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let tmp = tempfile::tempdir().unwrap();
    let bad = write(
        tmp.path(),
        "tokenizer_config.json",
        br#"{"chat_template": "{% for m in messages %}{{ m.content }"}"#,
    );
    let err = ChatTemplate::from_tokenizer_config(&bad)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("does not compile"),
        "{err}"
    );
}
