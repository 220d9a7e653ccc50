//! Window sampling, exact resume through a JSON cursor, eval batches and the prefetcher.

mod common;

use std::sync::Arc;

use common::*;
use qwen_burn_data::{
    Batch, Cursor, Prefetcher, SampleMode, Split, TokenStore, WindowSampler, eval_batches, prepare,
};

/// A prepared store of a few thousand tokens of repeated prose.
fn small_store(dir: &std::path::Path) -> TokenStore {
    let input = write(dir, "a.txt", prose(12).as_bytes());
    let out = dir.join("shards");
    prepare(&prep_opts(vec![input], &out)).unwrap();
    TokenStore::open(&out, Split::Train, None).unwrap()
}

/// A store whose 16-token windows are all distinct (increasing numbers).
fn unique_store(dir: &std::path::Path) -> TokenStore {
    let text: String = (0..700).map(|i| format!("word{i} ")).collect();
    let input = write(dir, "u.txt", text.as_bytes());
    let out = dir.join("unique");
    prepare(&prep_opts(vec![input], &out)).unwrap();
    TokenStore::open(&out, Split::Train, None).unwrap()
}

fn run(sampler: &mut WindowSampler, store: &TokenStore, n: usize) -> Vec<Batch> {
    (0..n).map(|_| sampler.next_batch(store)).collect()
}

#[test]
fn rows_are_shifted_windows_of_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let store = small_store(dir.path());
    let all = store.read_vec(0, store.len());
    for mode in [SampleMode::Random, SampleMode::Epochs] {
        let mut s = WindowSampler::new(store.len(), 4, 16, mode, 1).unwrap();
        let b = s.next_batch(&store);
        assert_eq!((b.batch_size, b.seq_len, b.inputs.len()), (4, 16, 64));
        assert!(b.attention_mask.is_none());
        for r in 0..4 {
            let inp = &b.inputs[r * 16..(r + 1) * 16];
            let tgt = &b.targets[r * 16..(r + 1) * 16];
            let start = all
                .windows(16)
                .position(|w| w == inp)
                .expect("row is in the stream");
            let want: Vec<i64> = all[start + 1..start + 17]
                .iter()
                .map(|&x| x as i64)
                .collect();
            assert_eq!(tgt, want.as_slice());
        }
    }
}

#[test]
fn same_seed_same_batches_other_seed_other_batches() {
    let dir = tempfile::tempdir().unwrap();
    let store = small_store(dir.path());
    for mode in [SampleMode::Random, SampleMode::Epochs] {
        let mk = |seed| WindowSampler::new(store.len(), 4, 16, mode, seed).unwrap();
        let (mut a, mut b, mut c) = (mk(5), mk(5), mk(6));
        assert_eq!(run(&mut a, &store, 3), run(&mut b, &store, 3));
        assert_ne!(run(&mut a, &store, 3), run(&mut c, &store, 3));
    }
}

#[test]
fn epochs_visit_every_window_once_then_reshuffle() {
    let dir = tempfile::tempdir().unwrap();
    let store = unique_store(dir.path());
    let t = 16;
    let windows = (store.len() - 1) / t;
    let mut s = WindowSampler::new(store.len(), 1, t, SampleMode::Epochs, 9).unwrap();
    let epoch0: Vec<Vec<u32>> = run(&mut s, &store, windows)
        .into_iter()
        .map(|b| b.inputs)
        .collect();
    assert_eq!(s.cursor().epoch, 0);
    assert_eq!(s.cursor().position, windows as u64);
    let epoch1: Vec<Vec<u32>> = run(&mut s, &store, windows)
        .into_iter()
        .map(|b| b.inputs)
        .collect();
    assert_eq!(s.cursor().epoch, 1);
    let mut sorted0 = epoch0.clone();
    sorted0.sort();
    sorted0.dedup();
    assert_eq!(sorted0.len(), windows, "each window exactly once");
    let mut sorted1 = epoch1.clone();
    sorted1.sort();
    sorted1.dedup();
    assert_eq!(sorted1.len(), windows);
    assert_ne!(epoch0, epoch1, "a new epoch has a new order");
}

/// A runs 2N batches; B runs N, saves the cursor as JSON, a fresh sampler restores it and runs
/// N more: the second halves are identical. N crosses an epoch boundary in epochs mode.
#[test]
fn resume_from_json_cursor_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = small_store(dir.path());
    let (bsz, t, n) = (8, 32, 25);
    assert!(n * bsz > (store.len() - 1) / t, "test must cross an epoch");
    for mode in [SampleMode::Random, SampleMode::Epochs] {
        let mut a = WindowSampler::new(store.len(), bsz, t, mode, 42).unwrap();
        let full = run(&mut a, &store, 2 * n);

        let mut b = WindowSampler::new(store.len(), bsz, t, mode, 42).unwrap();
        let first = run(&mut b, &store, n);
        let json = serde_json::to_string(&b.cursor()).unwrap();
        drop(b);

        let cursor: Cursor = serde_json::from_str(&json).unwrap();
        assert_eq!(cursor.step, n as u64);
        let mut c = WindowSampler::new(store.len(), bsz, t, mode, 0).unwrap();
        c.restore(&cursor).unwrap();
        let second = run(&mut c, &store, n);
        assert_eq!(first, full[..n], "{mode}");
        assert_eq!(second, full[n..], "{mode}");
        assert_eq!(c.cursor(), a.cursor(), "{mode}");
    }
}

/// The rows of global batch k are the same whatever its split into micro-batches (16 x 1,
/// 8 x 2, 4 x 4, 2 x 8), in both modes; a cursor taken under one split resumes under another
/// and continues the same rows; a cursor written before the global batch was recorded resumes
/// with its own batch size only.
#[test]
fn rows_depend_on_the_global_batch_not_its_split() {
    let dir = tempfile::tempdir().unwrap();
    let store = small_store(dir.path());
    let (g, t, steps) = (16, 32, 5);
    let rows = |b: &Batch| -> Vec<Vec<u32>> { b.inputs.chunks(t).map(<[u32]>::to_vec).collect() };
    for mode in [SampleMode::Random, SampleMode::Epochs] {
        let sampler = |b: usize| {
            WindowSampler::new(store.len(), b, t, mode, 7)
                .unwrap()
                .with_global_batch(g)
                .unwrap()
        };
        let drawn = |s: &mut WindowSampler, n: usize| -> Vec<Vec<u32>> {
            run(s, &store, n).iter().flat_map(rows).collect()
        };
        let whole = drawn(&mut sampler(g), steps);
        for b in [8, 4, 2] {
            assert_eq!(
                drawn(&mut sampler(b), steps * g / b),
                whole,
                "{mode}: {b} x {}",
                g / b
            );
        }
        // 8 x 2 for two steps, then resumed as 4 x 4.
        let mut first = sampler(8);
        let mut got = drawn(&mut first, 4);
        let mut second = sampler(4);
        second.restore(&first.cursor()).unwrap();
        got.extend(drawn(&mut second, (steps - 2) * 4));
        assert_eq!(got, whole, "{mode}: resumed under another split");
        // The global batch itself decides the order: 8 rows a step draws others (random).
        if mode == SampleMode::Random {
            let other = WindowSampler::new(store.len(), 8, t, mode, 7)
                .unwrap()
                .with_global_batch(8)
                .unwrap();
            assert_ne!(drawn(&mut other.clone(), 2), whole[..16].to_vec());
        }
    }
    // An old cursor (no global batch): the same batch size resumes; another is refused.
    let mut old = WindowSampler::new(store.len(), 8, t, SampleMode::Random, 7).unwrap();
    run(&mut old, &store, 3);
    let mut cursor = old.cursor();
    cursor.global_batch = 0;
    let mut same = WindowSampler::new(store.len(), 8, t, SampleMode::Random, 7)
        .unwrap()
        .with_global_batch(16)
        .unwrap();
    same.restore(&cursor).unwrap();
    assert_eq!(run(&mut same, &store, 1), run(&mut old, &store, 1));
    let mut other = WindowSampler::new(store.len(), 4, t, SampleMode::Random, 7).unwrap();
    let e = other.restore(&cursor).unwrap_err().to_string();
    assert!(e.contains("batch_size is 8"), "{e}");
}

#[test]
fn cursor_json_is_small_and_restore_checks_shape() {
    let mut s = WindowSampler::new(1000, 4, 10, SampleMode::Epochs, 3).unwrap();
    let json = serde_json::to_value(s.cursor()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"mode": "epochs", "seed": 3, "batch_size": 4, "seq_len": 10,
            "num_items": 99, "epoch": 0, "position": 0, "step": 0, "global_batch": 4})
    );
    let other = WindowSampler::new(1000, 8, 10, SampleMode::Epochs, 3).unwrap();
    let e = s.restore(&other.cursor()).unwrap_err().to_string();
    assert_eq!(
        e,
        "cannot restore data cursor: global batch (batch_size x grad_accum) is 8 in the cursor but 4 in this sampler"
    );
    let random = WindowSampler::new(1000, 4, 10, SampleMode::Random, 3).unwrap();
    assert!(
        s.restore(&random.cursor())
            .unwrap_err()
            .to_string()
            .contains("mode is random")
    );
    let bigger = WindowSampler::new(2000, 4, 10, SampleMode::Epochs, 3).unwrap();
    assert!(
        s.restore(&bigger.cursor())
            .unwrap_err()
            .to_string()
            .contains("data changed")
    );
}

#[test]
fn eval_batches_are_consecutive_windows_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = small_store(dir.path());
    let t = 64;
    let windows = (store.len() - 1) / t;
    let all = eval_batches(&store, 4, t, usize::MAX);
    assert_eq!(all.iter().map(|b| b.batch_size).sum::<usize>(), windows);
    assert_eq!(
        all.last().unwrap().batch_size,
        windows - 4 * (all.len() - 1)
    );
    let inputs: Vec<u32> = all.iter().flat_map(|b| b.inputs.clone()).collect();
    assert_eq!(inputs, store.read_vec(0, windows * t));
    assert_eq!(all[0].targets[t - 1], store.read_vec(t, 1)[0] as i64);
    assert_eq!(eval_batches(&store, 4, t, 2), all[..2]);
    assert!(eval_batches(&store, 4, store.len(), 2).is_empty());
}

#[test]
fn prefetcher_matches_sampler_and_its_cursor_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(small_store(dir.path()));
    for mode in [SampleMode::Random, SampleMode::Epochs] {
        let mk = || WindowSampler::new(store.len(), 4, 32, mode, 11).unwrap();
        let mut plain = mk();
        let want: Vec<(Batch, Cursor)> = (0..30)
            .map(|_| {
                let b = plain.next_batch(&store);
                (b, plain.cursor())
            })
            .collect();

        let mut pf = Prefetcher::windows(store.clone(), mk(), 4);
        let got: Vec<(Batch, Cursor)> = (0..10).map(|_| pf.next().unwrap()).collect();
        assert_eq!(got, want[..10]);
        // Let it run ahead, then checkpoint what was consumed, not what was prefetched.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let saved = got[9].1.clone();
        assert_eq!(saved.step, 10);
        drop(pf);

        let mut resumed = mk();
        resumed.restore(&saved).unwrap();
        let mut pf = Prefetcher::windows(store.clone(), resumed, 2);
        let rest: Vec<(Batch, Cursor)> = (0..20).map(|_| pf.next().unwrap()).collect();
        assert_eq!(rest, want[10..]);
        assert_eq!(pf.stats().batches, 20);
    }
}
