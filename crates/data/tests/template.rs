//! Chat templates: Qwen3's real `chat_template` rendered by us is byte-identical to HF
//! transformers' `apply_chat_template` (fixture made by
//! `tests/fixtures/chat_template/make_fixture.py`), for multi-turn conversations with and
//! without a system prompt and with and without the generation prompt, and with Qwen3's
//! `enable_thinking` given as a template variable (`chat_template_kwargs`); and the SFT loss mask
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
    assert_eq!(cases.len(), 16);
    let mut non_thinking = 0;
    for case in &cases {
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let prompt = case["add_generation_prompt"].as_bool().unwrap();
        let kwargs = case.get("kwargs").map(|k| k.as_object().unwrap().clone());
        let template = match &kwargs {
            Some(k) => qwen_template().with_kwargs(k.clone(), "kwargs").unwrap(),
            None => qwen_template(),
        };
        let ours = template.render(&messages, prompt).unwrap();
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            ours, text,
            "{} (add_generation_prompt = {prompt}, {kwargs:?})",
            case["name"]
        );
        // The variable reaches the template: HF's non-thinking prompt ends in an empty block.
        if prompt && kwargs.is_some_and(|k| k["enable_thinking"] == false) {
            assert!(text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
            non_thinking += 1;
        }
    }
    assert_eq!(non_thinking, 2);
}

#[test]
fn template_variables_are_checked_against_what_the_template_reads() {
    let kwargs = |json: &str| serde_json::from_str::<qwen_burn_data::TemplateKwargs>(json).unwrap();
    // A variable the template never reads would be ignored by transformers: refused here,
    // naming the key and the variables the template does read.
    let err = qwen_template()
        .with_kwargs(
            kwargs(r#"{"enable_thinkin": false}"#),
            "data.chat_template_kwargs",
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer_config.json"), "{err}");
    assert!(
        err.contains("data.chat_template_kwargs.enable_thinkin: the chat template never reads"),
        "{err}"
    );
    assert!(err.contains("enable_thinking, tools"), "{err}");
    // The variables qwen-burn sets itself.
    let err = qwen_template()
        .with_kwargs(kwargs(r#"{"add_generation_prompt": true}"#), "k")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("k.add_generation_prompt: qwen-burn sets"),
        "{err}"
    );
    // The built-in ChatML reads none.
    let err = ChatTemplate::chatml()
        .with_kwargs(kwargs(r#"{"enable_thinking": false}"#), "k")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("built-in ChatML template reads no variables"),
        "{err}"
    );
    assert!(
        ChatTemplate::chatml()
            .with_kwargs(kwargs("{}"), "k")
            .is_ok()
    );
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

/// With Qwen3's real template and `enable_thinking = false` (`data.chat_template_kwargs`), GRPO's
/// prompts end in the empty reasoning block, as HF's non-thinking mode renders them.
#[test]
fn template_variables_reach_rendered_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prompts.jsonl");
    std::fs::write(
        &path,
        r#"{"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}"#,
    )
    .unwrap();
    let kwargs = serde_json::json!({"enable_thinking": false});
    let template = qwen_template()
        .with_kwargs(kwargs.as_object().unwrap().clone(), "kwargs")
        .unwrap();
    let tok = qwen();
    let set = qwen_burn_data::load_prompts(&path, &tok, &template, None).unwrap();
    let text = &set.items[0].text;
    assert!(
        text.ends_with("2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{text:?}"
    );
    assert_eq!(set.items[0].ids, tok.encode(text).unwrap());
}

/// A line's own `chat_template_kwargs` (TRL's per-example column) renders that line's prompt,
/// in prompt files and preference pairs; the others keep the template's defaults. On a text
/// prompt, or naming a variable the template never reads, it is an error naming the line.
#[test]
fn a_line_s_own_template_variables_render_that_line() {
    let dir = tempfile::tempdir().unwrap();
    let tok = qwen();
    let user = r#"[{"role": "user", "content": "What is 2 + 2?"}]"#;
    let own = r#""chat_template_kwargs": {"enable_thinking": false}"#;
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        format!(
            "{{\"prompt\": {user}, \"answer\": \"4\", {own}}}\n{{\"prompt\": {user}, \"answer\": \"4\"}}\n"
        ),
    )
    .unwrap();
    let set = qwen_burn_data::load_prompts(&prompts, &tok, &qwen_template(), None).unwrap();
    assert!(
        set.items[0]
            .text
            .ends_with("assistant\n<think>\n\n</think>\n\n")
    );
    assert!(
        set.items[1]
            .text
            .ends_with("2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    );
    let pairs = dir.path().join("pairs.jsonl");
    let reply = |t: &str| format!(r#"[{{"role": "assistant", "content": "{t}"}}]"#);
    std::fs::write(
        &pairs,
        format!(
            "{{\"prompt\": {user}, \"chosen\": {}, \"rejected\": {}, {own}}}\n",
            reply("4."),
            reply("5.")
        ),
    )
    .unwrap();
    let data = qwen_burn_data::load_preferences(
        &pairs,
        &tok,
        &qwen_template(),
        "<|im_end|>",
        None,
        qwen_burn_data::Truncation::KeepStart,
    )
    .unwrap();
    let chosen = &data.pairs[0].chosen;
    let prompt = tok.decode(&chosen.ids[..chosen.prompt_len]).unwrap();
    assert!(
        prompt.ends_with("assistant\n<think>\n\n</think>\n\n"),
        "{prompt:?}"
    );
    assert!(tok.decode(chosen.completion()).unwrap().starts_with("4."));
    for (line, says) in [
        (
            format!(r#"{{"prompt": "2 + 2?", "answer": "4", {own}}}"#),
            "prompts.jsonl:1: \"chat_template_kwargs\" on a text prompt",
        ),
        (
            format!(
                r#"{{"prompt": {user}, "answer": "4", "chat_template_kwargs": {{"think": 1}}}}"#
            ),
            "prompts.jsonl:1: chat template of",
        ),
    ] {
        std::fs::write(&prompts, line).unwrap();
        let err = qwen_burn_data::load_prompts(&prompts, &tok, &qwen_template(), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{err}");
    }
}
