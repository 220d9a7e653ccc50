//! Corpus ingestion: finding input files, reading them (plain or gzipped), checking UTF-8,
//! extracting documents, and cutting long documents into pieces that can be tokenised in
//! parallel without changing the result.
//!
//! Document rules (used by both `data prepare` and `tokenizer train`):
//! - A plain-text file (any name other than `*.jsonl[.gz]`) is **one document**, its text kept
//!   byte for byte (a leading UTF-8 BOM is dropped). The shipped Austen novels and Shakespeare
//!   plays are therefore one document per work.
//! - A JSONL file (`*.jsonl`, `*.jsonl.gz`) holds one document per non-blank line, taken from a
//!   configurable string field (default `"text"`).
//! - A Parquet file (`*.parquet`) holds one document per row, taken from a string column (the
//!   same option as the JSONL field); it is read one row group at a time
//!   ([`crate::parquet_source`]). Null cells are skipped like empty documents.
//! - Documents that are empty or whitespace-only are skipped.
//! - Invalid UTF-8 is an error naming the file, the byte offset and the line; nothing is skipped
//!   silently.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{DataError, Result};
use crate::parquet_source::ParquetDocuments;

/// How a source file is parsed into documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// The whole file is one document.
    Text,
    /// One JSON object per line; the document is one string field.
    Jsonl,
    /// A Parquet file; one document per row, from one string column (read by row group).
    Parquet,
}

/// One input file after expanding directories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFile {
    /// Path as found (input path, joined with the relative path inside a directory).
    pub path: PathBuf,
    /// How to parse it.
    pub kind: SourceKind,
    /// Whether it is gzip-compressed (`.gz`), decompressed transparently.
    pub gz: bool,
}

impl SourceFile {
    /// Classifies a file by its name: `*.gz` is gzip, `*.jsonl[.gz]` is JSONL, anything else is
    /// plain text.
    pub fn from_path(path: &Path) -> SourceFile {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let gz = name.ends_with(".gz");
        let stem = name.strip_suffix(".gz").unwrap_or(&name);
        let kind = if stem.ends_with(".jsonl") {
            SourceKind::Jsonl
        } else if name.ends_with(".parquet") {
            SourceKind::Parquet
        } else {
            SourceKind::Text
        };
        SourceFile {
            path: path.to_path_buf(),
            kind,
            gz,
        }
    }
}

/// File names a directory walk picks up; explicitly named files are always taken.
fn is_corpus_name(name: &str) -> bool {
    let name = name.to_lowercase();
    let stem = name.strip_suffix(".gz").unwrap_or(&name);
    stem.ends_with(".txt") || stem.ends_with(".jsonl") || name.ends_with(".parquet")
}

/// Expands the inputs into a list of files, in a deterministic order.
///
/// Files are taken as given. Directories are walked recursively in sorted order, keeping
/// `*.txt`, `*.jsonl` and their `.gz` forms and skipping hidden entries (names starting with
/// `.`), so a `README.md` or `PROVENANCE.md` beside the texts is not ingested. A file reached
/// twice is listed once.
pub fn discover(inputs: &[PathBuf]) -> Result<Vec<SourceFile>> {
    if inputs.is_empty() {
        return Err(DataError::option(
            "inputs",
            "at least one input path is required",
        ));
    }
    let mut files = Vec::new();
    for input in inputs {
        let meta = fs::metadata(input).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DataError::MissingPath {
                path: input.clone(),
            },
            _ => DataError::io(input, e),
        })?;
        if meta.is_dir() {
            walk(input, &mut files)?;
        } else {
            files.push(SourceFile::from_path(input));
        }
    }
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(f.path.clone()));
    Ok(files)
}

fn walk(dir: &Path, out: &mut Vec<SourceFile>) -> Result<()> {
    let mut entries = fs::read_dir(dir)
        .map_err(|e| DataError::io(dir, e))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| DataError::io(dir, e))?;
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        let meta = fs::metadata(&path).map_err(|e| DataError::io(&path, e))?;
        if meta.is_dir() {
            walk(&path, out)?;
        } else if is_corpus_name(&name) {
            out.push(SourceFile::from_path(&path));
        }
    }
    Ok(())
}

/// A file's decoded text and the fingerprint of its bytes on disk.
#[derive(Debug)]
pub struct RawText {
    /// UTF-8 text (decompressed for `.gz`).
    pub text: String,
    /// Size of the file on disk.
    pub disk_bytes: u64,
    /// Lower-case hex sha256 of the file on disk.
    pub sha256: String,
}

/// Reads a file, decompresses it if `gz`, hashes the on-disk bytes and checks UTF-8.
pub fn read_text(path: &Path, gz: bool) -> Result<RawText> {
    let raw = fs::read(path).map_err(|e| DataError::io(path, e))?;
    let sha256 = hex::encode(Sha256::digest(&raw));
    let disk_bytes = raw.len() as u64;
    let bytes = if gz {
        let mut out = Vec::with_capacity(raw.len() * 3);
        flate2::read::MultiGzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| DataError::io(path, e))?;
        out
    } else {
        raw
    };
    let mut text = String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let line = 1 + bytes[..offset].iter().filter(|&&b| b == b'\n').count();
        DataError::InvalidUtf8 {
            path: path.to_path_buf(),
            offset,
            line,
            gz: if gz {
                ", of the decompressed stream"
            } else {
                ""
            },
        }
    })?;
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    Ok(RawText {
        text,
        disk_bytes,
        sha256,
    })
}

/// Reads a whole text file (gzipped if its name ends in `.gz`) as UTF-8, with the same
/// errors as corpus ingestion (missing file, invalid UTF-8 with byte offset and line).
pub fn read_text_file(path: &Path) -> Result<String> {
    if !path.exists() {
        return Err(DataError::MissingPath {
            path: path.to_path_buf(),
        });
    }
    Ok(read_text(path, SourceFile::from_path(path).gz)?.text)
}

/// Size and lower-case hex sha256 of a file, read in 1 MiB blocks.
pub fn file_digest(path: &Path) -> Result<(u64, String)> {
    let mut file = fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| DataError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((bytes, hex::encode(hasher.finalize())))
}

/// A source file read into documents.
#[derive(Debug)]
pub struct LoadedSource {
    /// Documents in file order; none is empty.
    pub documents: Vec<String>,
    /// Size of the file on disk.
    pub disk_bytes: u64,
    /// Total UTF-8 bytes of the documents.
    pub text_bytes: u64,
    /// Lower-case hex sha256 of the file on disk.
    pub sha256: String,
}

/// Reads one source into documents (see the module docs for the rules).
pub fn load(src: &SourceFile, text_field: &str) -> Result<LoadedSource> {
    if src.kind == SourceKind::Parquet {
        let (disk_bytes, sha256) = file_digest(&src.path)?;
        let mut reader = ParquetDocuments::open(&src.path, text_field)?;
        let mut documents = Vec::new();
        while let Some(docs) = reader.next_row_group() {
            documents.extend(docs?);
        }
        let text_bytes = documents.iter().map(|d| d.len() as u64).sum();
        return Ok(LoadedSource {
            documents,
            disk_bytes,
            text_bytes,
            sha256,
        });
    }
    let raw = read_text(&src.path, src.gz)?;
    let documents = match src.kind {
        SourceKind::Text => {
            if raw.text.trim().is_empty() {
                Vec::new()
            } else {
                vec![raw.text]
            }
        }
        SourceKind::Jsonl => jsonl_documents(&src.path, &raw.text, text_field)?,
        SourceKind::Parquet => unreachable!("read above"),
    };
    let text_bytes = documents.iter().map(|d| d.len() as u64).sum();
    Ok(LoadedSource {
        documents,
        disk_bytes: raw.disk_bytes,
        text_bytes,
        sha256: raw.sha256,
    })
}

/// The JSON type name used in messages.
pub fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Parses one JSONL line into a JSON object, or an error naming the file and line.
pub(crate) fn jsonl_object(
    path: &Path,
    line_no: usize,
    line: &str,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let err = |message: String| DataError::Jsonl {
        path: path.to_path_buf(),
        line: line_no,
        message,
    };
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(err(format!(
            "expected a JSON object, found {}",
            json_type(&other)
        ))),
        Err(e) => Err(err(format!("invalid JSON: {e}"))),
    }
}

/// A row's own template variables, `"chat_template_kwargs": {...}` (TRL's per-example column);
/// empty when it has none. `renders` says whether the row holds message lists for the template:
/// a text row (`what`: `line`, `prompt`) may not carry any. With `template`, each must be one it
/// reads ([`crate::ChatTemplate::check_kwargs`]). The error is the message, for the caller to
/// place (a line, a Parquet row).
pub(crate) fn row_template_kwargs(
    obj: &serde_json::Map<String, serde_json::Value>,
    renders: bool,
    what: &str,
    template: Option<&crate::ChatTemplate>,
) -> std::result::Result<crate::TemplateKwargs, String> {
    let kwargs = match obj.get("chat_template_kwargs") {
        None => return Ok(crate::TemplateKwargs::new()),
        Some(serde_json::Value::Object(kwargs)) => kwargs.clone(),
        Some(other) => {
            return Err(format!(
                "\"chat_template_kwargs\" is {}, expected an object of template variables",
                json_type(other)
            ));
        }
    };
    if !renders && !kwargs.is_empty() {
        return Err(format!(
            "\"chat_template_kwargs\" on a text {what}: only message lists are rendered with \
             the chat template; remove the field"
        ));
    }
    if let Some(template) = template {
        template
            .check_kwargs(&kwargs, "chat_template_kwargs")
            .map_err(|e| e.to_string())?;
    }
    Ok(kwargs)
}

fn jsonl_documents(path: &Path, text: &str, field: &str) -> Result<Vec<String>> {
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut obj = jsonl_object(path, i + 1, line)?;
        let err = |message: String| DataError::Jsonl {
            path: path.to_path_buf(),
            line: i + 1,
            message,
        };
        match obj.remove(field) {
            Some(serde_json::Value::String(s)) => {
                if !s.trim().is_empty() {
                    docs.push(s);
                }
            }
            Some(other) => {
                return Err(err(format!(
                    "text field {field:?} is {}, expected a string",
                    json_type(&other)
                )));
            }
            None => {
                let mut keys: Vec<&String> = obj.keys().collect();
                keys.sort();
                return Err(err(format!(
                    "missing text field {field:?} (the line has fields {keys:?}; choose the \
                     field with --text-field)"
                )));
            }
        }
    }
    Ok(docs)
}

/// Cuts `text` into consecutive pieces of at least `target` bytes (the last may be shorter)
/// whose concatenation is `text`.
///
/// Cuts are made only just after a single `'\n'` that sits between two non-whitespace
/// characters. Byte-level BPE pre-tokenizers (GPT-2's and Qwen's regex, and the one
/// [`crate::train_bpe`] writes) never join such a newline with the following character, so
/// tokenising the pieces separately and concatenating gives exactly the ids of the whole text;
/// a test checks this on the shipped corpus with the Qwen3, GPT-2 and default tokenizers.
/// Text with CRLF line ends has no such newline and stays one piece (correct, just serial).
pub fn chunk_text(text: &str, target: usize) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut search = target.max(1);
    while start + search < bytes.len() {
        let Some(cut) = find_cut(text, start + search) else {
            break;
        };
        pieces.push(&text[start..cut]);
        start = cut;
        search = target.max(1);
    }
    if start < bytes.len() || pieces.is_empty() {
        pieces.push(&text[start..]);
    }
    pieces
}

/// First safe cut position at or after byte `from` (see [`chunk_text`]).
fn find_cut(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = from;
    while i < bytes.len() {
        let nl = i + bytes[i..].iter().position(|&b| b == b'\n')?;
        let cut = nl + 1;
        // '\n' is ASCII, so both slices below start/end on char boundaries.
        let before = text[..nl].chars().next_back();
        let after = text[cut..].chars().next();
        if let (Some(b), Some(a)) = (before, after)
            && !b.is_whitespace()
            && !a.is_whitespace()
        {
            return Some(cut);
        }
        i = cut;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_concatenate_and_cut_only_at_single_newlines() {
        let text = "alpha beta\ngamma\n\ndelta\n epsilon\nzeta eta\ntheta";
        for target in [1, 3, 8, 20, 1000] {
            let pieces = chunk_text(text, target);
            assert_eq!(pieces.concat(), text, "target {target}");
            for p in &pieces[..pieces.len() - 1] {
                assert!(p.ends_with('\n'), "{p:?}");
                assert!(!p.ends_with("\n\n"), "{p:?}");
            }
        }
        assert_eq!(chunk_text(text, 1).len(), 4);
        assert_eq!(chunk_text("", 10), vec![""]);
    }

    #[test]
    fn classifies_names() {
        let f = SourceFile::from_path(Path::new("a/b.JSONL.gz"));
        assert_eq!((f.kind, f.gz), (SourceKind::Jsonl, true));
        let f = SourceFile::from_path(Path::new("a/b.txt"));
        assert_eq!((f.kind, f.gz), (SourceKind::Text, false));
        assert!(is_corpus_name("x.txt.gz") && !is_corpus_name("PROVENANCE.md"));
    }
}
