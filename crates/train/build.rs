//! Embeds the git revision of the source tree at build time (`QWEN_BURN_GIT_REVISION`), so a
//! checkpoint records the code that wrote it, wherever the binary runs from.

use std::process::Command;

fn main() {
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
