//! `generate` reads the model's `generation_config.json` like HF: its eos list and its sampling
//! defaults, with the flags winning; the tokenizer's chat end token always stops.

mod common;
use common::*;

use serde_json::{Value, json};

/// `generate --json` with `base` then `extra` arguments.
fn run_generate(model: &std::path::Path, base: &[&str], extra: &[&str]) -> Value {
    let mut args = vec!["generate", "--model", s(model), "--json"];
    args.extend_from_slice(base);
    args.extend_from_slice(extra);
    let out = ok(&qwen_burn(&args, &[]));
    serde_json::from_str(out.trim()).expect("generate --json prints JSON")
}

/// 8 tokens after a fixed 3-token prompt.
fn generate(model: &std::path::Path, extra: &[&str]) -> Value {
    run_generate(
        model,
        &["--prompt-ids", "5,17,300", "--max-new-tokens", "8"],
        extra,
    )
}

/// 2 tokens after a chat prompt.
fn generate_chat(model: &std::path::Path, extra: &[&str]) -> Value {
    run_generate(model, &["--max-new-tokens", "2"], extra)
}

fn ids(v: &Value) -> Vec<u64> {
    v["new_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn generation_config_sets_stop_tokens_and_sampling_defaults() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 3, 3, "");
    let run = tmp.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    let hf = tmp.path().join("hf");
    ok(&qwen_burn(
        &["export", "--checkpoint", s(&run), "--out", s(&hf)],
        &[],
    ));
    // Like a real Qwen3: config.json names one eos id (here one the model never produces).
    let cfg_path = hf.join("config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["eos_token_id"] = json!(8000);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();

    // Without generation_config.json: greedy; stops on config.json's eos and the tokenizer's
    // <|endoftext|> (0) and <|im_end|> (2).
    let plain = generate(&hf, &[]);
    assert_eq!(plain["sampling"]["temperature"], 0.0);
    assert_eq!(plain["sampling"]["stop_tokens"], json!([8000, 0, 2]));
    let greedy = ids(&plain);
    assert!(greedy.len() >= 2, "{greedy:?}");
    // The last token that first appears before the end: stopping on it must cut the output.
    let cut = (0..greedy.len() - 1)
        .rev()
        .find(|&i| !greedy[..i].contains(&greedy[i]))
        .unwrap();

    std::fs::write(
        hf.join("generation_config.json"),
        json!({"eos_token_id": [greedy[cut], 0], "bos_token_id": 0,
               "transformers_version": "4.51.0"})
        .to_string(),
    )
    .unwrap();
    let stopped = generate(&hf, &[]);
    assert_eq!(ids(&stopped), greedy[..=cut].to_vec());
    assert_eq!(stopped["stopped_on_eos"], true);
    assert_eq!(
        stopped["sampling"]["stop_tokens"],
        json!([8000, greedy[cut], 0, 2])
    );
    assert_eq!(ids(&generate(&hf, &["--ignore-eos"])), greedy);

    // Sampling defaults come from the file; flags override them.
    std::fs::write(
        hf.join("generation_config.json"),
        json!({"eos_token_id": [0], "do_sample": true, "temperature": 0.5, "top_k": 5,
               "top_p": 0.9, "repetition_penalty": 1.0})
        .to_string(),
    )
    .unwrap();
    let sampled = generate(&hf, &["--seed", "3"]);
    let sp = &sampled["sampling"];
    assert_eq!(
        (sp["temperature"].as_f64(), sp["top_k"].as_u64()),
        (Some(0.5), Some(5))
    );
    assert!((sp["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6, "{sp}");
    let again = generate(&hf, &["--seed", "3"]);
    assert_eq!(
        ids(&sampled),
        ids(&again),
        "seeded sampling is deterministic"
    );
    let forced = generate(&hf, &["--temperature", "0"]);
    assert_eq!(forced["sampling"]["temperature"], 0.0);
    assert_eq!(forced["sampling"]["top_k"], Value::Null);
    let k3 = generate(&hf, &["--top-k", "3", "--temperature", "1.5"]);
    assert_eq!(k3["sampling"]["top_k"], 3);
    assert_eq!(k3["sampling"]["temperature"], 1.5);

    // A key that changes the output and is not implemented is named in a warning.
    std::fs::write(
        hf.join("generation_config.json"),
        json!({"eos_token_id": [0], "repetition_penalty": 1.3}).to_string(),
    )
    .unwrap();
    let out = qwen_burn(
        &[
            "generate",
            "--model",
            s(&hf),
            "--prompt-ids",
            "5",
            "--max-new-tokens",
            "2",
        ],
        &[],
    );
    ok(&out);
    assert!(
        stderr(&out).contains("not supported by qwen-burn, ignored: repetition_penalty = 1.3"),
        "{}",
        stderr(&out)
    );
}

/// `--chat` renders the message with the template of `tokenizer_config.json` beside the
/// model's tokenizer and the generation prompt; `--chat-json` takes a whole conversation;
/// without a template the prompt is ChatML. `--chat-template-kwargs` gives the template extra
/// variables (Qwen3's `enable_thinking`); one it never reads, or any for ChatML, is refused.
#[test]
fn chat_prompts_use_the_model_template() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 2, 2, "");
    let run = tmp.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&run)],
        &[],
    ));
    let hf = tmp.path().join("hf");
    ok(&qwen_burn(
        &["export", "--checkpoint", s(&run), "--out", s(&hf)],
        &[],
    ));
    let decode = |v: &Value| {
        let ids: Vec<String> = v["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.to_string())
            .collect();
        let out = ok(&qwen_burn(
            &[
                "tokenizer",
                "decode",
                "--tokenizer",
                s(&hf.join("tokenizer.json")),
                "--ids",
                &ids.join(","),
            ],
            &[],
        ));
        out.strip_suffix('\n').unwrap_or(&out).to_string()
    };
    // No tokenizer_config.json: ChatML.
    let v = generate_chat(&hf, &["--chat", "Hi there"]);
    assert_eq!(
        decode(&v),
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    let no_thinking = r#"{"enable_thinking": false}"#;
    let refused = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", s(&hf), "--max-new-tokens", "2"];
        args.extend_from_slice(extra);
        let out = qwen_burn(&args, &[]);
        assert!(!out.status.success());
        stderr(&out)
    };
    let err = refused(&["--chat", "Hi", "--chat-template-kwargs", no_thinking]);
    assert!(
        err.contains("--chat-template-kwargs.enable_thinking: the built-in ChatML"),
        "{err}"
    );
    // The model's own template.
    std::fs::write(
        hf.join("tokenizer_config.json"),
        json!({"chat_template": "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% if enable_thinking is defined and enable_thinking is false %}<no think>{% endif %}{% endif %}"}).to_string(),
    )
    .unwrap();
    let v = generate_chat(&hf, &["--chat", "Hi there", "--system", "Be brief."]);
    assert_eq!(decode(&v), "[system]Be brief.\n[user]Hi there\n[assistant]");
    let v = generate_chat(
        &hf,
        &["--chat", "Hi", "--chat-template-kwargs", no_thinking],
    );
    assert_eq!(decode(&v), "[user]Hi\n[assistant]<no think>");
    let err = refused(&[
        "--chat",
        "Hi",
        "--chat-template-kwargs",
        r#"{"thinking": false}"#,
    ]);
    assert!(
        err.contains("--chat-template-kwargs.thinking: the chat template never reads `thinking`")
            && err.contains("reads: enable_thinking"),
        "{err}"
    );
    let err = refused(&["--prompt", "Hi", "--chat-template-kwargs", no_thinking]);
    assert!(
        err.contains("read with --chat or --chat-json only"),
        "{err}"
    );
    let err = refused(&["--chat", "Hi", "--chat-template-kwargs", "[1]"]);
    assert!(
        err.contains("expected a JSON object of template variables"),
        "{err}"
    );
    let conv = tmp.path().join("conv.json");
    std::fs::write(
        &conv,
        json!([{"role": "user", "content": "A?"}, {"role": "assistant", "content": "B."},
               {"role": "user", "content": "C?"}])
        .to_string(),
    )
    .unwrap();
    let v = generate_chat(&hf, &["--chat-json", s(&conv)]);
    assert_eq!(decode(&v), "[user]A?\n[assistant]B.\n[user]C?\n[assistant]");
}
