//! TensorBoard event files (issue 42): the bytes we write for two events equal those of
//! TensorBoard's own writer (`fixtures/tensorboard/make_fixture.py`), and a run with
//! `logging.tensorboard = true` writes one event per logged record holding each of its scalars.

use qwen_burn_train::observe::tensorboard::{crc32c, event, record, scalars};

#[test]
fn crc32c_matches_the_standard_check_value() {
    // RFC 3720's check value of CRC-32C.
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
}

#[test]
fn our_events_are_byte_for_byte_tensorboards() {
    let expected = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tensorboard/expected.tfevents"),
    )
    .unwrap();
    let mut ours = record(&event(1.5, 0, Some("brain.Event:2"), &[]));
    let values = vec![
        ("train/loss".to_string(), 2.5f32),
        ("train/moe_router/0/max_over_mean_load".to_string(), 1.25),
        ("val/bpb".to_string(), -0.1),
    ];
    ours.extend(record(&event(2.25, 300, None, &values)));
    assert_eq!(ours, expected);
}

#[test]
fn every_finite_number_of_a_record_is_a_tagged_scalar() {
    let json = serde_json::json!({
        "split": "train", "step": 10, "loss": 2.0, "skipped": true, "lr": null,
        "moe_router": [{"max_over_mean_load": 1.5}, {"max_over_mean_load": 1.25}],
        "figures": {"rewards/margins": 0.5},
    });
    let mut out = Vec::new();
    scalars("train", &json, &mut out);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let tags: Vec<_> = out.iter().map(|(t, v)| (t.as_str(), *v)).collect();
    assert_eq!(
        tags,
        [
            ("train/figures/rewards/margins", 0.5),
            ("train/loss", 2.0),
            ("train/moe_router/0/max_over_mean_load", 1.5),
            ("train/moe_router/1/max_over_mean_load", 1.25),
            ("train/skipped", 1.0),
        ]
    );
}
