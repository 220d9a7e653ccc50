//! Packing conversations into rows: best fit decreasing places them exactly as TRL 1.16.0's
//! `pack_dataset(strategy="bfd")` (`fixtures/packing/make_fixture.py`), and a packed row trains
//! each conversation as if it were alone.

use std::path::{Path, PathBuf};

use qwen_burn_data::packing::best_fit_decreasing;
use qwen_burn_data::{ChatOptions, Packing, SftDataset, Tok};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Case {
    name: String,
    capacity: usize,
    lengths: Vec<usize>,
    bins: Vec<Vec<usize>>,
}

fn cases() -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/packing/bins.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let list = |v: &serde_json::Value| -> Vec<usize> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect()
    };
    json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            capacity: c["capacity"].as_u64().unwrap() as usize,
            lengths: list(&c["lengths"]),
            bins: c["bins"].as_array().unwrap().iter().map(list).collect(),
        })
        .collect()
}

#[test]
fn best_fit_decreasing_places_every_sequence_where_trl_does() {
    for case in cases() {
        // TRL truncates sequences to the capacity before packing, as our loader does.
        let lengths: Vec<usize> = case.lengths.iter().map(|&n| n.min(case.capacity)).collect();
        assert_eq!(
            best_fit_decreasing(&lengths, case.capacity),
            case.bins,
            "case {:?}",
            case.name
        );
        // The rows we hand out are TRL's, ordered by the first sequence each holds.
        let mut ordered = case.bins.clone();
        ordered.sort_by_key(|b| b.iter().copied().min());
        let rows = Packing::BestFitDecreasing.rows(&lengths, case.capacity);
        assert_eq!(rows, ordered, "case {:?}", case.name);
        for row in &rows {
            assert!(row.iter().map(|&i| lengths[i]).sum::<usize>() <= case.capacity);
        }
        // In file order never needs fewer rows (and on these cases needs more).
        let in_order = Packing::InOrder.rows(&lengths, case.capacity);
        assert!(in_order.len() >= rows.len(), "case {:?}", case.name);
        let flat: Vec<usize> = in_order.concat();
        assert_eq!(flat, (0..lengths.len()).collect::<Vec<_>>());
    }
}

#[test]
fn best_fit_rows_of_the_shipped_chats_keep_each_conversation_alone() {
    let tok = Tok::from_file(&root().join("datasets/tokenizer.json")).unwrap();
    let path = root().join("datasets/chat/shakespeare_chat.jsonl");
    let load = |pack: bool, packing: Packing| {
        let opts = ChatOptions {
            seq_len: 128,
            pack,
            packing,
            ..ChatOptions::default()
        };
        SftDataset::load(&path, &tok, &opts).unwrap()
    };
    let alone = load(false, Packing::default());
    let best = load(true, Packing::BestFitDecreasing);
    let in_order = load(true, Packing::InOrder);
    assert!(
        best.len() < in_order.len(),
        "{} best-fit rows, {} in order",
        best.len(),
        in_order.len()
    );
    assert_eq!(best.stats(), in_order.stats());

    // Which conversation each packed span is: its tokens equal exactly one unpacked row's, and
    // every conversation appears once.
    let mut seen = vec![false; alone.len()];
    let mut next_unused = std::collections::HashMap::<&[u32], Vec<usize>>::new();
    for (i, r) in alone.rows().iter().enumerate() {
        next_unused.entry(&r.ids).or_default().push(i);
    }
    for (row_index, row) in best.rows().iter().enumerate() {
        assert!(row.ids.len() <= 129);
        let batch = best.batch(&[row_index]);
        let positions = batch
            .positions
            .as_ref()
            .expect("packed rows carry positions");
        let mut ends = row.starts[1..].to_vec();
        ends.push(row.ids.len());
        for (&s, &e) in row.starts.iter().zip(&ends) {
            let span = &row.ids[s..e];
            let c = next_unused
                .get_mut(span)
                .and_then(|v| v.pop())
                .expect("a packed span that is no conversation");
            seen[c] = true;
            // Inputs, targets and positions are the conversation's own, as if alone.
            let one = alone.batch(&[c]);
            let n = e - s - 1;
            assert_eq!(&batch.inputs[s..s + n], &one.inputs[..n]);
            assert_eq!(&batch.targets[s..s + n], &one.targets[..n]);
            assert!((0..n).all(|k| positions[s + k] == k as u32));
        }
    }
    assert!(seen.iter().all(|&s| s), "every conversation packed once");
}
