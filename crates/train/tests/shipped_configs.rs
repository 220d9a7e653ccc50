//! Every run config shipped in `configs/` and `experiments/` parses and validates under the
//! strict rules (no key silently ignored).

use std::path::Path;

use qwen_burn_train::RunConfig;

#[test]
fn shipped_configs_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in ["configs", "experiments"] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "toml")
                    // The key reference (tested below), not a run config.
                    && path.file_name().is_some_and(|n| n != "REFERENCE.toml")
                {
                    files.push(path);
                }
            }
        }
    }
    assert!(files.len() >= 10, "found only {files:?}");
    for file in &files {
        if let Err(e) = RunConfig::load(file, &[]) {
            panic!("{}: {e}", file.display());
        }
    }
}

/// `configs/REFERENCE.toml` is what `qwen-burn config --defaults` prints now, and it is TOML.
#[test]
fn the_config_reference_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/REFERENCE.toml");
    let shipped = std::fs::read_to_string(&path).unwrap();
    let now = qwen_burn_train::config::reference();
    assert!(
        shipped == now,
        "configs/REFERENCE.toml is stale: regenerate it with `qwen-burn config --defaults > \
         configs/REFERENCE.toml`"
    );
    let table: toml::Table = now.parse().expect("the reference is TOML");
    assert!(table.contains_key("training") && table.contains_key("logging"));
}
