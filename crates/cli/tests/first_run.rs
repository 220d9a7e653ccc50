//! What a new user sees first: errors without backtraces, MFU against a measured peak.

mod common;
use common::*;

#[test]
fn errors_print_their_causes_without_a_backtrace_unless_asked() {
    let args = ["train", "--config", "configs/no-such-config.toml"];
    let out = qwen_burn(&args, &[("RUST_BACKTRACE", "1")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("no-such-config.toml"), "{err}");
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    assert!(err.lines().count() <= 6, "{err}");
    // The switch for those who want one.
    let out = qwen_burn(&args, &[("QWEN_BURN_BACKTRACE", "1")]);
    assert!(stderr(&out).contains("Stack backtrace"), "{}", stderr(&out));
}

#[test]
fn the_first_run_measures_the_peak_instead_of_assuming_one() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 2, 2, "");
    let cache = tmp.path().join("cache");
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&tmp.path().join("run")),
        ],
        &[("QWEN_BURN_CACHE_DIR", s(&cache))],
    );
    let text = ok(&out) + &stderr(&out);
    assert!(
        text.contains("MFU is against this machine's peak, measured now"),
        "{text}"
    );
    assert!(!text.contains("assumed"), "{text}");
    // The figure is in the line, in TFLOP/s, and the MFU printed is against it.
    let tflops: f64 = text
        .split("measured now: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|x| x.parse().ok())
        .expect("a figure");
    assert!(tflops > 0.001 && tflops < 100.0, "{tflops}");
}
