//! An export carries what HF tools read besides the weights: the tokenizer's configuration
//! (where Qwen3 keeps its chat template), the special-token files and the generation defaults,
//! from an HF source directory and from a run fine-tuned from one.

mod common;
use common::*;

#[test]
fn exports_keep_the_chat_template_and_special_token_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    // An HF source: the tiny model's step-0 weights, a tokenizer, and the side files.
    let config = tiny_config(dir.path(), false, 1, 1, "");
    let hf = dir.path().join("hf");
    ok(&qwen_burn(
        &["init", "--config", s(&config), "--out", s(&hf)],
        &[],
    ));
    std::fs::copy(
        repo_root().join("datasets/tokenizer.json"),
        hf.join("tokenizer.json"),
    )
    .expect("tokenizer");
    let template = r#"{"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}", "eos_token": "<|im_end|>"}"#;
    std::fs::write(hf.join("tokenizer_config.json"), template).expect("tokenizer_config");
    std::fs::write(
        hf.join("special_tokens_map.json"),
        r#"{"eos_token": "<|im_end|>"}"#,
    )
    .expect("special tokens");

    // 1. The HF directory exported.
    let out = dir.path().join("exported");
    ok(&qwen_burn(
        &["export", "--checkpoint", s(&hf), "--out", s(&out)],
        &[],
    ));
    for name in [
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
    ] {
        assert_eq!(
            std::fs::read(out.join(name)).expect(name),
            std::fs::read(hf.join(name)).expect(name),
            "{name}"
        );
    }

    // 2. A run fine-tuned from it, then exported.
    let text = std::fs::read_to_string(&config).expect("config");
    let model_end = text.find("\n[data]").expect("[data]");
    let finetune = format!(
        "[model]\nfrom = \"{}\"\n{}",
        hf.display(),
        &text[model_end..]
    );
    let finetune_path = dir.path().join("finetune.toml");
    std::fs::write(&finetune_path, finetune).expect("finetune config");
    let run = dir.path().join("run");
    ok(&qwen_burn(
        &["train", "--config", s(&finetune_path), "--run-dir", s(&run)],
        &[],
    ));
    let out = dir.path().join("exported-run");
    ok(&qwen_burn(
        &["export", "--checkpoint", s(&run), "--out", s(&out)],
        &[],
    ));
    for name in ["tokenizer_config.json", "special_tokens_map.json"] {
        assert_eq!(
            std::fs::read(out.join(name)).expect(name),
            std::fs::read(hf.join(name)).expect(name),
            "{name} of the fine-tuned run"
        );
    }
}
