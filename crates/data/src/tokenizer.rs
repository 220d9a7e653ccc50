//! Tokenizers: loading any Hugging Face `tokenizer.json`, and training a byte-level BPE like
//! Qwen's.
//!
//! [`Tok`] wraps [`tokenizers::Tokenizer`] with the few things the rest of the project needs:
//! plain encode/decode (no special tokens added, none skipped), the document separator, the
//! vocabulary size including added tokens, and a hash that ties token shards to the tokenizer
//! that made them.
//!
//! [`train_bpe`] writes a tokenizer with Qwen2/Qwen3's pipeline: NFC normalizer, the Qwen split
//! regex, byte-level pre-tokenizer and decoder, so every byte string is encodable and decoding
//! is lossless. Its special tokens come first, so `<|endoftext|>` is id 0 by default.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer, TokenizerBuilder};

use crate::error::{DataError, Result, panic_message};
use crate::ingest::{self, SourceKind};

/// Document separator of Qwen base models (and GPT-2), looked up first by [`Tok::eos_id`].
pub const ENDOFTEXT: &str = "<|endoftext|>";
/// Chat turn opener of the Qwen chat template.
pub const IM_START: &str = "<|im_start|>";
/// Chat turn closer of the Qwen chat template.
pub const IM_END: &str = "<|im_end|>";

/// End-of-document tokens tried in order by [`Tok::eos_id`].
const EOS_CANDIDATES: [&str; 4] = [ENDOFTEXT, "<|end_of_text|>", "</s>", "<eos>"];

/// The Qwen2/Qwen3 pre-tokenizer split regex (from Qwen's `tokenizer.json`).
pub const QWEN_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Bytes per text piece handed to the BPE trainer (see [`ingest::chunk_text`]).
const TRAIN_CHUNK_BYTES: usize = 64 * 1024;

/// The JSON bytes of a `tokenizer.json`, decompressed when the name ends in `.gz`.
pub fn read_tokenizer_json(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => DataError::MissingPath {
            path: path.to_path_buf(),
        },
        _ => DataError::io(path, e),
    })?;
    if !path.to_string_lossy().ends_with(".gz") {
        return Ok(raw);
    }
    let mut out = Vec::with_capacity(raw.len() * 6);
    std::io::Read::read_to_end(
        &mut flate2::read::MultiGzDecoder::new(raw.as_slice()),
        &mut out,
    )
    .map_err(|e| DataError::io(path, e))?;
    Ok(out)
}

/// Writes the tokenizer at `src` (plain or `.gz`) to `dest` as a plain `tokenizer.json`, byte
/// for byte, so its hash is unchanged. The write is atomic (temporary file, then rename): a
/// reader never sees half a file.
pub fn copy_tokenizer_json(src: &Path, dest: &Path) -> Result<()> {
    let bytes = read_tokenizer_json(src)?;
    let mut tmp = dest.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    // A failed write (a full disk) leaves no partial temporary file behind.
    std::fs::write(&tmp, bytes).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        DataError::io(&tmp, e)
    })?;
    std::fs::rename(&tmp, dest).map_err(|e| DataError::io(dest, e))
}

/// `[start, end)` byte offsets of a token in the encoded text.
pub type ByteSpan = (usize, usize);

/// A loaded tokenizer with cached special ids, vocabulary size and file hash.
#[derive(Clone, Debug)]
pub struct Tok {
    inner: Tokenizer,
    path: PathBuf,
    hash: String,
    eos: Option<u32>,
    vocab_size: usize,
}

impl Tok {
    /// Loads any Hugging Face `tokenizer.json`, or a gzip copy of one (`tokenizer.json.gz`).
    /// The hash is taken over the JSON bytes, so both forms are the same tokenizer.
    pub fn from_file(path: &Path) -> Result<Tok> {
        let bytes = read_tokenizer_json(path)?;
        let load_error = |message: String| DataError::TokenizerLoad {
            path: path.to_path_buf(),
            message,
        };
        // The `tokenizers` crate panics on some malformed files instead of returning an error
        // (its decoder deserialiser calls `expect` on a nested parse, e.g. for a `decoder`
        // object with a non-string key), so a panic while parsing is caught and reported as
        // the load error it should have been. Nothing outlives the call, so no broken state
        // is observable afterwards.
        let parsed =
            std::panic::catch_unwind(|| Tokenizer::from_bytes(&bytes)).map_err(|panic| {
                load_error(format!(
                    "the tokenizers crate failed while parsing it: {}",
                    panic_message(&*panic)
                ))
            })?;
        let mut inner = parsed.map_err(|e| load_error(e.to_string()))?;
        // Documents are encoded whole and this crate builds its own batches, so the truncation
        // and padding of a tokenizer.json (settings for model inputs in transformers) are
        // switched off: they would silently cut or pad every document, and the tokenizers
        // crate panics while encoding under some truncation settings (a `stride` not below
        // `max_length` minus the special tokens).
        inner
            .with_truncation(None)
            .map_err(|e| load_error(e.to_string()))?;
        inner.with_padding(None);
        let hash = hex::encode(Sha256::digest(&bytes));
        let eos = EOS_CANDIDATES.iter().find_map(|t| inner.token_to_id(t));
        // Ids need not be dense (added tokens may sit above the base vocabulary), so the
        // embedding table needs max id + 1 rows.
        let max_id = inner.get_vocab(true).into_values().max().unwrap_or(0) as usize;
        let vocab_size = inner.get_vocab_size(true).max(max_id + 1);
        Ok(Tok {
            inner,
            path: path.to_path_buf(),
            hash,
            eos,
            vocab_size,
        })
    }

    /// Token ids of `text`, with no special tokens added. Special tokens written literally in
    /// the text (e.g. `<|im_start|>`) are recognised as such.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| DataError::tokenizer("encoding", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of `text` with the byte span of each token in `text` (no special tokens added).
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<ByteSpan>)> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| DataError::tokenizer("encoding", e))?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// Text of `ids`, special tokens included (`skip_special_tokens = false`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| DataError::tokenizer("decoding", e))
    }

    /// Id of a token (regular or added), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The document separator: `<|endoftext|>`, else `<|end_of_text|>`, `</s>` or `<eos>`.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Tokens that end a generation: the document separator and, when the vocabulary has it,
    /// the chat turn end `<|im_end|>` (what Qwen3's `generation_config.json` lists).
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos.into_iter().collect();
        if let Some(im_end) = self.token_id("<|im_end|>")
            && !ids.contains(&im_end)
        {
            ids.push(im_end);
        }
        ids
    }

    /// The document separator, or an error naming the tokenizer file.
    pub fn require_eos(&self) -> Result<u32> {
        self.eos.ok_or_else(|| DataError::MissingToken {
            path: self.path.clone(),
            token: ENDOFTEXT.to_string(),
            purpose: "to separate documents (also tried <|end_of_text|>, </s>, <eos>)".into(),
        })
    }

    /// The id of `token`, or an error naming the tokenizer file and `purpose`.
    pub fn require_token(&self, token: &str, purpose: &str) -> Result<u32> {
        self.token_id(token).ok_or_else(|| DataError::MissingToken {
            path: self.path.clone(),
            token: token.to_string(),
            purpose: purpose.to_string(),
        })
    }

    /// Number of ids, added tokens included (max id + 1): the embedding rows a model needs.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Lower-case hex sha256 of the `tokenizer.json` bytes.
    pub fn hash(&self) -> String {
        self.hash.clone()
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// The UTF-8 bytes of text each id stands for, indexed by id ([`Tok::vocab_size`] entries):
    /// the denominator of bits per byte.
    ///
    /// - A special added token (`<|endoftext|>`, `<|im_start|>`, ...) stands for no text: 0.
    /// - A non-special added token is inserted as its literal content: its UTF-8 length.
    /// - With a byte-level decoder (GPT-2, Qwen, and [`train_bpe`]'s tokenizers) every char of
    ///   a vocabulary entry stands for exactly one byte (GPT-2's `bytes_to_unicode` alphabet),
    ///   so the count is the entry's char count; this is exact even for tokens holding part of
    ///   a multi-byte character, which do not decode on their own.
    /// - Otherwise (SentencePiece-style vocabularies), a byte-fallback entry `<0xHH>` is one
    ///   byte and any other entry counts the bytes of its decoded text.
    ///
    /// The document separator ([`Tok::eos_id`]) gets 0 too, even where the vocabulary has it
    /// as a plain entry (GPT-2's `<|endoftext|>`): the data pipeline inserts it between
    /// documents; it is no text of theirs. Ids that are no token (gaps below an added token)
    /// get 0.
    pub fn token_bytes(&self) -> Vec<u32> {
        let byte_level = matches!(self.inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        let added = self.inner.get_added_tokens_decoder();
        let mut bytes = vec![0u32; self.vocab_size];
        for (id, slot) in bytes.iter_mut().enumerate() {
            let id = id as u32;
            if let Some(token) = added.get(&id) {
                *slot = if token.special {
                    0
                } else {
                    token.content.len() as u32
                };
                continue;
            }
            let Some(piece) = self.inner.id_to_token(id) else {
                continue;
            };
            *slot = if byte_level && piece.chars().all(is_byte_level_char) {
                piece.chars().count() as u32
            } else if is_byte_fallback(&piece) {
                1
            } else {
                self.inner
                    .decode(&[id], false)
                    .map_or(piece.len(), |text| text.len()) as u32
            };
        }
        if let Some(eos) = self.eos {
            bytes[eos as usize] = 0;
        }
        bytes
    }
}

/// A char of GPT-2's byte-level alphabet (`bytes_to_unicode`): the printable Latin-1 chars
/// stand for their own byte, and U+0100..U+0143 for the 68 other bytes, in order.
fn is_byte_level_char(c: char) -> bool {
    matches!(c, '!'..='~' | '\u{a1}'..='\u{ac}' | '\u{ae}'..='\u{ff}' | '\u{100}'..='\u{143}')
}

/// A SentencePiece byte-fallback piece, `<0xHH>`.
fn is_byte_fallback(piece: &str) -> bool {
    piece.len() == 6
        && piece.starts_with("<0x")
        && piece.ends_with('>')
        && piece[3..5].chars().all(|c| c.is_ascii_hexdigit())
}

/// Options of [`train_bpe`].
#[derive(Clone, Debug)]
pub struct TrainBpeOptions {
    /// Files or directories (see [`crate::ingest`] for what is read and how).
    pub inputs: Vec<PathBuf>,
    /// Final vocabulary size, special tokens and the 256 byte symbols included.
    pub vocab_size: usize,
    /// Special tokens, given ids `0..n` in this order.
    pub special_tokens: Vec<String>,
    /// Minimum pair count for a merge.
    pub min_frequency: u64,
    /// Field holding the text in JSONL inputs.
    pub text_field: String,
}

impl Default for TrainBpeOptions {
    fn default() -> Self {
        TrainBpeOptions {
            inputs: Vec::new(),
            vocab_size: 8192,
            special_tokens: default_special_tokens(),
            min_frequency: 2,
            text_field: "text".to_string(),
        }
    }
}

/// `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`: Qwen's document separator and chat markers.
pub fn default_special_tokens() -> Vec<String> {
    [ENDOFTEXT, IM_START, IM_END].map(String::from).to_vec()
}

/// Trains a byte-level BPE on the inputs, writes it to `out` (pretty JSON) and loads it back.
///
/// Files are read one at a time and handed to the trainer in pieces of about 64 KiB (cut as in
/// [`ingest::chunk_text`], which does not change pre-tokenization), so the pair counting runs on
/// all cores. Training is deterministic for a given input.
pub fn train_bpe(opts: &TrainBpeOptions, out: &Path) -> Result<Tok> {
    let min_vocab = opts.special_tokens.len() + 256 + 1;
    if opts.vocab_size < min_vocab {
        return Err(DataError::option(
            "vocab_size",
            format!(
                "{} is too small: need at least {min_vocab} (special tokens + 256 byte symbols \
                 + 1 merge)",
                opts.vocab_size
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for t in &opts.special_tokens {
        if t.is_empty() || !seen.insert(t) {
            return Err(DataError::option(
                "special_tokens",
                format!("{t:?} is empty or repeated"),
            ));
        }
    }
    let sources = ingest::discover(&opts.inputs)?;
    let inputs_desc = describe_inputs(&opts.inputs);
    // The output must not replace the text it is trained on (checked before any work).
    if let Ok(out_file) = out.canonicalize()
        && let Some(source) = sources
            .iter()
            .find(|s| s.path.canonicalize().is_ok_and(|p| p == out_file))
    {
        return Err(DataError::option(
            "out",
            format!(
                "{} is the training input {}; choose another file for the tokenizer",
                out.display(),
                source.path.display()
            ),
        ));
    }
    if sources.is_empty() {
        return Err(DataError::EmptyCorpus {
            inputs: inputs_desc,
            detail: "no .txt/.jsonl(.gz) files found".into(),
        });
    }

    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default())
    .with_normalizer(Some(NFC.into()))
    .with_pre_tokenizer(Some(qwen_pre_tokenizer()?))
    .with_post_processor(Some(byte_level().into()))
    .with_decoder(Some(byte_level().into()))
    .build()
    .map_err(|e| DataError::tokenizer("building the BPE tokenizer", e))?;

    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(opts.vocab_size)
        .min_frequency(opts.min_frequency)
        .show_progress(true)
        .special_tokens(
            opts.special_tokens
                .iter()
                .map(|t| AddedToken::from(t.clone(), true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();

    // The trainer pulls from an iterator and cannot take our errors, so the first read error
    // is parked here and returned after training.
    let first_error: Mutex<Option<DataError>> = Mutex::new(None);
    let mut text_bytes = 0u64;
    let mut documents = 0usize;
    let pieces = sources.iter().flat_map(|src| {
        let loaded = ingest::load(src, &opts.text_field);
        match loaded {
            Ok(l) => {
                text_bytes += l.text_bytes;
                documents += l.documents.len();
                let mut pieces = Vec::new();
                for doc in &l.documents {
                    pieces.extend(
                        ingest::chunk_text(doc, TRAIN_CHUNK_BYTES)
                            .into_iter()
                            .map(str::to_owned),
                    );
                }
                pieces
            }
            Err(e) => {
                if let Ok(mut slot) = first_error.lock() {
                    slot.get_or_insert(e);
                }
                Vec::new()
            }
        }
    });
    tokenizer
        .train(&mut trainer, pieces)
        .map_err(|e| DataError::tokenizer("training BPE", e))?;
    if let Some(e) = first_error.into_inner().ok().flatten() {
        return Err(e);
    }
    if documents == 0 {
        return Err(DataError::EmptyCorpus {
            inputs: inputs_desc,
            detail: format!("{} files but no non-empty documents", sources.len()),
        });
    }
    tracing::info!(
        files = sources.len(),
        documents,
        text_bytes,
        jsonl = sources.iter().any(|s| s.kind == SourceKind::Jsonl),
        "trained BPE with vocab size {}",
        opts.vocab_size
    );

    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| DataError::io(parent, e))?;
    }
    let tokenizer: Tokenizer = tokenizer.into();
    tokenizer
        .save(out, true)
        .map_err(|e| DataError::tokenizer(&format!("saving {}", out.display()), e))?;
    Tok::from_file(out)
}

/// ByteLevel step as Qwen configures it: no prefix space, no regex (the Split step splits).
fn byte_level() -> ByteLevel {
    ByteLevel::new(false, false, false)
}

/// Qwen's pre-tokenizer: split regex (isolated), then byte-level mapping.
fn qwen_pre_tokenizer() -> Result<PreTokenizerWrapper> {
    let split = Split::new(
        SplitPattern::Regex(QWEN_SPLIT_REGEX.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| DataError::tokenizer("compiling the split regex", e))?;
    Ok(Sequence::new(vec![split.into(), byte_level().into()]).into())
}

/// Inputs as a comma-separated list for messages.
pub(crate) fn describe_inputs(inputs: &[PathBuf]) -> String {
    inputs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
