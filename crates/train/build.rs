//! Embeds the git revision of the source tree at build time (`QWEN_BURN_GIT_REVISION`), so a
//! checkpoint records the code that wrote it, wherever the binary runs from; and writes the
//! run-config keys with their doc comments (`config_keys.rs`), read from the section structs'
//! sources, for `qwen-burn config --defaults` (`config::reference`), so the reference cannot
//! drift from the types.

use std::process::Command;

/// `(section, key, type, doc)` of every field of a struct whose doc comment opens with its
/// section in backticks (`[training]`, `logging.peak_tflops`).
fn config_keys(source: &str, out: &mut Vec<(String, String, String, String)>) {
    let mut doc: Vec<String> = Vec::new();
    let mut section: Option<String> = None;
    let mut depth = 0usize;
    for line in source.lines() {
        let t = line.trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_string());
            continue;
        }
        if t.starts_with("#[") || t.is_empty() && doc.is_empty() {
            continue;
        }
        if let Some(rest) = t.strip_prefix("pub struct ") {
            section = doc.first().and_then(|d| {
                let d = d.strip_prefix('`')?;
                let name = &d[..d.find('`')?];
                Some(
                    name.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string(),
                )
            });
            depth = usize::from(rest.ends_with('{'));
            doc.clear();
            continue;
        }
        if depth == 1 && section.is_some() {
            if t == "}" {
                depth = 0;
                section = None;
            } else if let Some((key, ty)) = t
                .strip_prefix("pub ")
                .and_then(|field| field.trim_end_matches(',').split_once(": "))
            {
                out.push((
                    section.clone().unwrap_or_default(),
                    key.to_string(),
                    ty.to_string(),
                    doc.join(" "),
                ));
            }
        }
        doc.clear();
    }
}

fn main() {
    let mut keys = Vec::new();
    for path in [
        "src/config/data_keys.rs",
        "src/config/sections.rs",
        "src/config/lora.rs",
        "src/config/preference.rs",
        "src/config/rl.rs",
    ] {
        println!("cargo:rerun-if-changed={path}");
        let source = std::fs::read_to_string(path).expect("config sources");
        config_keys(&source, &mut keys);
    }
    let mut table = String::from("&[\n");
    for (section, key, ty, doc) in &keys {
        table.push_str(&format!("    ({section:?}, {key:?}, {ty:?}, {doc:?}),\n"));
    }
    table.push_str("]\n");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out.join("config_keys.rs"), table).expect("write config_keys.rs");

    let revision = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=QWEN_BURN_GIT_REVISION={revision}");
    // Rebuild when HEAD moves (a commit or a checkout); both paths are relative to this crate.
    for path in [
        "../../.git/HEAD",
        "../../.git/refs/heads",
        "../../.git/packed-refs",
    ] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
