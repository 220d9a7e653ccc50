//! RL through the binary (issue 39): a GRPO run from an HF model on prompts logs TRL's
//! figures (per reward function too) and samples with their rewards, resumes bit for bit,
//! and its step-0 validation accuracy equals `eval --generate`'s; a reward program that
//! crashes, hangs or writes a bad line, and bad `[rl]` settings or prompt rows, are errors
//! naming the program, line, key or file.

mod common;
use common::*;

use std::path::{Path, PathBuf};

/// A GRPO config for the tiny model in `hf` on `prompts` (validation: the same file), with an
/// exact_match reward and the `command` reward `script` (weight 0.5), if given.
fn grpo_config(
    dir: &Path,
    hf: &Path,
    prompts: &Path,
    steps: usize,
    script: Option<&Path>,
) -> PathBuf {
    let command = script.map_or(String::new(), |p| {
        format!("[[rl.rewards]]\nkind = \"command\"\ncommand = [\"{}\"]\nweight = 0.5\ntimeout_secs = 2\n", p.display())
    });
    let text = format!(
        r#"[model]
from = "{hf}"
[data]
kind = "prompts"
inputs = ["{prompts}"]
val_inputs = ["{prompts}"]
[rl]
group_size = 4
max_new_tokens = 8
[[rl.rewards]]
kind = "exact_match"
{command}
[optimizer]
lr = 1e-3
[training]
seed = 5
batch_size = 2
seq_len = 48
max_steps = {steps}
eval_interval = 2
eval_batches = 2
sample_interval = 1
[checkpoint]
interval = 2
[logging]
interval = 1
"#,
        hf = hf.display(),
        prompts = prompts.display(),
    );
    let path = dir.join(format!("grpo{steps}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// An executable shell script in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    path
}

/// `train --config CONFIG --run-dir RUN` with a `--set` for each of `sets`.
fn train(config: &Path, run: &Path, sets: &[&str]) -> std::process::Output {
    let mut args = vec!["train", "--config", s(config), "--run-dir", s(run)];
    for set in sets {
        args.extend(["--set", set]);
    }
    qwen_burn(&args, &[])
}

/// The train records of a run without their timings.
fn records(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == "train")
        .map(|mut v| {
            let o = v.as_object_mut().unwrap();
            for k in ["tokens_per_sec", "mfu", "elapsed_secs"] {
                o.remove(k);
            }
            let f = o["figures"].as_object_mut().unwrap();
            f.retain(|k, _| !k.starts_with("rollout/"));
            v
        })
        .collect()
}

fn prompts(dir: &Path, n: usize) -> PathBuf {
    let all =
        std::fs::read_to_string(repo_root().join("datasets/arith/small/train.jsonl")).unwrap();
    let path = dir.join("prompts.jsonl");
    std::fs::write(&path, all.lines().take(n).collect::<Vec<_>>().join("\n")).unwrap();
    path
}

#[test]
fn a_grpo_run_logs_trls_figures_resumes_exactly_and_eval_generate_agrees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let prompts = prompts(dir.path(), 4);
    // 1 for a completion that starts with a letter from a to m, else 0: varied rewards on a
    // random model.
    let digit = script(
        dir.path(),
        "digit.sh",
        r#"while IFS= read -r line; do case "$line" in *'"completion":"'[a-m]*) echo 1;; *) echo 0;; esac; done"#,
    );
    let config = grpo_config(dir.path(), &hf, &prompts, 4, Some(&digit));
    let straight = dir.path().join("straight");
    ok(&qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&straight)],
        &[],
    ));
    let run = records(&straight);
    assert_eq!(run.len(), 4);
    let figures = &run[0]["figures"];
    for key in [
        "reward",
        "reward_std",
        "rewards/exact_match/mean",
        "rewards/command/mean",
        "frac_reward_zero_std",
        "completions/mean_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "clip_ratio/region_mean",
    ] {
        assert!(figures[key].is_number(), "{key} missing: {figures}");
    }
    // The command reward varies, so the steps train on something.
    assert!(
        run.iter()
            .any(|r| r["figures"]["reward_std"].as_f64().unwrap() > 0.0),
        "{run:?}"
    );
    // plot draws each figure, training and validation series together.
    let out = ok(&qwen_burn(&["plot", s(&straight)], &[]));
    for png in ["reward.png", "rewards_exact_match_mean.png", "accuracy.png"] {
        assert!(out.contains(png), "{out}");
        assert!(straight.join("plots/figures").join(png).exists(), "{png}");
    }
    let samples = std::fs::read_to_string(straight.join("samples.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(samples.lines().next().unwrap()).unwrap();
    assert!(first["reward"].is_number(), "{first}");

    // Killed after step 2, then --resume: the same records.
    let resumed = dir.path().join("resumed");
    let out = qwen_burn(
        &["train", "--config", s(&config), "--run-dir", s(&resumed)],
        &[("QWEN_BURN_ABORT_AFTER_STEP", "2")],
    );
    assert!(!out.status.success());
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&resumed),
            "--resume",
        ],
        &[],
    ));
    assert_eq!(records(&resumed), run);

    // eval --generate of the starting model: its greedy accuracy is the run's step-0
    // validation accuracy on the same prompts; pass@k up to the samples.
    let out = ok(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--generate",
            s(&prompts),
            "--max-new-tokens",
            "8",
            "--samples",
            "4",
            "--json",
            "--records",
            s(&dir.path().join("records.jsonl")),
        ],
        &[],
    ));
    let eval: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let step0: serde_json::Value = std::fs::read_to_string(straight.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["split"] == "val" && r["step"] == 0)
        .unwrap();
    assert_eq!(eval["prompts"], 4);
    assert_eq!(
        eval["accuracy"], step0["figures"]["accuracy"],
        "{eval} vs {step0}"
    );
    for k in ["pass@1", "pass@2", "pass@4"] {
        assert!(eval[k].is_number(), "{k}: {eval}");
    }
    // --records: a line per prompt in file order, with its answer; the lines' correct greedy
    // completions give the accuracy, their correct samples pass@1 (c / n over the prompts).
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("records.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let file: Vec<serde_json::Value> = std::fs::read_to_string(&prompts)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for (i, (r, p)) in lines.iter().zip(&file).enumerate() {
        assert_eq!(r["index"], i);
        assert_eq!(r["answer"].as_str(), p["answer"].as_str(), "{r}");
        let question = p["prompt"][0]["content"].as_str().unwrap();
        assert!(r["prompt"].as_str().unwrap().contains(question), "{r}");
        assert_eq!(r["correct"], r["reward"].as_f64().unwrap() >= 1.0, "{r}");
    }
    let share = |f: &dyn Fn(&serde_json::Value) -> f64| lines.iter().map(f).sum::<f64>() / 4.0;
    let accuracy = share(&|r| f64::from(u8::from(r["correct"].as_bool().unwrap())));
    assert_eq!(accuracy, eval["accuracy"].as_f64().unwrap(), "{eval}");
    let pass1 = share(&|r| r["samples_correct"].as_f64().unwrap() / 4.0);
    assert!(
        (pass1 - eval["pass@1"].as_f64().unwrap()).abs() < 1e-12,
        "{eval}"
    );
    // --records without --task or --generate names what it needs.
    let err = fails(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&hf),
            "--text",
            s(&prompts),
            "--records",
            s(&dir.path().join("r.jsonl")),
        ],
        &[],
    ));
    assert!(err.contains("--task or --generate"), "{err}");
}

#[test]
fn bad_reward_programs_settings_and_prompts_name_the_program_key_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let prompts = prompts(dir.path(), 4);
    let refused = |config: &Path, sets: &[&str]| {
        let run = dir.path().join("run");
        let _ = std::fs::remove_dir_all(&run);
        fails(&train(config, &run, sets))
    };
    for (name, body, expect) in [
        ("crash.sh", "exit 3", "exit status: 3"),
        ("word.sh", "while read -r l; do echo abc; done", "line 1"),
        ("short.sh", "read -r l; echo 1", "lines for"),
        ("hang.sh", "exec sleep 30", "timeout"),
    ] {
        let program = script(dir.path(), name, body);
        let err = refused(
            &grpo_config(dir.path(), &hf, &prompts, 2, Some(&program)),
            &[],
        );
        assert!(err.contains(name) && err.contains(expect), "{name}: {err}");
    }
    let config = grpo_config(dir.path(), &hf, &prompts, 2, None);
    for (set, key) in [
        ("rl.group_size=1", "rl.group_size"),
        ("rl.max_new_tokens=48", "rl.max_new_tokens"),
        ("rl.epsilon=1.5", "rl.epsilon"),
        ("rl.loss_type=\"ppo\"", "rl.loss_type"),
    ] {
        let err = refused(&config, &[set]);
        assert!(err.contains(key), "{set}: {err}");
    }
    let err = refused(&config, &["data.kind=\"text\""]);
    assert!(err.contains("rl"), "{err}");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"What is 1 + 1?\", \"answer\": \"2\"}\n{\"prompt\": \"What is 2 + 2?\"}\n",
    )
    .unwrap();
    let err = refused(&config, &[]);
    assert!(
        err.contains("prompts.jsonl:2") && err.contains("answer"),
        "{err}"
    );
}

/// The train record of step 1 and the exported weights of a one-step run of `config`.
fn one_step(dir: &Path, name: &str, config: &Path, sets: &[&str]) -> (serde_json::Value, Vec<u8>) {
    let run = dir.join(name);
    ok(&train(config, &run, sets));
    let out = dir.join(format!("{name}-hf"));
    ok(&qwen_burn(
        &["export", "--checkpoint", s(&run), "--out", s(&out)],
        &[],
    ));
    let record = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["split"] == "train" && v["step"] == 1)
        .unwrap();
    (
        record,
        std::fs::read(out.join("model.safetensors")).unwrap(),
    )
}

/// Zero-advantage rows left out of the update (the default where it is the same step) give
/// the loss and gradient norm of the step on every row; a step whose rows all have advantage 0
/// still steps AdamW (its weight decay), to the same weights bit for bit; and a `true` that
/// cannot hold is an error naming the key.
#[test]
fn leaving_zero_advantage_rows_out_gives_the_same_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = tiny_hf_with_tokenizer(dir.path());
    let prompts = prompts(dir.path(), 2);
    // The completions of "What is 98 - 41?" all score 0 (a group of zero advantages); the
    // other prompt's score by their first letter (a group of mixed ones).
    let mixed = script(
        dir.path(),
        "mixed.sh",
        r#"while IFS= read -r line; do case "$line" in *'98 - 41'*) echo 0;; *'"completion":"'[a-m]*) echo 1;; *) echo 0;; esac; done"#,
    );
    let config = grpo_config(dir.path(), &hf, &prompts, 1, Some(&mixed));
    let left_out =
        |r: &serde_json::Value| r["figures"]["rollout/frac_rows_left_out"].as_f64().unwrap();
    let (skip, _) = one_step(dir.path(), "skip", &config, &[]);
    let (all, _) = one_step(
        dir.path(),
        "all",
        &config,
        &["rl.skip_zero_advantage_rows=false"],
    );
    // Half the rows (one group of 4 of the 8) are left out, none in the other run.
    assert_eq!(left_out(&skip), 0.5, "{skip}");
    assert_eq!(left_out(&all), 0.0, "{all}");
    assert!(
        all["figures"]["reward_std"].as_f64().unwrap() > 0.0,
        "{all}"
    );
    // On-policy the loss's value is the rows' `-A n` over the tokens (0 here: the group's
    // advantages sum to 0 and every completion has 8 tokens); the gradient is the test.
    let (a, b) = (
        skip["loss"].as_f64().unwrap(),
        all["loss"].as_f64().unwrap(),
    );
    assert!((a - b).abs() <= 1e-7, "loss: {a} vs {b}");
    let (a, b) = (
        skip["grad_norm"].as_f64().unwrap(),
        all["grad_norm"].as_f64().unwrap(),
    );
    assert!(b > 0.0, "{all}");
    assert!((a - b).abs() <= 1e-5 * b, "grad_norm: {a} vs {b}");
    // exact_match alone: the random model answers nothing, every advantage is 0. The step
    // trains on one row (the gradient of every weight 0) and AdamW decays the weights as on
    // all eight: the same bits, and not the starting ones.
    let config = grpo_config(dir.path(), &hf, &prompts, 1, None);
    let (skip, skip_w) = one_step(dir.path(), "zero-skip", &config, &[]);
    let (all, all_w) = one_step(
        dir.path(),
        "zero-all",
        &config,
        &["rl.skip_zero_advantage_rows=false"],
    );
    assert_eq!(left_out(&skip), 7.0 / 8.0, "{skip}");
    assert_eq!(skip["grad_norm"].as_f64(), Some(0.0), "{skip}");
    assert_eq!(all["grad_norm"].as_f64(), Some(0.0), "{all}");
    assert!(
        skip_w == all_w,
        "different weights after a step of zero advantages"
    );
    // Without weight decay that step leaves the weights as they were: other bits.
    let (_, kept) = one_step(
        dir.path(),
        "zero-no-decay",
        &config,
        &["optimizer.weight_decay=0.0"],
    );
    assert!(kept != all_w, "the weight decay did not change the weights");

    // `true` where leaving rows out is not the same step: the key and the reason.
    for (sets, why) in [
        (&["rl.beta=0.1"][..], "rl.beta"),
        (&["rl.loss_type=\"bnpo\""][..], "bnpo"),
        (&["rl.num_iterations=2"][..], "rl.num_iterations"),
    ] {
        let sets = [sets, &["rl.skip_zero_advantage_rows=true"]].concat();
        let err = fails(&train(&config, &dir.path().join("bad"), &sets));
        assert!(
            err.contains("rl.skip_zero_advantage_rows") && err.contains(why),
            "{sets:?}: {err}"
        );
    }
    // A model with MoE layers (router losses and balancing count every row).
    let moe = dir.path().join("moe");
    std::fs::create_dir_all(&moe).unwrap();
    let moe_config = tiny_config(&moe, true, 1, 1, "");
    let moe_hf = moe.join("hf");
    ok(&qwen_burn(
        &["init", "--config", s(&moe_config), "--out", s(&moe_hf)],
        &[],
    ));
    std::fs::copy(
        repo_root().join("datasets/tokenizer.json"),
        moe_hf.join("tokenizer.json"),
    )
    .unwrap();
    let moe_from = format!("model.from=\"{}\"", moe_hf.display());
    let err = fails(&train(
        &config,
        &dir.path().join("bad-moe"),
        &[&moe_from, "rl.skip_zero_advantage_rows=true"],
    ));
    assert!(
        err.contains("rl.skip_zero_advantage_rows") && err.contains("MoE"),
        "{err}"
    );
}
