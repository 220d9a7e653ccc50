//! Fuzz cases of safetensors headers and sharded indexes.

use super::*;

/// Small valid safetensors files: every dtype we read and one we refuse, scalars, empty
/// tensors, with and without `__metadata__`.
fn safetensors_seeds() -> Vec<Vec<u8>> {
    let f32s: Vec<u8> = (0..12)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let halves: Vec<u8> = (0..8u16).flat_map(|i| (0x3c00 + i).to_le_bytes()).collect();
    let ints: Vec<u8> = (0..3i64).flat_map(|i| i.to_le_bytes()).collect();
    let one = 1.5f32.to_le_bytes();
    let seeds: Vec<Vec<SeedTensor<'_>>> = vec![
        vec![
            ("model.embed_tokens.weight", Dtype::F32, vec![3, 4], &f32s),
            ("model.norm.weight", Dtype::F16, vec![8], &halves),
        ],
        vec![
            ("lm_head.weight", Dtype::BF16, vec![2, 2, 2], &halves),
            ("scalar", Dtype::F32, vec![], &one),
            ("empty", Dtype::F32, vec![0, 5], &[]),
        ],
        vec![("ids", Dtype::I64, vec![3], &ints)],
    ];
    seeds
        .into_iter()
        .enumerate()
        .map(|(i, tensors)| {
            let views: Vec<(String, TensorView<'_>)> = tensors
                .into_iter()
                .map(|(k, dtype, shape, data)| {
                    (k.to_string(), TensorView::new(dtype, shape, data).unwrap())
                })
                .collect();
            let metadata =
                (i == 0).then(|| HashMap::from([("format".to_string(), "pt".to_string())]));
            safetensors::serialize(views, metadata).unwrap()
        })
        .collect()
}

/// A safetensors case: a header edited as JSON (its length prefix rewritten or not), then
/// edited as bytes; optionally a `model.safetensors.index.json` (edited as JSON) beside it.
#[derive(Clone, Debug)]
struct SafetensorsCase {
    seed: usize,
    header_edits: Vec<Edit>,
    fix_length: bool,
    byte_edits: Vec<Edit>,
    random: Option<Bytes>,
    index: Option<Vec<Edit>>,
}

const INDEX_SEED: &str = r#"{
  "metadata": {"total_size": 64},
  "weight_map": {
    "model.embed_tokens.weight": "model.safetensors",
    "model.norm.weight": "model.safetensors"
  }
}
"#;

const SAFETENSORS_KEYS: &[&str] = &[
    "__metadata__",
    "dtype",
    "shape",
    "data_offsets",
    "F32",
    "F16",
    "BF16",
    "I64",
    "F8_E4M3",
    "BOOL",
    "weight_map",
    "metadata",
    "model.safetensors",
    "model-00001-of-00002.safetensors",
    "../model.safetensors",
    "/dev/null",
    "",
];

#[test]
fn safetensors_header() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    let index = dir.path().join("model.safetensors.index.json");
    let seeds = safetensors_seeds();
    let headers = Arc::new(Dictionary {
        seeds: seeds
            .iter()
            .map(|s| {
                let n = u64::from_le_bytes(s[..8].try_into().unwrap()) as usize;
                s[8..8 + n].to_vec()
            })
            .collect(),
        extremes: support::JSON_EXTREMES,
        keys: SAFETENSORS_KEYS.iter().map(|k| k.to_string()).collect(),
    });
    let files = Arc::new(Dictionary {
        seeds: seeds.clone(),
        extremes: support::JSON_EXTREMES,
        keys: Vec::new(),
    });
    let indexes = Arc::new(Dictionary {
        seeds: vec![INDEX_SEED.as_bytes().to_vec()],
        extremes: support::JSON_EXTREMES,
        keys: SAFETENSORS_KEYS.iter().map(|k| k.to_string()).collect(),
    });
    let edits = || proptest::collection::vec(support::edit(), 0..4);
    let strategy = (
        0..seeds.len(),
        edits(),
        prop::bool::weighted(0.8),
        proptest::collection::vec(support::byte_edit(), 0..3),
        prop::option::weighted(0.05, proptest::collection::vec(any::<u8>(), 0..1024)),
        prop::option::weighted(0.2, edits()),
    )
        .prop_map(
            |(seed, header_edits, fix_length, byte_edits, random, index)| SafetensorsCase {
                seed,
                header_edits,
                fix_length,
                byte_edits,
                random: random.map(Bytes),
                index,
            },
        );
    let tally = Tally::default();
    support::run(
        "safetensors header (SafetensorsCheckpoint::open, read_f32)",
        strategy,
        &tally,
        |case| {
            let bytes = match &case.random {
                Some(Bytes(b)) => b.clone(),
                None => {
                    let seed = &seeds[case.seed];
                    let n = u64::from_le_bytes(seed[..8].try_into().unwrap()) as usize;
                    let mut header = seed[8..8 + n].to_vec();
                    for e in &case.header_edits {
                        headers.apply(&mut header, e);
                    }
                    let prefix = if case.fix_length {
                        header.len() as u64
                    } else {
                        n as u64
                    };
                    let mut bytes = prefix.to_le_bytes().to_vec();
                    bytes.extend_from_slice(&header);
                    bytes.extend_from_slice(&seed[8 + n..]);
                    for e in &case.byte_edits {
                        files.apply(&mut bytes, e);
                    }
                    bytes
                }
            };
            write(&file, &bytes);
            let mut input_len = bytes.len();
            match &case.index {
                Some(edits) => {
                    let mut text = INDEX_SEED.as_bytes().to_vec();
                    for e in edits {
                        indexes.apply(&mut text, e);
                    }
                    input_len += text.len();
                    write(&index, &text);
                }
                None => {
                    let _ = std::fs::remove_file(&index);
                }
            }
            let (result, peak) = support::measure(&bytes, || {
                let checkpoint = SafetensorsCheckpoint::open(dir.path())?;
                let mut keys: Vec<String> = checkpoint.keys().cloned().collect();
                keys.sort();
                for key in keys {
                    if let Some(read) = checkpoint.read_f32(&key) {
                        read?;
                    }
                }
                Ok::<_, ModelError>(())
            });
            tally.add(result.is_ok(), input_len, peak);
            SAFETENSORS_BOUND.check("safetensors", input_len, peak)?;
            // Every file read lies in the directory, so an error naming the file (or, for a
            // tensor's dtype, the checkpoint directory and the key) contains the directory.
            if let Err(e) = &result {
                check_names_file(e, dir.path())?;
            }
            Ok(())
        },
    );
}

/// Shard names in an index must be plain file names beside it: anything else (a parent
/// directory, an absolute path, a subdirectory, a non-string) is an error naming the index and
/// the entry, before any file is opened.
#[test]
fn safetensors_index_names_only_files_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    write(
        &dir.path().join("model.safetensors"),
        &safetensors_seeds()[0],
    );
    for bad in [
        r#""../model.safetensors""#,
        r#""/dev/stdin""#,
        r#""sub/model.safetensors""#,
        r#""""#,
        r#""..""#,
        "5",
        "null",
    ] {
        let text = format!(r#"{{"weight_map": {{"model.norm.weight": {bad}}}}}"#);
        write(&index, text.as_bytes());
        let e = SafetensorsCheckpoint::open(dir.path())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&index.display().to_string()) && e.contains("model.norm.weight"),
            "{bad}: {e}"
        );
    }
    write(&index, INDEX_SEED.as_bytes());
    SafetensorsCheckpoint::open(dir.path()).unwrap();
}
