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
                } else if path.extension().is_some_and(|e| e == "toml") {
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
