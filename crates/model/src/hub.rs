//! Hugging Face hub ids (`Qwen/Qwen3-0.6B`, `Qwen/Qwen3-0.6B@main`, `ORG/NAME@<commit>`) for
//! every place that takes a model directory, resolved in the hub cache as huggingface_hub lays
//! it out: `models--ORG--NAME/refs/REV` holds a commit, `snapshots/COMMIT/` the files.
//!
//! The cache is `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`, as in
//! huggingface_hub. A path that exists is always a path; a hub id is tried only for a
//! `NAME/NAME[@REV]` that names no file. qwen-burn reads the cache and does not download: a
//! model that is not there is an error naming where it looked and the `hf download` command
//! that fetches it. (The Rust client, `hf-hub`, changed the build's dependency features enough
//! to rebuild all of Burn, 11.5 minutes on 2 cores, for a network this project's machines
//! rarely have; `benches/README.md`.)

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};
use crate::weights::index_shards;

/// A model repository on the hub, at a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    /// `ORG/NAME`.
    pub repo: String,
    /// A branch, tag or commit (`main` unless given after `@`).
    pub revision: String,
}

impl HubId {
    /// `ORG/NAME` or `ORG/NAME@REV`, with names of letters, digits, `-`, `_` and `.` (not
    /// starting with `.`); anything else is not a hub id.
    pub fn parse(spec: &str) -> Option<Self> {
        let (repo, revision) = match spec.split_once('@') {
            Some((repo, rev)) if !rev.is_empty() && !rev.contains(char::is_whitespace) => {
                (repo, rev)
            }
            Some(_) => return None,
            None => (spec, "main"),
        };
        let (org, name) = repo.split_once('/')?;
        let ok = |s: &str| {
            !s.is_empty()
                && !s.starts_with('.')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        (ok(org) && ok(name)).then(|| HubId {
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }

    /// The repository's folder in `cache` (`models--ORG--NAME`).
    pub fn folder(&self, cache: &Path) -> PathBuf {
        cache.join(format!("models--{}", self.repo.replace('/', "--")))
    }
}

/// The hub cache of this environment (see the module docs).
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// The snapshot directory of `id` in `cache`, if it holds a `config.json` and the weights
/// (`model.safetensors`, or an index whose every shard is there).
pub fn cached(id: &HubId, cache: &Path) -> Option<PathBuf> {
    let folder = id.folder(cache);
    // A branch or tag names a commit in `refs/`; a commit is a snapshot of its own.
    let commit = std::fs::read_to_string(folder.join("refs").join(&id.revision))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| id.revision.clone());
    if commit.is_empty() || commit.contains(['/', '\\']) || commit.starts_with('.') {
        return None;
    }
    let dir = folder.join("snapshots").join(commit);
    (dir.join("config.json").is_file() && weights_present(&dir)).then_some(dir)
}

fn weights_present(dir: &Path) -> bool {
    if dir.join("model.safetensors").is_file() {
        return true;
    }
    index_shards(&dir.join("model.safetensors.index.json"))
        .is_ok_and(|s| !s.is_empty() && s.iter().all(|f| dir.join(f).is_file()))
}

/// `spec` as a model directory: itself when it exists or is no hub id; else the snapshot of
/// that hub id in the cache (see the module docs).
pub fn resolve(spec: &Path) -> Result<PathBuf> {
    if spec.exists() {
        return Ok(spec.to_path_buf());
    }
    let Some(id) = spec.to_str().and_then(HubId::parse) else {
        return Ok(spec.to_path_buf());
    };
    let Some(cache) = cache_dir() else {
        return Err(hub_error(&id, None));
    };
    resolve_in(&id, &cache)
}

/// [`resolve`] of a hub id in a given cache.
pub fn resolve_in(id: &HubId, cache: &Path) -> Result<PathBuf> {
    cached(id, cache).ok_or_else(|| hub_error(id, Some(cache)))
}

fn hub_error(id: &HubId, cache: Option<&Path>) -> ModelError {
    let looked = match cache {
        Some(c) => format!(
            "not in the Hugging Face cache (looked for {} with refs/{} and a snapshot holding \
             config.json and the safetensors)",
            id.folder(c).display(),
            id.revision
        ),
        None => {
            "no Hugging Face cache to look in (HF_HUB_CACHE, HF_HOME and HOME are unset)".into()
        }
    };
    ModelError::Hub {
        id: format!("{}@{}", id.repo, id.revision),
        reason: format!(
            "neither a path nor a cached model: {looked}. Download it with `hf download {} \
             --revision {}` (pip install huggingface_hub), or set HF_HUB_CACHE or HF_HOME to \
             the cache that holds it",
            id.repo, id.revision
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_parse_as_huggingface_hub_names_them() {
        let id = HubId::parse("Qwen/Qwen3-0.6B").unwrap();
        assert_eq!(
            (id.repo.as_str(), id.revision.as_str()),
            ("Qwen/Qwen3-0.6B", "main")
        );
        assert_eq!(
            HubId::parse("Qwen/Qwen3-0.6B@v1.0").unwrap().revision,
            "v1.0"
        );
        for not_an_id in [
            "runs",
            "a/b/c",
            "./a/b",
            "a/.b",
            "/abs/path",
            "a/b@",
            "a b/c",
            "",
        ] {
            assert_eq!(HubId::parse(not_an_id), None, "{not_an_id}");
        }
        assert_eq!(
            id.folder(Path::new("/cache")),
            Path::new("/cache/models--Qwen--Qwen3-0.6B")
        );
    }

    #[test]
    fn a_snapshot_counts_only_with_its_config_and_every_shard() {
        let cache = std::env::temp_dir().join(format!("qwen-burn-hub-{}", std::process::id()));
        let id = HubId::parse("org/m").unwrap();
        let snap = id.folder(&cache).join("snapshots/abc");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(id.folder(&cache).join("refs")).unwrap();
        std::fs::write(id.folder(&cache).join("refs/main"), "abc\n").unwrap();
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        let index = r#"{"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}"#;
        std::fs::write(snap.join("model.safetensors.index.json"), index).unwrap();
        std::fs::write(snap.join("model-1.safetensors"), "").unwrap();
        let err = resolve_in(&id, &cache).unwrap_err().to_string();
        assert!(
            err.contains("models--org--m") && err.contains("hf download org/m"),
            "{err}"
        );
        std::fs::write(snap.join("model-2.safetensors"), "").unwrap();
        assert_eq!(resolve_in(&id, &cache).unwrap(), snap);
        // A commit as the revision needs no ref; a ref that points outside is refused.
        assert_eq!(
            resolve_in(&HubId::parse("org/m@abc").unwrap(), &cache).unwrap(),
            snap
        );
        std::fs::write(id.folder(&cache).join("refs/evil"), "../../x").unwrap();
        assert!(resolve_in(&HubId::parse("org/m@evil").unwrap(), &cache).is_err());
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
