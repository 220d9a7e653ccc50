//! Packed token shards: the on-disk format, its metadata, and the memory-mapped reader.
//!
//! A prepared directory holds:
//! - `meta.json`: [`ShardMeta`] (tokenizer hash, dtype, counts, per-source fingerprints);
//! - `train-00000.bin`, `train-00001.bin`, ... and `val-00000.bin`, ...: each a 32-byte header
//!   followed by the tokens as little-endian `u16` (vocabulary <= 65,536) or `u32`.
//!
//! Header (all little-endian): magic `b"QWENBTOK"` (8 bytes), format version `u32` (= 1),
//! bytes per token `u32` (2 or 4), token count `u64`, 8 reserved zero bytes. A shard holds at
//! most 2^28 tokens. Within a split, shards concatenate into one token stream in which every
//! document is followed by the EOS token.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};

/// Version of the shard format and of [`ShardMeta`]; a mismatch forces re-preparation.
pub const FORMAT_VERSION: u32 = 1;
/// Shard file magic.
pub const MAGIC: &[u8; 8] = b"QWENBTOK";
/// Header size in bytes; token data starts here (aligned for `u16` and `u32`).
pub const HEADER_BYTES: usize = 32;
/// Name of the metadata file in a shard directory.
pub const META_FILE: &str = "meta.json";
/// Default maximum tokens per shard file.
pub const SHARD_TOKENS: usize = 1 << 28;

/// Train or validation split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training tokens.
    Train,
    /// Validation tokens.
    Val,
}

impl Split {
    /// `"train"` or `"val"`, the shard file prefix.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
        }
    }
}

/// One shard file of a split.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ShardFile {
    /// File name inside the shard directory.
    pub file: String,
    /// Tokens in this file.
    pub tokens: u64,
}

/// Counts and files of one split.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SplitMeta {
    /// Tokens in the split, EOS separators included.
    pub tokens: u64,
    /// Documents with at least one token in this split (a document cut by the train/val
    /// boundary counts in both).
    pub documents: u64,
    /// The split's shard files, in stream order.
    pub shards: Vec<ShardFile>,
}

/// Fingerprint and counts of one input file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SourceMeta {
    /// Path as discovered (input path joined with the path inside a directory).
    pub path: String,
    /// Size on disk in bytes.
    pub bytes: u64,
    /// Lower-case hex sha256 of the file on disk.
    pub sha256: String,
    /// Modification time in nanoseconds since the Unix epoch (for the cheap unchanged check).
    pub mtime_ns: u64,
    /// Non-empty documents read from it.
    pub documents: u64,
    /// Tokens produced from it, EOS separators included (train + val).
    pub tokens: u64,
}

/// Contents of `meta.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ShardMeta {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// sha256 of the tokenizer file ([`crate::Tok::hash`]).
    pub tokenizer_hash: String,
    /// Tokenizer path as given to `prepare` (informational).
    pub tokenizer_path: String,
    /// Vocabulary size including added tokens (max id + 1).
    pub vocab_size: usize,
    /// `"u16"` or `"u32"`.
    pub dtype: String,
    /// Document separator id, appended after every document.
    pub eos_id: u32,
    /// Fraction of each source's tokens (its tail) put in the validation split.
    pub val_fraction: f64,
    /// JSONL text field used.
    pub text_field: String,
    /// Training split.
    pub train: SplitMeta,
    /// Validation split.
    pub val: SplitMeta,
    /// Input files, in stream order.
    pub sources: Vec<SourceMeta>,
    /// Whether [`crate::prepare()`] found this directory up to date and did no tokenisation
    /// (not stored in the file).
    #[serde(skip)]
    pub reused: bool,
}

impl ShardMeta {
    /// The counts and files of `split`.
    pub fn split(&self, split: Split) -> &SplitMeta {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }

    /// Bytes per token (2 for `"u16"`, 4 for `"u32"`).
    pub fn token_bytes(&self) -> Result<usize> {
        dtype_bytes(&self.dtype).ok_or_else(|| DataError::Meta {
            path: PathBuf::from(META_FILE),
            message: format!("dtype is {:?}, expected \"u16\" or \"u32\"", self.dtype),
        })
    }

    /// Reads `dir/meta.json`.
    pub fn load(dir: &Path) -> Result<ShardMeta> {
        let path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DataError::Meta {
                path: path.clone(),
                message: format!(
                    "no token shards here; prepare them with `qwen-burn data prepare --out {}`",
                    dir.display()
                ),
            },
            _ => DataError::io(&path, e),
        })?;
        let meta: ShardMeta = serde_json::from_str(&text).map_err(|e| DataError::Meta {
            path: path.clone(),
            message: format!("invalid shard metadata: {e}"),
        })?;
        if meta.format_version != FORMAT_VERSION {
            return Err(DataError::Meta {
                path,
                message: format!(
                    "format_version is {}, this build reads {FORMAT_VERSION}; re-run `qwen-burn \
                     data prepare`",
                    meta.format_version
                ),
            });
        }
        Ok(meta)
    }

    /// Writes `dir/meta.json` atomically (temporary file, then rename).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(META_FILE);
        let tmp = dir.join(format!("{META_FILE}.tmp"));
        let json = serde_json::to_string_pretty(self).map_err(|e| DataError::Meta {
            path: path.clone(),
            message: format!("cannot serialise metadata: {e}"),
        })?;
        std::fs::write(&tmp, json + "\n").map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            DataError::io(&tmp, e)
        })?;
        std::fs::rename(&tmp, &path).map_err(|e| DataError::io(&path, e))
    }
}

/// Bytes per token of a dtype name.
pub(crate) fn dtype_bytes(dtype: &str) -> Option<usize> {
    match dtype {
        "u16" => Some(2),
        "u32" => Some(4),
        _ => None,
    }
}

/// The smallest dtype holding every id of a vocabulary.
pub fn dtype_for_vocab(vocab_size: usize) -> &'static str {
    if vocab_size <= 1 << 16 { "u16" } else { "u32" }
}

fn header(token_bytes: usize, tokens: u64) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(token_bytes as u32).to_le_bytes());
    h[16..24].copy_from_slice(&tokens.to_le_bytes());
    h
}

/// Writes one split as a sequence of shard files of at most `max_tokens` tokens each.
pub(crate) struct ShardWriter {
    dir: PathBuf,
    split: Split,
    token_bytes: usize,
    max_tokens: usize,
    buf: Vec<u8>,
    done: Vec<ShardFile>,
}

impl ShardWriter {
    pub(crate) fn new(dir: &Path, split: Split, token_bytes: usize, max_tokens: usize) -> Self {
        ShardWriter {
            dir: dir.to_path_buf(),
            split,
            token_bytes,
            max_tokens: max_tokens.max(1),
            buf: Vec::new(),
            done: Vec::new(),
        }
    }

    fn buffered_tokens(&self) -> usize {
        self.buf.len() / self.token_bytes
    }

    /// Appends tokens, flushing full shards to disk.
    pub(crate) fn push(&mut self, mut tokens: &[u32]) -> Result<()> {
        while !tokens.is_empty() {
            let room = self.max_tokens - self.buffered_tokens();
            let (now, rest) = tokens.split_at(room.min(tokens.len()));
            if self.token_bytes == 2 {
                for &t in now {
                    // prepare() checks vocab_size <= 2^16 before choosing u16.
                    self.buf.extend_from_slice(&(t as u16).to_le_bytes());
                }
            } else {
                for &t in now {
                    self.buf.extend_from_slice(&t.to_le_bytes());
                }
            }
            tokens = rest;
            if self.buffered_tokens() == self.max_tokens {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let n = self.buffered_tokens() as u64;
        let name = format!("{}-{:05}.bin", self.split.name(), self.done.len());
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut f = File::create(&tmp).map_err(|e| DataError::io(&tmp, e))?;
        f.write_all(&header(self.token_bytes, n))
            .and_then(|_| f.write_all(&self.buf))
            .and_then(|_| f.sync_all())
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                DataError::io(&tmp, e)
            })?;
        std::fs::rename(&tmp, &path).map_err(|e| DataError::io(&path, e))?;
        self.buf.clear();
        self.done.push(ShardFile {
            file: name,
            tokens: n,
        });
        Ok(())
    }

    /// Writes the last partial shard and returns the split's files.
    pub(crate) fn finish(mut self) -> Result<Vec<ShardFile>> {
        if !self.buf.is_empty() {
            self.flush()?;
        }
        Ok(self.done)
    }
}

/// One memory-mapped shard.
#[derive(Debug)]
struct MappedShard {
    map: Mmap,
    /// Index of its first token in the split's stream.
    start: usize,
    len: usize,
}

/// Read-only view of one split's token stream, memory-mapped.
#[derive(Debug)]
pub struct TokenStore {
    dir: PathBuf,
    meta: ShardMeta,
    split: Split,
    shards: Vec<MappedShard>,
    token_bytes: usize,
    len: usize,
}

impl TokenStore {
    /// Opens `split` of a prepared directory. With `expected_tokenizer_hash`, shards made with
    /// another tokenizer are an error naming both hashes and the directory.
    pub fn open(
        dir: &Path,
        split: Split,
        expected_tokenizer_hash: Option<&str>,
    ) -> Result<TokenStore> {
        let meta = ShardMeta::load(dir)?;
        if let Some(expected) = expected_tokenizer_hash
            && expected != meta.tokenizer_hash
        {
            return Err(DataError::TokenizerMismatch {
                dir: dir.to_path_buf(),
                expected: expected.to_string(),
                found: meta.tokenizer_hash.clone(),
            });
        }
        let token_bytes = meta.token_bytes()?;
        let mut shards = Vec::new();
        let mut start = 0usize;
        for sf in &meta.split(split).shards {
            let path = dir.join(&sf.file);
            let map = map_shard(&path, token_bytes, sf.tokens)?;
            let len = sf.tokens as usize;
            shards.push(MappedShard { map, start, len });
            start += len;
        }
        if start as u64 != meta.split(split).tokens {
            return Err(DataError::Meta {
                path: dir.join(META_FILE),
                message: format!(
                    "{} shards hold {start} tokens but the metadata says {}",
                    split.name(),
                    meta.split(split).tokens
                ),
            });
        }
        Ok(TokenStore {
            dir: dir.to_path_buf(),
            meta,
            split,
            shards,
            token_bytes,
            len: start,
        })
    }

    /// Number of tokens in the split.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the split holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies tokens `[start, start + out.len())` into `out`.
    ///
    /// # Panics
    /// If the range extends past [`TokenStore::len`] (a sampler bug, not a data error).
    pub fn read(&self, start: usize, out: &mut [u32]) {
        let end = start + out.len();
        assert!(
            end <= self.len,
            "token range {start}..{end} past the end of {} ({} tokens)",
            self.describe(),
            self.len
        );
        let mut pos = start;
        let mut filled = 0;
        // Shards are few; the first one holding `pos` is found by binary search.
        let mut i = self.shards.partition_point(|s| s.start + s.len <= pos);
        while filled < out.len() {
            let shard = &self.shards[i];
            let local = pos - shard.start;
            let n = (shard.len - local).min(out.len() - filled);
            let bytes =
                &shard.map[HEADER_BYTES + local * self.token_bytes..][..n * self.token_bytes];
            let dst = &mut out[filled..filled + n];
            if self.token_bytes == 2 {
                for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                    *d = u16::from_le_bytes([c[0], c[1]]) as u32;
                }
            } else {
                for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            filled += n;
            pos += n;
            i += 1;
        }
    }

    /// Tokens `[start, start + len)` as a new vector.
    pub fn read_vec(&self, start: usize, len: usize) -> Vec<u32> {
        let mut out = vec![0; len];
        self.read(start, &mut out);
        out
    }

    /// The directory's metadata.
    pub fn meta(&self) -> &ShardMeta {
        &self.meta
    }

    /// Which split this is.
    pub fn split(&self) -> Split {
        self.split
    }

    /// `"<split> split of <dir>"`, for messages.
    pub fn describe(&self) -> String {
        format!("{} split of {}", self.split.name(), self.dir.display())
    }
}

/// Maps a shard and checks its header and size against the metadata.
fn map_shard(path: &Path, token_bytes: usize, tokens: u64) -> Result<Mmap> {
    let bad = |message: String| DataError::BadShard {
        path: path.to_path_buf(),
        message,
    };
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    // SAFETY: the shard is opened read-only and never modified in place: `prepare` writes new
    // shards to temporary files and renames them. Truncating it under a running reader is
    // outside this program's control, as with any memory-mapped dataset.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::io(path, e))?;
    if map.len() < HEADER_BYTES || &map[..8] != MAGIC {
        return Err(bad("missing QWENBTOK header".into()));
    }
    let word = |r: std::ops::Range<usize>| {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&map[r]);
        u64::from_le_bytes(b)
    };
    let (version, bytes, n) = (word(8..12), word(12..16), word(16..24));
    if version != FORMAT_VERSION as u64 {
        return Err(bad(format!(
            "format version {version}, expected {FORMAT_VERSION}"
        )));
    }
    if bytes != token_bytes as u64 || n != tokens {
        return Err(bad(format!(
            "header says {n} tokens of {bytes} bytes, metadata says {tokens} of {token_bytes}"
        )));
    }
    let want = HEADER_BYTES as u64 + n * bytes;
    if map.len() as u64 != want {
        return Err(bad(format!("file is {} bytes, expected {want}", map.len())));
    }
    Ok(map)
}
