//! Fine-tuning from an HF directory (full and LoRA, chat SFT data) and export back to HF format:
//! the exported model scores like the checkpoint it came from, and a merged LoRA export like the
//! unmerged adapter model that was trained.

mod common;
use common::*;

fn score(model: &std::path::Path, tokens: &std::path::Path) -> f64 {
    let out = ok(&qwen_burn(
        &["score", "--model", s(model), "--tokens", s(tokens)],
        &[],
    ));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("score prints JSON");
    v["loss"].as_f64().expect("loss")
}

fn chat_jsonl(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("chat.jsonl");
    let lines: Vec<String> = (0..24)
        .map(|i| {
            serde_json::json!({"messages": [
                {"role": "user", "content": format!("What is {i} plus {i}?")},
                {"role": "assistant", "content": format!("{i} plus {i} is {}.", 2 * i)},
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

#[test]
fn export_lora_finetune_and_export_again() {
    let tmp = tempfile::tempdir().unwrap();
    let base_cfg = tiny_config(tmp.path(), false, 3, 3, "");
    let base = tmp.path().join("base");
    ok(&qwen_burn(
        &["train", "--config", s(&base_cfg), "--run-dir", s(&base)],
        &[],
    ));

    // 1. Checkpoint -> HF directory; both score the same tokens identically.
    let hf = tmp.path().join("hf");
    ok(&qwen_burn(
        &["export", "--checkpoint", s(&base), "--out", s(&hf)],
        &[],
    ));
    assert!(hf.join("config.json").is_file() && hf.join("model.safetensors").is_file());
    assert!(hf.join("tokenizer.json").is_file());
    let tokens = tmp.path().join("tokens.json");
    std::fs::write(
        &tokens,
        r#"{"input_ids": [[5, 17, 300, 42, 7, 99, 1000, 3], [8, 8, 8, 8, 9, 9, 9, 9]]}"#,
    )
    .unwrap();
    let (a, b) = (score(&base, &tokens), score(&hf, &tokens));
    assert_eq!(a.to_bits(), b.to_bits(), "checkpoint {a} vs exported {b}");

    // 2. LoRA SFT from the HF directory, assistant-only loss; the frozen base in f32, then in
    //    bf16 (`lora.base_dtype`).
    let chat = chat_jsonl(tmp.path());
    let root = repo_root();
    for base_dtype in ["f32", "bf16"] {
        let lora_cfg = tmp.path().join(format!("lora-{base_dtype}.toml"));
        std::fs::write(
            &lora_cfg,
            format!(
                r#"[model]
from = "{hf}"
[data]
kind = "sft"
inputs = ["{chat}"]
tokenizer = "{tok}"
pack = false
[optimizer]
lr = 1e-2
weight_decay = 0.0
[training]
batch_size = 4
seq_len = 32
max_steps = 4
eval_interval = 2
eval_batches = 1
[checkpoint]
interval = 2
[logging]
interval = 1
[lora]
rank = 4
alpha = 8.0
targets = ["q_proj", "v_proj"]
base_dtype = "{base_dtype}"
"#,
                hf = hf.display(),
                chat = chat.display(),
                tok = root.join("datasets/tokenizer.json").display(),
            ),
        )
        .unwrap();
        let lora_run = tmp.path().join(format!("lora-{base_dtype}"));
        ok(&qwen_burn(
            &["train", "--config", s(&lora_cfg), "--run-dir", s(&lora_run)],
            &[],
        ));
        let losses = train_losses(&lora_run);
        assert_eq!(losses.len(), 4);
        assert!(losses.iter().all(|(_, l)| l.is_finite()));

        // Resumed from its step-2 checkpoint, the run repeats steps 3 and 4 bit for bit.
        let resumed = tmp.path().join(format!("lora-{base_dtype}-resumed"));
        copy_dir(&lora_run, &resumed);
        std::fs::remove_dir_all(resumed.join("checkpoints/step-00000004")).unwrap();
        ok(&qwen_burn(
            &[
                "train",
                "--config",
                s(&lora_cfg),
                "--run-dir",
                s(&resumed),
                "--resume",
            ],
            &[],
        ));
        let again = train_losses(&resumed);
        assert_eq!(again.len(), 4, "{base_dtype}: {again:?}");
        for ((step, a), (_, b)) in losses.iter().zip(&again) {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{base_dtype} step {step}: {a} vs {b}"
            );
        }

        // 3. The LoRA checkpoint exported (adapters merged, into f32 weights) scores like the
        //    checkpoint itself, and differs from the base model (the adapters learned something).
        let merged = tmp.path().join(format!("merged-{base_dtype}"));
        ok(&qwen_burn(
            &["export", "--checkpoint", s(&lora_run), "--out", s(&merged)],
            &[],
        ));
        let m = score(&merged, &tokens);
        assert_ne!(m.to_bits(), a.to_bits(), "LoRA training changed nothing");
        merged_export_matches_the_unmerged_adapter_model(&lora_run, &merged);
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The trained LoRA model with its adapters live (not merged: the checkpoint loaded as training
/// sees it) against the exported merged HF model: logits within 1e-5, loss within 1e-6 relative.
fn merged_export_matches_the_unmerged_adapter_model(run: &std::path::Path, hf: &std::path::Path) {
    use burn::module::Module;
    use burn::tensor::{Device, Int, Tensor, TensorData};
    use qwen_burn_model::Qwen3ForCausalLM;
    use qwen_burn_model::loss::{cross_entropy_sum, shift_targets, targets_tensor};

    let device = Device::flex();
    let ckpt = qwen_burn_train::run::checkpoint::latest_checkpoint(run).unwrap();
    let adapted = qwen_burn_train::run::checkpoint::load_checkpoint_model(&ckpt, &device).unwrap();
    let merged = Qwen3ForCausalLM::from_pretrained(hf, &device).unwrap();
    // rank 4 on q_proj and v_proj of 2 layers: A [32, 4] and B [4, out] per projection.
    assert!(
        adapted.num_params() > merged.num_params(),
        "the checkpoint must carry unmerged adapters ({} vs {} parameters)",
        adapted.num_params(),
        merged.num_params()
    );
    let ids: Vec<i64> = vec![5, 17, 300, 42, 7, 99, 1000, 3, 8, 8, 8, 8, 9, 9, 9, 9];
    let (b, t) = (2, 8);
    let run_model = |model: &Qwen3ForCausalLM| {
        let input = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [b, t]), &device);
        let logits = model.forward(input, None, None).logits;
        let targets = targets_tensor(shift_targets(&ids, b, t), b, t, &device);
        let values = logits.clone().try_into_vec_as::<f32>().unwrap();
        let loss = cross_entropy_sum(logits, targets).into_scalar::<f32>() / (b * (t - 1)) as f32;
        (values, loss)
    };
    // Composed ops (fused kernels off) widen a bf16 base to f32 and multiply f32 activations,
    // as the merged f32 export does: only the merge itself can then differ. (The fused kernels
    // make a bf16 base's products in bf16, `qwen_burn_kernels::Precision`.)
    let composed = |model: &Qwen3ForCausalLM| {
        qwen_burn_kernels::with_fused_kernels(false, || run_model(model))
    };
    let (la, xa) = composed(&adapted);
    let (lm, xm) = composed(&merged);
    let worst = la
        .iter()
        .zip(&lm)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let rel = ((xa - xm) / xa).abs();
    println!(
        "LoRA unmerged vs merged export: logits max abs diff {worst:.2e}, loss rel diff {rel:.2e}"
    );
    assert!(worst <= 1e-5, "logits differ by {worst}");
    assert!(rel <= 1e-6, "loss {xa} (adapters) vs {xm} (merged)");
}

#[test]
fn full_finetune_from_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let base_cfg = tiny_config(tmp.path(), false, 3, 3, "");
    let base = tmp.path().join("base");
    ok(&qwen_burn(
        &["train", "--config", s(&base_cfg), "--run-dir", s(&base)],
        &[],
    ));
    let ckpt = qwen_burn_train::run::checkpoint::latest_checkpoint(&base).unwrap();
    let text = std::fs::read_to_string(&base_cfg).unwrap();
    // Replace the [model] table by `from = <checkpoint>`.
    let rest = &text[text.find("[data]").unwrap()..];
    let ft_cfg = tmp.path().join("ft.toml");
    std::fs::write(
        &ft_cfg,
        format!("[model]\nfrom = \"{}\"\n{rest}", ckpt.display()),
    )
    .unwrap();
    let ft = tmp.path().join("ft");
    ok(&qwen_burn(
        &["train", "--config", s(&ft_cfg), "--run-dir", s(&ft)],
        &[],
    ));
    // Same seed and data: the fine-tune's first batch is the base run's first batch, which the
    // trained weights now predict better than the fresh initialisation did.
    let first = train_losses(&ft)[0].1;
    let fresh = train_losses(&base)[0].1;
    assert!(
        first < fresh - 0.01,
        "fine-tune starts at {first}, the fresh model was at {fresh}"
    );
    // `from` naming the run directory means its newest checkpoint: the same first loss.
    let ft_cfg2 = tmp.path().join("ft2.toml");
    std::fs::write(
        &ft_cfg2,
        format!("[model]\nfrom = \"{}\"\n{rest}", base.display()),
    )
    .unwrap();
    let ft2 = tmp.path().join("ft2");
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&ft_cfg2),
            "--run-dir",
            s(&ft2),
            "--max-steps",
            "2",
        ],
        &[],
    ));
    let first2 = train_losses(&ft2)[0].1;
    assert_eq!(
        first2.to_bits(),
        first.to_bits(),
        "run dir {first2} vs checkpoint {first}"
    );
}

/// SFT data is rendered with the chat template of the `tokenizer_config.json` beside the run's
/// tokenizer (here a ChatML variant that marks every turn with `>>`), seen in the exact batches
/// `train` would consume; the targets are the assistant replies and their end token only.
/// `batches` of the first step of `cfg`, written to `out`.
fn first_batches(cfg: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    qwen_burn(
        &[
            "batches",
            "--config",
            s(cfg),
            "--steps",
            "1",
            "--out",
            s(out),
        ],
        &[],
    )
}

/// `dir/tok` with the shipped `tokenizer.json` and `config` as its `tokenizer_config.json`.
fn tokenizer_dir(dir: &std::path::Path, config: &str) -> std::path::PathBuf {
    let tok_dir = dir.join("tok");
    std::fs::create_dir_all(&tok_dir).unwrap();
    std::fs::copy(
        repo_root().join("datasets/tokenizer.json"),
        tok_dir.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(tok_dir.join("tokenizer_config.json"), config).unwrap();
    tok_dir
}

#[test]
fn sft_uses_the_tokenizer_chat_template() {
    let tmp = tempfile::tempdir().unwrap();
    let tok_dir = tokenizer_dir(
        tmp.path(),
        &serde_json::json!({"chat_template":
            "{% for m in messages %}<|im_start|>{{ m.role }}\n>>{{ m.content }}<|im_end|>\n{% endfor %}"})
        .to_string(),
    );
    let chat = chat_jsonl(tmp.path());
    let cfg = tmp.path().join("sft.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[model]
vocab_size = 8192
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 8
[data]
kind = "sft"
inputs = ["{chat}"]
tokenizer = "{tok}"
pack = false
[optimizer]
lr = 1e-3
[training]
batch_size = 2
seq_len = 48
max_steps = 1
"#,
            chat = chat.display(),
            tok = tok_dir.join("tokenizer.json").display(),
        ),
    )
    .unwrap();
    let out = tmp.path().join("batches.jsonl");
    ok(&first_batches(&cfg, &out));
    let record: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let tok = qwen_burn_data::Tok::from_file(&tok_dir.join("tokenizer.json")).unwrap();
    let row = |key: &str| -> Vec<i64> {
        record[key][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    };
    let inputs: Vec<u32> = row("inputs").iter().map(|&x| x as u32).collect();
    let text = tok.decode(&inputs).unwrap();
    assert!(text.starts_with("<|im_start|>user\n>>What is"), "{text:?}");
    let targets: Vec<u32> = row("targets")
        .iter()
        .filter(|&&x| x >= 0)
        .map(|&x| x as u32)
        .collect();
    let trained = tok.decode(&targets).unwrap();
    assert!(
        trained.contains(" plus ")
            && trained.ends_with("<|im_end|>")
            && !trained.contains("What is"),
        "{trained:?}"
    );
}

/// `data.chat_template_kwargs` reaches the template: with Qwen3's real template and
/// `enable_thinking = false`, a conversational prompt-completion line's prompt ends in the empty
/// `<think>` block, so only the answer trains; without it the block is part of the completion.
/// A line's own `chat_template_kwargs` does the same and wins over the config's. A variable the
/// template never reads (naming the line), or the key on a text run, is refused.
#[test]
fn chat_template_kwargs_reach_the_template() {
    let tmp = tempfile::tempdir().unwrap();
    let qwen3 =
        repo_root().join("crates/data/tests/fixtures/tokenizers/qwen3/tokenizer_config.json");
    let tok_dir = tokenizer_dir(tmp.path(), &std::fs::read_to_string(qwen3).unwrap());
    let data = tmp.path().join("pc.jsonl");
    // Every line, with `kwargs` as its own chat_template_kwargs when given.
    let write_data = |kwargs: Option<serde_json::Value>| {
        let line = |i: usize| {
            let mut v = serde_json::json!({
                "prompt": [{"role": "user", "content": format!("What is {i} plus {i}?")}],
                "completion": [{"role": "assistant", "content": format!("It is {}.", 2 * i)}],
            });
            if let Some(k) = &kwargs {
                v["chat_template_kwargs"] = k.clone();
            }
            v.to_string()
        };
        std::fs::write(&data, (0..8).map(line).collect::<Vec<_>>().join("\n")).unwrap();
    };
    write_data(None);
    let trained = |kind: &str, extra: &str| {
        let cfg = tmp.path().join("pc.toml");
        std::fs::write(
            &cfg,
            format!(
                "[model]\nvocab_size = 8192\nhidden_size = 32\nintermediate_size = 64\n\
                 num_hidden_layers = 1\nnum_attention_heads = 4\nnum_key_value_heads = 2\n\
                 head_dim = 8\n[data]\nkind = \"{kind}\"\ninputs = [\"{}\"]\ntokenizer = \"{}\"\n\
                 {extra}\n[optimizer]\nlr = 1e-3\n[training]\nbatch_size = 1\nseq_len = 64\n\
                 max_steps = 1\n",
                data.display(),
                tok_dir.join("tokenizer.json").display(),
            ),
        )
        .unwrap();
        let out = tmp.path().join("batches.jsonl");
        let _ = std::fs::remove_file(&out);
        let run = first_batches(&cfg, &out);
        if !run.status.success() {
            return Err(stderr(&run));
        }
        let text = std::fs::read_to_string(&out).unwrap();
        let record: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        let targets: Vec<u32> = record["targets"][0]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| u32::try_from(x.as_i64().unwrap()).ok())
            .collect();
        let tok = qwen_burn_data::Tok::from_file(&tok_dir.join("tokenizer.json")).unwrap();
        Ok(tok.decode(&targets).unwrap())
    };
    let thinking = trained("sft", "pack = false").unwrap();
    assert!(
        thinking.starts_with("<think>\n\n</think>\n\nIt is "),
        "{thinking:?}"
    );
    let plain = trained(
        "sft",
        "pack = false\nchat_template_kwargs = { enable_thinking = false }",
    )
    .unwrap();
    assert!(
        plain.starts_with("It is ") && !plain.contains("think"),
        "{plain:?}"
    );
    let err = trained("sft", "chat_template_kwargs = { enable_thinkin = false }").unwrap_err();
    assert!(
        err.contains("data.chat_template_kwargs.enable_thinkin: the chat template never reads")
            && err.contains("tokenizer_config.json"),
        "{err}"
    );
    let err = trained("text", "chat_template_kwargs = { enable_thinking = false }").unwrap_err();
    assert!(
        err.contains("data.chat_template_kwargs") && err.contains("render no chat template"),
        "{err}"
    );
    // A line's own variables (TRL's per-example `chat_template_kwargs`), over the config's.
    write_data(Some(serde_json::json!({"enable_thinking": false})));
    assert_eq!(trained("sft", "pack = false").unwrap(), plain);
    write_data(Some(serde_json::json!({"enable_thinking": true})));
    let own = trained(
        "sft",
        "pack = false\nchat_template_kwargs = { enable_thinking = false }",
    )
    .unwrap();
    assert_eq!(own, thinking);
    write_data(Some(serde_json::json!({"enable_thinkin": false})));
    let err = trained("sft", "pack = false").unwrap_err();
    assert!(
        err.contains("pc.jsonl:1")
            && err.contains("chat_template_kwargs.enable_thinkin: the chat template never reads"),
        "{err}"
    );
}
