//! `qwen-burn eval`: windows of exactly `--context` tokens, the same loss as `score` on the same
//! rows, a per-position breakdown that averages back to the total, and bits per byte: the
//! summed loss over ln 2 and the bytes of the predicted tokens' decoded text.

mod common;
use common::*;

#[test]
fn eval_matches_score_on_the_same_windows_and_buckets_average_back() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(tmp.path(), false, 3, 3, "");
    let model = tmp.path().join("model");
    ok(&qwen_burn(
        &["init", "--config", s(&cfg), "--out", s(&model)],
        &[],
    ));
    let root = repo_root();
    let tok = root.join("datasets/tokenizer.json");
    let text = tmp.path().join("text.txt");
    std::fs::write(
        &text,
        "It is a truth universally acknowledged, that a single man in possession of a good \
         fortune, must be in want of a wife. However little known the feelings or views of such \
         a man may be on his first entering a neighbourhood, this truth is so well fixed in the \
         minds of the surrounding families, that he is considered as the rightful property of \
         some one or other of their daughters.",
    )
    .unwrap();
    let ids: Vec<i64> = serde_json::from_str(
        ok(&qwen_burn(
            &[
                "tokenizer",
                "encode",
                "--tokenizer",
                s(&tok),
                "--file",
                s(&text),
            ],
            &[],
        ))
        .trim(),
    )
    .expect("encode prints a JSON array");
    let t = 20;
    assert!(
        ids.len() >= 2 * t + 5,
        "text too short: {} tokens",
        ids.len()
    );

    // Two full windows of t tokens; the remainder is not scored.
    let out = ok(&qwen_burn(
        &[
            "eval",
            "--model",
            s(&model),
            "--tokenizer",
            s(&tok),
            "--text",
            s(&text),
            "--context",
            &t.to_string(),
            "--max-tokens",
            &(2 * t + 5).to_string(),
            "--bucket",
            "8",
            "--batch-size",
            "1",
        ],
        &[],
    ));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("eval prints JSON");
    assert_eq!(v["windows"], 2);
    assert_eq!(v["tokens"], 2 * (t - 1));
    let loss = v["loss"].as_f64().unwrap();

    // Bits per byte: each window predicts its tokens 1..t, whose text is decoded here.
    let decoder = qwen_burn_data::Tok::from_file(&tok).unwrap();
    let ids32: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
    let bytes = decoder.decode(&ids32[1..t]).unwrap().len()
        + decoder.decode(&ids32[t + 1..2 * t]).unwrap().len();
    let expected_bpb = loss * (2 * (t - 1)) as f64 / std::f64::consts::LN_2 / bytes as f64;
    let bpb = v["bpb"].as_f64().expect("eval --text reports bpb");
    assert!(
        (bpb - expected_bpb).abs() <= 1e-9 * expected_bpb,
        "bpb {bpb} vs {expected_bpb} ({bytes} bytes)"
    );

    let tokens = tmp.path().join("tokens.json");
    let rows = serde_json::json!({"input_ids": [&ids[..t], &ids[t..2 * t]]});
    std::fs::write(&tokens, rows.to_string()).unwrap();
    let scored: serde_json::Value = serde_json::from_str(
        ok(&qwen_burn(
            &["score", "--model", s(&model), "--tokens", s(&tokens)],
            &[],
        ))
        .trim(),
    )
    .unwrap();
    let reference = scored["loss"].as_f64().unwrap();
    assert!(
        (loss - reference).abs() <= 1e-5 * reference,
        "eval {loss} vs score {reference}"
    );
    // `score` has no tokenizer beside this model, so no bpb; given one, the same bpb as eval.
    assert!(scored.get("bpb").is_none(), "{scored}");
    let scored: serde_json::Value = serde_json::from_str(
        ok(&qwen_burn(
            &[
                "score",
                "--model",
                s(&model),
                "--tokens",
                s(&tokens),
                "--tokenizer",
                s(&tok),
            ],
            &[],
        ))
        .trim(),
    )
    .unwrap();
    let score_bpb = scored["bpb"]
        .as_f64()
        .expect("score --tokenizer reports bpb");
    assert!(
        (score_bpb - bpb).abs() <= 1e-5 * bpb,
        "score bpb {score_bpb} vs eval {bpb}"
    );

    // Buckets of 8 predicted positions: 1-8, 9-16, 17-19; their weighted mean is the loss.
    let buckets = v["loss_by_position"].as_array().expect("loss_by_position");
    let spans: Vec<(u64, u64)> = buckets
        .iter()
        .map(|b| (b["from"].as_u64().unwrap(), b["to"].as_u64().unwrap()))
        .collect();
    assert_eq!(spans, vec![(1, 8), (9, 16), (17, 19)]);
    let mean = buckets
        .iter()
        .map(|b| {
            b["loss"].as_f64().unwrap()
                * (b["to"].as_u64().unwrap() - b["from"].as_u64().unwrap() + 1) as f64
        })
        .sum::<f64>()
        / (t - 1) as f64;
    assert!((mean - loss).abs() <= 1e-9 * loss, "{mean} vs {loss}");

    // A context longer than the text is an error that says so.
    let out = qwen_burn(
        &[
            "eval",
            "--model",
            s(&model),
            "--tokenizer",
            s(&tok),
            "--text",
            s(&text),
            "--context",
            "100000",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("fewer than one window"),
        "{}",
        stderr(&out)
    );
}
