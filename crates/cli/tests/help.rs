//! What a newcomer reads first (issue 42): `--help` names every command, `config --defaults`
//! prints the shipped reference, and `QWEN_BURN_FUSED_KERNELS=0` reaches `bench train` (and so
//! `train`, which decides the same way) unless the config sets `training.fused_kernels`.

mod common;
use common::*;

#[test]
fn help_names_every_command() {
    let help = ok(&qwen_burn(&["--help"], &[]));
    for command in [
        "train",
        "generate",
        "chat",
        "score",
        "eval",
        "export",
        "plot",
        "tokenizer",
        "data",
        "init",
        "batches",
        "config",
        "bench",
    ] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "`{command}` missing from --help:\n{help}"
        );
    }
}

#[test]
fn config_defaults_prints_the_shipped_reference() {
    let printed = ok(&qwen_burn(&["config", "--defaults"], &[]));
    let shipped = std::fs::read_to_string(repo_root().join("configs/REFERENCE.toml")).unwrap();
    assert_eq!(printed, shipped);
}

#[test]
fn the_fused_kernel_variable_reaches_training_unless_the_config_sets_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_config(dir.path(), false, 1, 1, "");
    let fused = |env: &str, extra: &[&str]| -> bool {
        let mut args = vec![
            "bench",
            "train",
            "--config",
            s(&config),
            "--steps",
            "1",
            "--warmup",
            "0",
            "--json",
        ];
        args.extend(extra);
        let out = ok(&qwen_burn(&args, &[("QWEN_BURN_FUSED_KERNELS", env)]));
        let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        json["fused_kernels"].as_bool().unwrap()
    };
    assert!(fused("1", &[]));
    assert!(!fused("0", &[]));
    assert!(fused("0", &["--set", "training.fused_kernels=true"]));
}
