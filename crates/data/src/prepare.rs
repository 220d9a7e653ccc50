//! `data prepare`: tokenise a corpus on all cores into packed shards (see [`crate::shards`]).
//!
//! Pipeline: discover input files, fingerprint them (size, mtime), and return the existing
//! metadata untouched when inputs, tokenizer and options are unchanged. Otherwise read files in
//! groups of up to 64 MiB, cut their documents into ~256 KiB pieces at tokenisation-neutral
//! newlines ([`crate::ingest::chunk_text`]), encode the pieces in parallel on a rayon pool,
//! reassemble them in order with EOS after each document, and append them to the shards.
//!
//! Validation split: the last `val_fraction` of each source file's tokens (cut at a token
//! boundary) goes to `val`, the rest to `train`. Every source therefore contributes to both
//! splits in proportion to its size, and the split does not depend on thread count or order.

use std::path::{Path, PathBuf};
use std::time::{Instant, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::error::{DataError, Result};
use crate::ingest::{self, LoadedSource, SourceFile, SourceKind};
use crate::parquet_source::ParquetDocuments;
use crate::shards::{
    FORMAT_VERSION, HEADER_BYTES, META_FILE, SHARD_TOKENS, ShardMeta, ShardWriter, SourceMeta,
    Split, SplitMeta, dtype_bytes, dtype_for_vocab,
};
use crate::tokenizer::{Tok, describe_inputs};

/// Raw bytes read per group of files; bounds memory while keeping all cores busy.
const GROUP_BYTES: u64 = 64 << 20;
/// Target size of a text piece tokenised as one task.
const PIECE_BYTES: usize = 256 << 10;

/// Options of [`prepare`].
#[derive(Clone, Debug)]
pub struct PrepareOptions {
    /// Files or directories (see [`crate::ingest`] for what is read and how).
    pub inputs: Vec<PathBuf>,
    /// The `tokenizer.json` to encode with.
    pub tokenizer: PathBuf,
    /// Output directory (created if missing).
    pub out: PathBuf,
    /// Fraction of each source's tokens (its tail) put in the validation split, in `[0, 1)`.
    pub val_fraction: f64,
    /// Field holding the text in JSONL inputs.
    pub text_field: String,
    /// Worker threads for tokenisation; `None` = all cores.
    pub threads: Option<usize>,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        PrepareOptions {
            inputs: Vec::new(),
            tokenizer: PathBuf::from("datasets/tokenizer.json"),
            out: PathBuf::from("data/default"),
            val_fraction: 0.05,
            text_field: "text".to_string(),
            threads: None,
            progress: false,
        }
    }
}

/// Tokenises the inputs into `opts.out`, or returns the existing metadata (with
/// [`ShardMeta::reused`] set) when inputs, tokenizer and options are unchanged.
pub fn prepare(opts: &PrepareOptions) -> Result<ShardMeta> {
    prepare_with_shard_size(opts, SHARD_TOKENS)
}

/// [`prepare`] with a custom maximum number of tokens per shard file.
pub fn prepare_with_shard_size(opts: &PrepareOptions, shard_tokens: usize) -> Result<ShardMeta> {
    if !(0.0..1.0).contains(&opts.val_fraction) {
        return Err(DataError::option(
            "val_fraction",
            format!("{} is outside [0, 1)", opts.val_fraction),
        ));
    }
    if opts.threads == Some(0) {
        return Err(DataError::option("threads", "must be at least 1"));
    }
    let tok = Tok::from_file(&opts.tokenizer)?;
    let eos = tok.require_eos()?;
    let dtype = dtype_for_vocab(tok.vocab_size());
    let token_bytes = dtype_bytes(dtype).unwrap_or(4);

    let files = ingest::discover(&opts.inputs)?;
    if files.is_empty() {
        return Err(DataError::EmptyCorpus {
            inputs: describe_inputs(&opts.inputs),
            detail: "no .txt/.jsonl(.gz)/.parquet files found".into(),
        });
    }
    let stats = files
        .iter()
        .map(|f| file_stat(&f.path))
        .collect::<Result<Vec<_>>>()?;

    if let Some(meta) = try_reuse(opts, &tok, &files, &stats)? {
        tracing::info!(
            dir = %opts.out.display(),
            train_tokens = meta.train.tokens,
            val_tokens = meta.val.tokens,
            "token shards are up to date; nothing to do"
        );
        return Ok(meta);
    }

    let t0 = Instant::now();
    std::fs::create_dir_all(&opts.out).map_err(|e| DataError::io(&opts.out, e))?;
    remove_old_outputs(&opts.out)?;
    let mut pool = rayon::ThreadPoolBuilder::new();
    if let Some(n) = opts.threads {
        pool = pool.num_threads(n);
    }
    let pool = pool
        .build()
        .map_err(|e| DataError::option("threads", format!("cannot start thread pool: {e}")))?;

    let total_disk: u64 = stats.iter().map(|s| s.0).sum();
    let pb = progress_bar(opts.progress, total_disk);
    let mut train = ShardWriter::new(&opts.out, Split::Train, token_bytes, shard_tokens);
    let mut val = ShardWriter::new(&opts.out, Split::Val, token_bytes, shard_tokens);
    let mut train_meta = SplitMeta::default();
    let mut val_meta = SplitMeta::default();
    let mut sources = Vec::with_capacity(files.len());
    let mut text_bytes = 0u64;

    // One source's token ids (EOS after each document) become its train and val parts.
    let mut finish_source = |ids: Vec<u32>,
                             doc_ends: Vec<usize>,
                             src_text_bytes: u64,
                             disk_bytes: u64,
                             sha256: String,
                             index: usize|
     -> Result<()> {
        let n_val = (ids.len() as f64 * opts.val_fraction).round() as usize;
        let cut = ids.len() - n_val;
        train.push(&ids[..cut])?;
        val.push(&ids[cut..])?;
        // A document cut by the boundary counts in both splits.
        let mut doc_start = 0;
        for &end in &doc_ends {
            train_meta.documents += u64::from(doc_start < cut);
            val_meta.documents += u64::from(end > cut);
            doc_start = end;
        }
        train_meta.tokens += cut as u64;
        val_meta.tokens += n_val as u64;
        text_bytes += src_text_bytes;
        sources.push(SourceMeta {
            path: path_key(&files[index].path),
            bytes: disk_bytes,
            sha256,
            mtime_ns: stats[index].1,
            documents: doc_ends.len() as u64,
            tokens: ids.len() as u64,
        });
        Ok(())
    };

    for group in groups(&files, &stats) {
        let group_files = &files[group.clone()];
        if let [file] = group_files
            && file.kind == SourceKind::Parquet
        {
            // Row group by row group: only one row group's text is in memory at a time.
            let (disk_bytes, sha256) = ingest::file_digest(&file.path)?;
            let mut reader = ParquetDocuments::open(&file.path, &opts.text_field)?;
            let (mut ids, mut doc_ends, mut src_text) = (Vec::new(), Vec::new(), 0u64);
            while let Some(docs) = reader.next_row_group() {
                let docs = docs?;
                src_text += docs.iter().map(|d| d.len() as u64).sum::<u64>();
                let (part, ends) = encode_documents(&pool, &tok, &docs, eos, &pb)?;
                let offset = ids.len();
                doc_ends.extend(ends.into_iter().map(|e| e + offset));
                ids.extend(part);
            }
            pb.inc_length(src_text.saturating_sub(disk_bytes));
            finish_source(ids, doc_ends, src_text, disk_bytes, sha256, group.start)?;
            continue;
        }
        let loaded: Vec<LoadedSource> = pool.install(|| {
            group_files
                .par_iter()
                .map(|f| {
                    let l = ingest::load(f, &opts.text_field)?;
                    if l.text_bytes > l.disk_bytes {
                        pb.inc_length(l.text_bytes - l.disk_bytes);
                    } else {
                        pb.inc(l.disk_bytes - l.text_bytes);
                    }
                    Ok(l)
                })
                .collect::<Result<_>>()
        })?;
        let pieces: Vec<(usize, usize, &str)> = loaded
            .iter()
            .enumerate()
            .flat_map(|(s, l)| {
                l.documents.iter().enumerate().flat_map(move |(d, doc)| {
                    ingest::chunk_text(doc, PIECE_BYTES)
                        .into_iter()
                        .map(move |p| (s, d, p))
                })
            })
            .collect();
        let encoded: Vec<Vec<u32>> = pool.install(|| {
            pieces
                .par_iter()
                .map(|(_, _, p)| {
                    let ids = tok.encode(p)?;
                    pb.inc(p.len() as u64);
                    Ok(ids)
                })
                .collect::<Result<_>>()
        })?;

        // Reassemble each source in order: pieces of a document, then EOS.
        let mut next = 0;
        for (s, l) in loaded.iter().enumerate() {
            let mut ids: Vec<u32> = Vec::new();
            let mut doc_ends = Vec::with_capacity(l.documents.len());
            for d in 0..l.documents.len() {
                while next < pieces.len() && pieces[next].0 == s && pieces[next].1 == d {
                    ids.extend_from_slice(&encoded[next]);
                    next += 1;
                }
                ids.push(eos);
                doc_ends.push(ids.len());
            }
            finish_source(
                ids,
                doc_ends,
                l.text_bytes,
                l.disk_bytes,
                l.sha256.clone(),
                group.start + s,
            )?;
        }
    }
    pb.finish_and_clear();

    if sources.iter().all(|s: &SourceMeta| s.documents == 0) {
        return Err(DataError::EmptyCorpus {
            inputs: describe_inputs(&opts.inputs),
            detail: format!("{} files but no non-empty documents", files.len()),
        });
    }
    train_meta.shards = train.finish()?;
    val_meta.shards = val.finish()?;
    let meta = ShardMeta {
        format_version: FORMAT_VERSION,
        tokenizer_hash: tok.hash(),
        tokenizer_path: opts.tokenizer.display().to_string(),
        vocab_size: tok.vocab_size(),
        dtype: dtype.to_string(),
        eos_id: eos,
        val_fraction: opts.val_fraction,
        text_field: opts.text_field.clone(),
        train: train_meta,
        val: val_meta,
        sources,
        reused: false,
    };
    meta.save(&opts.out)?;
    let secs = t0.elapsed().as_secs_f64();
    tracing::info!(
        dir = %opts.out.display(),
        files = files.len(),
        train_tokens = meta.train.tokens,
        val_tokens = meta.val.tokens,
        documents = meta.train.documents + meta.val.documents,
        dtype,
        "tokenised {:.1} MB in {secs:.1}s ({:.2} MB/s)",
        text_bytes as f64 / 1e6,
        text_bytes as f64 / 1e6 / secs.max(1e-9)
    );
    Ok(meta)
}

/// The key a source is recorded under in the metadata.
fn path_key(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// (size on disk, mtime in ns since the epoch; 0 if unavailable).
fn file_stat(path: &Path) -> Result<(u64, u64)> {
    let m = std::fs::metadata(path).map_err(|e| DataError::io(path, e))?;
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    Ok((m.len(), mtime))
}

/// Consecutive index ranges of files whose sizes add up to at most [`GROUP_BYTES`] (a larger
/// file is a group on its own, and so is every Parquet file, which is streamed by row group).
fn groups(files: &[SourceFile], stats: &[(u64, u64)]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, (size, _)) in stats.iter().enumerate() {
        let alone = files[i].kind == SourceKind::Parquet;
        let prev_alone = i > 0 && files[i - 1].kind == SourceKind::Parquet;
        if i > start && (bytes + size > GROUP_BYTES || alone || prev_alone) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    out.push(start..stats.len());
    out
}

/// Token ids of `docs` (EOS after each) and the end offset of each document, the pieces
/// encoded in parallel on `pool`.
fn encode_documents(
    pool: &rayon::ThreadPool,
    tok: &Tok,
    docs: &[String],
    eos: u32,
    pb: &ProgressBar,
) -> Result<(Vec<u32>, Vec<usize>)> {
    let pieces: Vec<(usize, &str)> = docs
        .iter()
        .enumerate()
        .flat_map(|(d, doc)| {
            ingest::chunk_text(doc, PIECE_BYTES)
                .into_iter()
                .map(move |p| (d, p))
        })
        .collect();
    let encoded: Vec<Vec<u32>> = pool.install(|| {
        pieces
            .par_iter()
            .map(|(_, p)| {
                let ids = tok.encode(p)?;
                pb.inc(p.len() as u64);
                Ok(ids)
            })
            .collect::<Result<_>>()
    })?;
    let mut ids = Vec::new();
    let mut ends = Vec::with_capacity(docs.len());
    let mut next = 0;
    for d in 0..docs.len() {
        while next < pieces.len() && pieces[next].0 == d {
            ids.extend_from_slice(&encoded[next]);
            next += 1;
        }
        ids.push(eos);
        ends.push(ids.len());
    }
    Ok((ids, ends))
}

fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "tokenising {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        pb.set_style(style);
    }
    pb
}

/// Returns the existing metadata when it was made from the same files (same paths and sizes,
/// and the same mtimes or else the same sha256), the same tokenizer and the same options, and
/// its shard files are intact in size. Refreshes recorded mtimes when only they changed.
fn try_reuse(
    opts: &PrepareOptions,
    tok: &Tok,
    files: &[SourceFile],
    stats: &[(u64, u64)],
) -> Result<Option<ShardMeta>> {
    if !opts.out.join(META_FILE).exists() {
        return Ok(None);
    }
    let mut meta = match ShardMeta::load(&opts.out) {
        Ok(m) => m,
        Err(e) => {
            tracing::info!("re-preparing: {e}");
            return Ok(None);
        }
    };
    let why = if meta.tokenizer_hash != tok.hash() {
        Some("the tokenizer changed")
    } else if meta.val_fraction != opts.val_fraction || meta.text_field != opts.text_field {
        Some("val_fraction or text_field changed")
    } else if meta.sources.len() != files.len()
        || meta
            .sources
            .iter()
            .zip(files.iter().zip(stats))
            .any(|(m, (f, s))| m.path != path_key(&f.path) || m.bytes != s.0)
    {
        Some("the input files changed")
    } else {
        None
    };
    if let Some(why) = why {
        tracing::info!(dir = %opts.out.display(), "re-preparing token shards: {why}");
        return Ok(None);
    }
    let mut touched = false;
    for (m, (f, s)) in meta.sources.iter_mut().zip(files.iter().zip(stats)) {
        if m.mtime_ns == s.1 {
            continue;
        }
        let raw = std::fs::read(&f.path).map_err(|e| DataError::io(&f.path, e))?;
        if hex::encode(Sha256::digest(&raw)) != m.sha256 {
            tracing::info!(file = %f.path.display(), "re-preparing token shards: file changed");
            return Ok(None);
        }
        m.mtime_ns = s.1;
        touched = true;
    }
    let token_bytes = meta.token_bytes()? as u64;
    for split in [Split::Train, Split::Val] {
        for sf in &meta.split(split).shards {
            let want = HEADER_BYTES as u64 + sf.tokens * token_bytes;
            let len = std::fs::metadata(opts.out.join(&sf.file)).map(|m| m.len());
            if len.ok() != Some(want) {
                tracing::info!(file = %sf.file, "re-preparing token shards: shard missing");
                return Ok(None);
            }
        }
    }
    if touched {
        meta.save(&opts.out)?;
    }
    meta.reused = true;
    Ok(Some(meta))
}

/// Removes a previous run's metadata and shard files, metadata first so that an interrupted
/// run never leaves metadata describing missing or partial shards.
fn remove_old_outputs(dir: &Path) -> Result<()> {
    let meta = dir.join(META_FILE);
    if meta.exists() {
        std::fs::remove_file(&meta).map_err(|e| DataError::io(&meta, e))?;
    }
    let entries = std::fs::read_dir(dir).map_err(|e| DataError::io(dir, e))?;
    for entry in entries {
        let path = entry.map_err(|e| DataError::io(dir, e))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ours = (name.starts_with("train-") || name.starts_with("val-"))
            && (name.ends_with(".bin") || name.ends_with(".bin.tmp"));
        if ours {
            std::fs::remove_file(&path).map_err(|e| DataError::io(&path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_cover_all_files_in_order() {
        let big = GROUP_BYTES;
        let stats = [(10, 0), (big, 0), (5, 0), (5, 0), (big - 20, 0), (30, 0)];
        let files: Vec<SourceFile> = (0..6)
            .map(|i| SourceFile::from_path(Path::new(&format!("f{i}.txt"))))
            .collect();
        assert_eq!(groups(&files, &stats), vec![0..1, 1..2, 2..5, 5..6]);
        // A Parquet file is streamed on its own.
        let mut with_parquet = files.clone();
        with_parquet[3] = SourceFile::from_path(Path::new("d.parquet"));
        assert_eq!(
            groups(&with_parquet, &stats),
            vec![0..1, 1..2, 2..3, 3..4, 4..5, 5..6]
        );
    }
}
