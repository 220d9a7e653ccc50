//! Chat SFT: template, assistant-only loss mask, padding and packing, resumable sampling.

mod common;

use std::sync::Arc;

use common::*;
use qwen_burn_data::{
    Batch, ChatOptions, IGNORE_INDEX, Message, Packing, Prefetcher, SftDataset, SftSampler, Tok,
    render_chat, tokenize_chat,
};

fn conv(turns: &[(&str, &str)]) -> Vec<Message> {
    turns.iter().map(|(r, c)| Message::new(r, c)).collect()
}

fn sample() -> Vec<Message> {
    conv(&[
        ("system", "You are terse."),
        ("user", "Who wrote Emma?"),
        ("assistant", "Jane Austen."),
        ("user", "And Hamlet?"),
        ("assistant", "Shakespeare, around 1600."),
    ])
}

fn jsonl(convs: &[Vec<Message>]) -> String {
    convs
        .iter()
        .map(|c| serde_json::json!({ "messages": c }).to_string() + "\n")
        .collect()
}

/// Decoded text of the target tokens of every row (positions whose target is not ignored).
fn target_text(tok: &Tok, b: &Batch) -> Vec<String> {
    (0..b.batch_size)
        .map(|r| {
            let ids: Vec<u32> = b.targets[r * b.seq_len..(r + 1) * b.seq_len]
                .iter()
                .filter(|&&t| t != IGNORE_INDEX)
                .map(|&t| t as u32)
                .collect();
            tok.decode(&ids).unwrap()
        })
        .collect()
}

#[test]
fn renders_the_qwen_template_exactly() {
    let s = render_chat(&conv(&[("user", "Hi"), ("assistant", "Hello!")]));
    assert_eq!(
        s,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    );
}

#[test]
fn mask_covers_assistant_content_and_its_im_end_only() {
    for tok in [qwen(), default_tok()] {
        let (ids, mask) = tokenize_chat(&tok, &sample()).unwrap();
        // Segment-wise tokenisation agrees with tokenising the rendered text here.
        assert_eq!(ids, tok.encode(&render_chat(&sample())).unwrap());
        let masked_in: Vec<u32> = ids
            .iter()
            .zip(&mask)
            .filter(|(_, m)| **m == 1)
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(
            tok.decode(&masked_in).unwrap(),
            "Jane Austen.<|im_end|>Shakespeare, around 1600.<|im_end|>"
        );
    }
}

#[test]
fn padded_rows_have_attention_mask_and_ignored_targets() {
    let dir = tempfile::tempdir().unwrap();
    let tok = qwen();
    let convs = vec![
        sample(),
        conv(&[("user", "Say yes."), ("assistant", "Yes.")]),
        conv(&[("user", "No reply here.")]),
    ];
    let path = write(dir.path(), "chat.jsonl", jsonl(&convs).as_bytes());
    let opts = ChatOptions {
        seq_len: 64,
        pack: false,
        system_prompt: Some("Be kind.".into()),
        template: None,
        ..ChatOptions::default()
    };
    let ds = SftDataset::load(&path, &tok, &opts).unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds.stats().dropped, 1);
    let b = ds.batch(&[0, 1]);
    assert_eq!((b.batch_size, b.seq_len, b.inputs.len()), (2, 64, 128));
    let attn = b.attention_mask.as_ref().unwrap();
    for r in 0..2 {
        let real = ds.rows()[r].ids.len() - 1;
        let row_attn = &attn[r * 64..(r + 1) * 64];
        assert!(row_attn[..real].iter().all(|&a| a == 1));
        assert!(row_attn[real..].iter().all(|&a| a == 0));
        for p in real..64 {
            assert_eq!(b.targets[r * 64 + p], IGNORE_INDEX);
            assert_eq!(b.inputs[r * 64 + p], ds.pad_id());
        }
        // Targets are the next input where both are real.
        for p in 0..real - 1 {
            let t = b.targets[r * 64 + p];
            assert!(t == IGNORE_INDEX || t == b.inputs[r * 64 + p + 1] as i64);
        }
    }
    let texts = target_text(&tok, &b);
    assert_eq!(
        texts[0],
        "Jane Austen.<|im_end|>Shakespeare, around 1600.<|im_end|>"
    );
    assert_eq!(texts[1], "Yes.<|im_end|>");
    // The system prompt was added only where no system message existed.
    let row1 = tok.decode(&ds.rows()[1].ids).unwrap();
    assert!(row1.starts_with("<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user"));
    let row0 = tok.decode(&ds.rows()[0].ids).unwrap();
    assert!(row0.starts_with("<|im_start|>system\nYou are terse."));
}

#[test]
fn packing_in_order_fills_rows_with_whole_conversations() {
    let tok = default_tok();
    let convs: Vec<Vec<Message>> = (0..20)
        .map(|i| {
            conv(&[
                ("user", &format!("Question {i}?")),
                ("assistant", &format!("Answer {i}.")),
            ])
        })
        .collect();
    let padded = SftDataset::from_conversations(
        &convs,
        &tok,
        &ChatOptions {
            seq_len: 128,
            pack: false,
            system_prompt: None,
            template: None,
            ..ChatOptions::default()
        },
    )
    .unwrap();
    let packed = SftDataset::from_conversations(
        &convs,
        &tok,
        &ChatOptions {
            seq_len: 128,
            pack: true,
            packing: Packing::InOrder,
            system_prompt: None,
            template: None,
            ..ChatOptions::default()
        },
    )
    .unwrap();
    assert_eq!(padded.len(), 20);
    assert!(packed.len() <= 20 / 3, "{} rows", packed.len());
    assert!(packed.rows().iter().all(|r| r.ids.len() <= 129));
    let ids = |d: &SftDataset| {
        d.rows()
            .iter()
            .flat_map(|r| r.ids.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&packed), ids(&padded), "same tokens, same order");
    let b = packed.batch(&[0]);
    let text = &target_text(&tok, &b)[0];
    assert!(
        text.starts_with("Answer 0.<|im_end|>Answer 1.<|im_end|>"),
        "{text}"
    );

    // Positions restart at every conversation's first token and at the padding; each
    // conversation's inputs and positions equal its own padded row's.
    let row = &packed.rows()[0];
    assert!(row.starts.len() >= 3, "{:?}", row.starts);
    let positions = b.positions.as_ref().expect("packed rows carry positions");
    let real = row.ids.len() - 1;
    let starts: Vec<usize> = (0..128).filter(|&i| positions[i] == 0).collect();
    let mut expected = row.starts.clone();
    expected.push(real);
    assert_eq!(starts, expected);
    for (c, &s) in row.starts.iter().enumerate() {
        let alone = padded.batch(&[c]);
        let n = padded.rows()[c].ids.len() - 1;
        assert_eq!(&b.inputs[s..s + n], &alone.inputs[..n], "conversation {c}");
        assert_eq!(
            &b.targets[s..s + n],
            &alone.targets[..n],
            "conversation {c}"
        );
        assert!(
            positions[s..s + n]
                .iter()
                .enumerate()
                .all(|(k, &p)| p == k as u32)
        );
    }
    assert_eq!(padded.batch(&[0]).positions, None, "one conversation a row");

    // `document_mask = false`: packed, without positions.
    let leaky = SftDataset::from_conversations(
        &convs,
        &tok,
        &ChatOptions {
            seq_len: 128,
            pack: true,
            document_mask: false,
            ..ChatOptions::default()
        },
    )
    .unwrap();
    assert_eq!(leaky.batch(&[0]).positions, None);
}

#[test]
fn separators_split_text_rows_into_documents() {
    let b = Batch {
        batch_size: 2,
        seq_len: 5,
        inputs: vec![4, 9, 5, 6, 9, 1, 2, 3, 4, 5],
        targets: vec![0; 10],
        attention_mask: None,
        positions: None,
        pairs: None,
    };
    let b = b.with_separator_documents(9);
    assert_eq!(
        b.positions.as_deref(),
        Some(&[0, 1, 0, 1, 2, 0, 1, 2, 3, 4][..])
    );
    assert_eq!(b.document_starts(0), vec![0, 2]);
    // A separator in the last position starts nothing inside the row.
    let last = Batch {
        batch_size: 1,
        seq_len: 3,
        inputs: vec![1, 2, 9],
        targets: vec![0; 3],
        attention_mask: None,
        positions: None,
        pairs: None,
    };
    assert_eq!(last.with_separator_documents(9).positions, None);
}

#[test]
fn long_conversations_are_truncated_and_counted() {
    let tok = default_tok();
    let long = "word ".repeat(200);
    let convs = vec![
        conv(&[("user", "Hi"), ("assistant", &long)]),
        conv(&[("user", &long), ("assistant", "late")]),
    ];
    let ds = SftDataset::from_conversations(
        &convs,
        &tok,
        &ChatOptions {
            seq_len: 32,
            pack: false,
            system_prompt: None,
            template: None,
            ..ChatOptions::default()
        },
    )
    .unwrap();
    assert_eq!(ds.stats().truncated, 2);
    assert_eq!(
        ds.stats().dropped,
        1,
        "the second has no assistant token left"
    );
    assert_eq!(ds.len(), 1);
    assert_eq!(ds.rows()[0].ids.len(), 33);
    assert!(
        ds.batch(&[0])
            .attention_mask
            .unwrap()
            .iter()
            .all(|&a| a == 1)
    );
}

#[test]
fn sft_sampler_resumes_exactly_directly_and_through_prefetcher() {
    let tok = default_tok();
    let convs: Vec<Vec<Message>> = (0..13)
        .map(|i| {
            conv(&[
                ("user", &format!("Q{i}")),
                ("assistant", &"a ".repeat(i + 1)),
            ])
        })
        .collect();
    let ds = Arc::new(
        SftDataset::from_conversations(
            &convs,
            &tok,
            &ChatOptions {
                seq_len: 48,
                pack: false,
                system_prompt: None,
                template: None,
                ..ChatOptions::default()
            },
        )
        .unwrap(),
    );
    let mut a = SftSampler::for_dataset(&ds, 4, 7).unwrap();
    let full: Vec<Batch> = (0..10).map(|_| a.next_batch(&ds)).collect();
    let mut b = SftSampler::for_dataset(&ds, 4, 7).unwrap();
    for _ in 0..5 {
        b.next_batch(&ds);
    }
    let json = serde_json::to_string(&b.cursor()).unwrap();
    let mut c = SftSampler::for_dataset(&ds, 4, 0).unwrap();
    c.restore(&serde_json::from_str(&json).unwrap()).unwrap();
    let rest: Vec<Batch> = (0..5).map(|_| c.next_batch(&ds)).collect();
    assert_eq!(rest, full[5..]);

    let mut pf = Prefetcher::sft(ds.clone(), SftSampler::for_dataset(&ds, 4, 7).unwrap(), 3);
    let got: Vec<Batch> = (0..10).map(|_| pf.next().unwrap().0).collect();
    assert_eq!(got, full);
    // The first 13 rows drawn (the first epoch) are a shuffled permutation of the 13 rows.
    let row_of = |inputs: &[u32]| (0..13).find(|&i| ds.batch(&[i]).inputs == inputs).unwrap();
    let epoch0: Vec<usize> = full
        .iter()
        .flat_map(|b| b.inputs.chunks(48).map(row_of).collect::<Vec<_>>())
        .take(13)
        .collect();
    let mut sorted = epoch0.clone();
    sorted.sort();
    assert_eq!(sorted, (0..13).collect::<Vec<_>>());
    assert_ne!(epoch0, sorted);
}

/// The same conversation as OpenAI-style `messages` and as ShareGPT `conversations` (with the
/// usual `human` / `gpt` names) loads to the same rows.
#[test]
fn sharegpt_and_messages_formats_load_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = default_tok();
    let messages = write(tmp.path(), "m.jsonl", jsonl(&[sample()]).as_bytes());
    fn from(r: &str) -> &str {
        match r {
            "user" => "human",
            "assistant" => "gpt",
            other => other,
        }
    }
    let turns: Vec<serde_json::Value> = sample()
        .iter()
        .map(|m| serde_json::json!({"from": from(&m.role), "value": m.content}))
        .collect();
    let line = serde_json::json!({ "conversations": turns }).to_string() + "\n";
    let sharegpt = write(tmp.path(), "s.jsonl", line.as_bytes());
    let opts = ChatOptions {
        seq_len: 64,
        ..ChatOptions::default()
    };
    let a = SftDataset::load(&messages, &tok, &opts).unwrap();
    let b = SftDataset::load(&sharegpt, &tok, &opts).unwrap();
    assert_eq!(a.rows(), b.rows());
    assert!(a.stats().target_tokens > 0);
}
