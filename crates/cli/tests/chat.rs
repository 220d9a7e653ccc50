//! `chat`: each turn's reply is what `generate --chat-json` gives for the conversation so far
//! (the replies before it in the history), streamed to stdout; the KV cache of the previous
//! turns is reused: the count printed is the common head of the new prompt's tokens and the
//! previous prompt and reply but its last token (a reply re-tokenised as text in the history
//! need not give back the sampled tokens, so it can be shorter than the whole);
//! `/reset` starts over with the same reply; a sampled turn N uses seed `--seed + N`.

mod common;
use common::*;

use std::io::Write;
use std::process::Stdio;

use serde_json::{Value, json};

/// `chat` with `input` on stdin and `envs` set: (stdout, stderr), after checking it succeeded.
fn chat_in(
    model: &std::path::Path,
    input: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (String, String) {
    let mut child = qwen_burn_command()
        .args(["chat", "--model", s(model), "--ignore-eos"])
        .args(extra)
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    (String::from_utf8(out.stdout).unwrap(), err)
}

/// [`chat_in`] without environment.
fn chat(model: &std::path::Path, input: &str, extra: &[&str]) -> (String, String) {
    chat_in(model, input, extra, &[])
}

/// `generate --chat-json` of `messages`: (reply text, prompt ids then new ids).
fn reference(
    model: &std::path::Path,
    dir: &std::path::Path,
    messages: &Value,
    extra: &[&str],
) -> (String, Vec<u64>, Vec<u64>) {
    let conv = dir.join("conv.json");
    std::fs::write(&conv, messages.to_string()).unwrap();
    let mut args = vec![
        "generate",
        "--model",
        s(model),
        "--json",
        "--ignore-eos",
        "--chat-json",
        s(&conv),
    ];
    args.extend_from_slice(extra);
    let v: Value = serde_json::from_str(ok(&qwen_burn(&args, &[])).trim()).unwrap();
    let ids = |k: &str| -> Vec<u64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    (
        v["text"].as_str().unwrap().to_string(),
        ids("prompt_ids"),
        ids("new_token_ids"),
    )
}

#[test]
fn chat_turns_continue_the_conversation_generate_would_render() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf_with_tokenizer(tmp.path());
    for sampling in [
        &["--max-new-tokens", "6"][..],
        &[
            "--max-new-tokens",
            "5",
            "--temperature",
            "1.0",
            "--seed",
            "3",
        ],
    ] {
        let (out, err) = chat(
            &hf,
            "Who wrote Emma?\n\nAnd Hamlet?\n/reset\nWho wrote Emma?\n/exit\nignored\n",
            sampling,
        );
        let user = |t: &str| json!({"role": "user", "content": t});
        let seed = |n: u64| -> Vec<&str> {
            let mut a = sampling.to_vec();
            if let Some(i) = a.iter().position(|x| *x == "--seed") {
                a[i + 1] = if n == 0 { "3" } else { "4" };
            }
            a
        };
        let (first, p1, new1) =
            reference(&hf, tmp.path(), &json!([user("Who wrote Emma?")]), &seed(0));
        let history = json!([user("Who wrote Emma?"), {"role": "assistant", "content": first}, user("And Hamlet?")]);
        let (second, p2, _) = reference(&hf, tmp.path(), &history, &seed(1));
        // After /reset the turn count goes on: turn 2 samples with seed + 2.
        let third = match sampling.contains(&"--seed") {
            false => first.clone(),
            true => {
                let mut a = sampling.to_vec();
                let i = a.iter().position(|x| *x == "--seed").unwrap();
                a[i + 1] = "5";
                reference(&hf, tmp.path(), &json!([user("Who wrote Emma?")]), &a).0
            }
        };
        assert_eq!(
            out,
            format!("{first}\n{second}\n{third}\n"),
            "{sampling:?}\n{err}"
        );
        // What the cache holds after turn 1, and how much of turn 2's prompt begins with it.
        let mut cached = p1.clone();
        cached.extend(&new1[..new1.len() - 1]);
        let common = cached.iter().zip(&p2).take_while(|(a, b)| a == b).count();
        assert!(common > 0);
        let reused: Vec<String> = err
            .lines()
            .filter_map(|l| l.split("; prompt ").nth(1))
            .map(|l| l.split(';').next().unwrap().to_string())
            .collect();
        assert_eq!(
            reused,
            vec![
                format!("{} tokens, 0 from the cache", p1.len()),
                format!("{} tokens, {common} from the cache", p2.len()),
                format!("{} tokens, 0 from the cache", p1.len()),
            ],
            "{err}"
        );
        assert!(err.contains("[conversation cleared]"), "{err}");
    }
}

/// A message whose prefill cannot fit (under `QWEN_BURN_MEMORY_LIMIT`) is refused before
/// allocating, naming the prompt's tokens; `chat` drops it and answers the next message as if it
/// had not been sent, and `generate` stops with the same error.
#[test]
fn a_prompt_too_large_to_prefill_is_refused_before_allocating() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf_with_tokenizer(tmp.path());
    let long = "the cat sat on the mat. ".repeat(20000);
    let limit = [("QWEN_BURN_MEMORY_LIMIT", "150MiB")];
    let input = format!("{long}\nWho wrote Emma?\n");
    let (out, err) = chat_in(&hf, &input, &["--max-new-tokens", "4"], &limit);
    assert!(
        err.contains("error: this turn's prefill (") && err.contains("KV cache (the conversation"),
        "{err}"
    );
    let user = json!([{"role": "user", "content": "Who wrote Emma?"}]);
    let (reply, _, _) = reference(&hf, tmp.path(), &user, &["--max-new-tokens", "4"]);
    assert_eq!(out, format!("{reply}\n"));
    let conv = tmp.path().join("long.json");
    std::fs::write(
        &conv,
        json!([{"role": "user", "content": long}]).to_string(),
    )
    .unwrap();
    let out = qwen_burn(
        &["generate", "--model", s(&hf), "--chat-json", s(&conv)],
        &limit,
    );
    let err = fails(&out);
    assert!(err.contains("generate's prefill ("), "{err}");
}
