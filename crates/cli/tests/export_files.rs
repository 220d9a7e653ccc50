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

/// Above `--max-shard-size` an export is sharded as transformers' `save_pretrained` shards
/// (`model-0000i-of-0000n.safetensors` and an index with `total_size`); the sharded and the
/// single-file export score a text alike; re-exporting over either form leaves no file of the
/// other that a loader would read instead.
#[test]
fn exports_shard_above_the_threshold_and_replace_each_other_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let out = dir.path().join("out");
    let export = |size: &str, overwrite: bool| {
        let mut args = vec!["export", "--checkpoint", s(&hf), "--out", s(&out)];
        args.extend(["--max-shard-size", size]);
        if overwrite {
            args.push("--overwrite");
        }
        ok(&qwen_burn(&args, &[]));
    };
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "It is a truth universally acknowledged, that a single man in",
    )
    .unwrap();
    let score = || {
        ok(&qwen_burn(
            &[
                "eval",
                "--model",
                s(&out),
                "--text",
                s(&text),
                "--context",
                "8",
                "--json",
            ],
            &[],
        ))
    };
    let names = || {
        let mut v: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("safetensors"))
            .collect();
        v.sort();
        v
    };

    export("5GB", false);
    assert_eq!(names(), ["model.safetensors"]);
    let single = score();

    // The tiny model: a 1 MB embedding (a shard of its own, over the limit) and 41 KB of layers.
    export("20KB", true);
    let files = names();
    let shards: Vec<_> = files.iter().filter(|n| n.starts_with("model-")).collect();
    assert!(shards.len() >= 3, "{files:?}");
    let n = shards.len();
    assert!(
        shards[0].ends_with(&format!("-of-{n:05}.safetensors")),
        "{files:?}"
    );
    assert!(
        !files.contains(&"model.safetensors".to_string()),
        "{files:?}"
    );
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let total: u64 = shards
        .iter()
        .map(|f| {
            let bytes = std::fs::read(out.join(f)).unwrap();
            let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            bytes.len() as u64 - 8 - header
        })
        .sum();
    assert_eq!(index["metadata"]["total_size"].as_u64(), Some(total));
    for shard in index["weight_map"].as_object().unwrap().values() {
        assert!(out.join(shard.as_str().unwrap()).is_file());
    }
    assert_eq!(
        score(),
        single,
        "sharded and single-file exports score alike"
    );

    export("5GB", true);
    assert_eq!(
        names(),
        ["model.safetensors"],
        "the shards and index are gone"
    );
    assert_eq!(score(), single);
    let err = fails(&qwen_burn(
        &[
            "export",
            "--checkpoint",
            s(&hf),
            "--out",
            s(&out),
            "--overwrite",
            "--max-shard-size",
            "5TB",
        ],
        &[],
    ));
    assert!(
        err.contains("--max-shard-size") && err.contains("unknown unit"),
        "{err}"
    );
}

/// The chat template an export renders is the source's, whether the source keeps it in
/// `tokenizer_config.json` (the hub's Qwen3) or in `chat_template.jinja` (transformers 4.43 and
/// later): `generate --chat` builds the same prompt from the export as from the source, and
/// another one than the built-in ChatML.
#[test]
fn an_export_renders_the_sources_chat_template() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let prompt = |model: &std::path::Path| -> serde_json::Value {
        let out = ok(&qwen_burn(
            &[
                "generate",
                "--model",
                s(model),
                "--chat",
                "hi",
                "--max-new-tokens",
                "1",
                "--temperature",
                "0",
                "--json",
            ],
            &[],
        ));
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["prompt_ids"].clone()
    };
    let chatml = prompt(&hf);
    let template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
    for (i, in_config) in [true, false].into_iter().enumerate() {
        let config = match in_config {
            true => serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"}),
            false => serde_json::json!({"eos_token": "<|im_end|>"}),
        };
        std::fs::write(hf.join("tokenizer_config.json"), config.to_string()).unwrap();
        let jinja = hf.join("chat_template.jinja");
        if in_config {
            let _ = std::fs::remove_file(&jinja);
        } else {
            std::fs::write(&jinja, template).unwrap();
        }
        let out = dir.path().join(format!("exported-{i}"));
        ok(&qwen_burn(
            &["export", "--checkpoint", s(&hf), "--out", s(&out)],
            &[],
        ));
        assert_eq!(out.join("chat_template.jinja").is_file(), !in_config);
        let source = prompt(&hf);
        assert_ne!(source, chatml, "the source's template is used, not ChatML");
        assert_eq!(
            prompt(&out),
            source,
            "template in tokenizer_config: {in_config}"
        );
    }
}
