//! Structure-aware mutations of valid seeds: extreme values, edits and the dictionary of a
//! seed's keys and values.

use std::sync::Arc;

use proptest::prelude::*;

use crate::runner::Bytes;
/// Extreme JSON values that replace a value of a seed (text, so NaN and 1e999 can be spelled).
pub const JSON_EXTREMES: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "-9223372036854775808",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "4294967295",
    "4294967296",
    "1e308",
    "-1e308",
    "1e309",
    "1e999",
    "4.9e-324",
    "-0.0",
    "0.5",
    "1.5",
    "NaN",
    "nan",
    "Infinity",
    "-Infinity",
    "inf",
    "\"\"",
    "\"x\"",
    "\"NaN\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\u{1F600}\"",
    "true",
    "false",
    "null",
    "[]",
    "{}",
    "[null]",
    "[1, 2, 3]",
    "[-1]",
    "[18446744073709551616]",
    "{\"a\": 1}",
    "{\"type\": \"default\"}",
    "{\"rope_type\": \"yarn\", \"factor\": -1}",
    "{\"content\": 5}",
];

/// Extreme TOML values (NaN and infinities are TOML floats).
pub const TOML_EXTREMES: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "-9223372036854775808",
    "9223372036854775807",
    "9223372036854775808",
    "4294967296",
    "1e308",
    "-1e308",
    "1e309",
    "5e-324",
    "-0.0",
    "0.5",
    "nan",
    "+nan",
    "-nan",
    "inf",
    "+inf",
    "-inf",
    "\"\"",
    "\"x\"",
    "\"nan\"",
    "\"\\u0000\"",
    "'''multi\nline'''",
    "true",
    "false",
    "1979-05-27T07:32:00Z",
    "1979-05-27",
    "07:32:00",
    "[]",
    "{}",
    "[1, 2, 3]",
    "[\"a\", 1]",
    "{ a = 1 }",
    "{ from = \"x\" }",
];

/// Byte patterns inserted into or written over binary formats: integer extremes in both byte
/// orders, thrift varints, and magic numbers.
pub const BINARY_PATTERNS: &[&[u8]] = &[
    &[0x00],
    &[0xff],
    &[0x7f],
    &[0x80],
    &[0xff, 0xff, 0xff, 0xff],
    &[0xff, 0xff, 0xff, 0x7f],
    &[0x7f, 0xff, 0xff, 0xff],
    &[0x00, 0x00, 0x00, 0x80],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
    &[0xff, 0xff, 0xff, 0xff, 0x0f],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[0x19, 0xfc],
    &[0x1c, 0x15, 0x00],
    &[0x00, 0x00, 0x00, 0x00],
    &[0x10, 0x27, 0x00, 0x00],
    b"PAR1",
    b"{\"",
];

/// One edit of a seed. Indices are taken modulo what they index, so every edit applies to
/// every input.
#[derive(Clone, Debug)]
pub enum Edit {
    /// Replace the n-th value token (number, string, literal) with the k-th extreme value.
    Value(usize, usize),
    /// Replace the n-th key-like token (string or bare word) with the k-th name of the key
    /// list, so required keys disappear, unknown keys appear and known keys repeat.
    Key(usize, usize),
    /// Wrap the n-th value token in `depth` levels of `[` `]`.
    Nest(usize, usize),
    /// Delete the n-th line.
    DeleteLine(usize),
    /// Repeat the n-th line.
    DuplicateLine(usize),
    /// Swap two lines.
    SwapLines(usize, usize),
    /// XOR the byte at a position.
    Flip(usize, u8),
    /// Insert the k-th binary pattern at a position.
    InsertPattern(usize, usize),
    /// Write the k-th binary pattern over the bytes at a position.
    OverwritePattern(usize, usize),
    /// Insert arbitrary bytes.
    Insert(usize, Vec<u8>),
    /// Delete up to `len` bytes at a position.
    Delete(usize, usize),
    /// Cut the input at a position.
    Truncate(usize),
    /// Insert `len` bytes of another seed, from `from`, at `at`.
    Splice {
        /// Seed index.
        seed: usize,
        /// Start in that seed.
        from: usize,
        /// Bytes taken.
        len: usize,
        /// Where they go.
        at: usize,
    },
}

/// Nesting depths tried by [`Edit::Nest`]: around serde_json's limit of 128 and far beyond.
const DEPTHS: &[usize] = &[2, 16, 126, 127, 128, 129, 300, 3000, 20_000];

#[derive(Clone, Copy, PartialEq)]
enum TokenKind {
    Str,
    Num,
    Word,
}

/// Value-like tokens of JSON or TOML text: quoted strings, numbers and bare words.
fn tokens(text: &[u8]) -> Vec<(usize, usize, TokenKind)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        if c == b'"' {
            let start = i;
            i += 1;
            while i < text.len() && text[i] != b'"' {
                i += if text[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(text.len());
            out.push((start, i, TokenKind::Str));
        } else if c.is_ascii_digit()
            || ((c == b'-' || c == b'+') && text.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let start = i;
            i += 1;
            while i < text.len()
                && (text[i].is_ascii_alphanumeric() || matches!(text[i], b'.' | b'-' | b'+' | b'_'))
            {
                i += 1;
            }
            out.push((start, i, TokenKind::Num));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < text.len() && (text[i].is_ascii_alphanumeric() || text[i] == b'_') {
                i += 1;
            }
            out.push((start, i, TokenKind::Word));
        } else {
            i += 1;
        }
    }
    out
}

fn replace(buf: &mut Vec<u8>, start: usize, end: usize, with: &[u8]) {
    buf.splice(start..end, with.iter().copied());
}

/// Byte ranges of the lines of `buf` (each with its `\n`).
fn lines(buf: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            out.push((start, i + 1));
            start = i + 1;
        }
    }
    if start < buf.len() {
        out.push((start, buf.len()));
    }
    out
}

/// What [`Edit`]s draw from: the seeds, the extreme values and the key names of one format.
pub struct Dictionary {
    /// Valid inputs.
    pub seeds: Vec<Vec<u8>>,
    /// Replacement values ([`JSON_EXTREMES`] or [`TOML_EXTREMES`]).
    pub extremes: &'static [&'static str],
    /// Key names the parser knows (and a few it does not), quoted as the format needs.
    pub keys: Vec<String>,
}

impl Dictionary {
    /// Applies `edit` to `buf`.
    pub fn apply(&self, buf: &mut Vec<u8>, edit: &Edit) {
        let len = buf.len();
        match *edit {
            Edit::Value(n, k) => {
                let toks: Vec<_> = tokens(buf)
                    .into_iter()
                    .filter(|t| {
                        t.2 != TokenKind::Word
                            || matches!(
                                &buf[t.0..t.1],
                                b"true" | b"false" | b"null" | b"nan" | b"inf"
                            )
                    })
                    .collect();
                if let Some(&(s, e, _)) = toks.get(n % toks.len().max(1)) {
                    let with = self.extremes[k % self.extremes.len()];
                    replace(buf, s, e, with.as_bytes());
                }
            }
            Edit::Key(n, k) => {
                let toks: Vec<_> = tokens(buf)
                    .into_iter()
                    .filter(|t| t.2 != TokenKind::Num)
                    .collect();
                if let (Some(&(s, e, kind)), false) =
                    (toks.get(n % toks.len().max(1)), self.keys.is_empty())
                {
                    let key = &self.keys[k % self.keys.len()];
                    let with = if kind == TokenKind::Str {
                        format!("\"{key}\"")
                    } else {
                        key.clone()
                    };
                    replace(buf, s, e, with.as_bytes());
                }
            }
            Edit::Nest(n, d) => {
                let toks: Vec<_> = tokens(buf)
                    .into_iter()
                    .filter(|t| t.2 != TokenKind::Word)
                    .collect();
                if let Some(&(s, e, _)) = toks.get(n % toks.len().max(1)) {
                    let depth = DEPTHS[d % DEPTHS.len()];
                    let mut with = vec![b'['; depth];
                    with.extend_from_slice(&buf[s..e]);
                    with.extend(std::iter::repeat_n(b']', depth));
                    replace(buf, s, e, &with);
                }
            }
            Edit::DeleteLine(n) => {
                let l = lines(buf);
                if let Some(&(s, e)) = l.get(n % l.len().max(1)) {
                    replace(buf, s, e, &[]);
                }
            }
            Edit::DuplicateLine(n) => {
                let l = lines(buf);
                if let Some(&(s, e)) = l.get(n % l.len().max(1)) {
                    let line = buf[s..e].to_vec();
                    replace(buf, e, e, &line);
                }
            }
            Edit::SwapLines(a, b) => {
                let l = lines(buf);
                if l.len() >= 2 {
                    let (a, b) = (a % l.len(), b % l.len());
                    let (a, b) = (a.min(b), a.max(b));
                    if a != b {
                        let (la, lb) = (buf[l[a].0..l[a].1].to_vec(), buf[l[b].0..l[b].1].to_vec());
                        replace(buf, l[b].0, l[b].1, &la);
                        replace(buf, l[a].0, l[a].1, &lb);
                    }
                }
            }
            Edit::Flip(at, x) => {
                if len > 0 {
                    buf[at % len] ^= x.max(1);
                }
            }
            Edit::InsertPattern(at, k) => {
                let p = BINARY_PATTERNS[k % BINARY_PATTERNS.len()];
                let at = at % (len + 1);
                replace(buf, at, at, p);
            }
            Edit::OverwritePattern(at, k) => {
                let p = BINARY_PATTERNS[k % BINARY_PATTERNS.len()];
                let at = at % (len + 1);
                let end = (at + p.len()).min(len);
                replace(buf, at, end, p);
            }
            Edit::Insert(at, ref bytes) => {
                let at = at % (len + 1);
                replace(buf, at, at, bytes);
            }
            Edit::Delete(at, n) => {
                let at = at % (len + 1);
                let end = (at + n).min(len);
                replace(buf, at, end, &[]);
            }
            Edit::Truncate(at) => buf.truncate(at % (len + 1)),
            Edit::Splice {
                seed,
                from,
                len: n,
                at,
            } => {
                let other = &self.seeds[seed % self.seeds.len()];
                let from = from % (other.len() + 1);
                let end = (from + n).min(other.len());
                let at = at % (len + 1);
                let piece = other[from..end].to_vec();
                replace(buf, at, at, &piece);
            }
        }
    }
}

/// Any [`Edit`]; text-oriented edits weigh more than byte edits.
pub fn edit() -> impl Strategy<Value = Edit> {
    let n = any::<usize>;
    prop_oneof![
        6 => (n(), n()).prop_map(|(a, b)| Edit::Value(a, b)),
        3 => (n(), n()).prop_map(|(a, b)| Edit::Key(a, b)),
        1 => (n(), n()).prop_map(|(a, b)| Edit::Nest(a, b)),
        2 => n().prop_map(Edit::DeleteLine),
        1 => n().prop_map(Edit::DuplicateLine),
        1 => (n(), n()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        3 => (n(), any::<u8>()).prop_map(|(a, b)| Edit::Flip(a, b)),
        2 => (n(), n()).prop_map(|(a, b)| Edit::InsertPattern(a, b)),
        2 => (n(), n()).prop_map(|(a, b)| Edit::OverwritePattern(a, b)),
        1 => (n(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(a, b)| Edit::Insert(a, b)),
        1 => (n(), 1usize..64).prop_map(|(a, b)| Edit::Delete(a, b)),
        1 => n().prop_map(Edit::Truncate),
        1 => (n(), n(), 1usize..512, n()).prop_map(|(seed, from, len, at)| Edit::Splice { seed, from, len, at }),
    ]
}

/// Edits that keep JSON or TOML syntax most of the time (values, keys, nesting, whole
/// lines), for the tests of in-memory parsers that take an already parsed document.
pub fn value_edit() -> impl Strategy<Value = Edit> {
    let n = any::<usize>;
    prop_oneof![
        6 => (n(), n()).prop_map(|(a, b)| Edit::Value(a, b)),
        3 => (n(), n()).prop_map(|(a, b)| Edit::Key(a, b)),
        1 => (n(), n()).prop_map(|(a, b)| Edit::Nest(a, b)),
        2 => n().prop_map(Edit::DeleteLine),
    ]
}

/// Byte-oriented edits only (for binary formats whose text parts are edited separately).
pub fn byte_edit() -> impl Strategy<Value = Edit> {
    let n = any::<usize>;
    prop_oneof![
        4 => (n(), any::<u8>()).prop_map(|(a, b)| Edit::Flip(a, b)),
        3 => (n(), n()).prop_map(|(a, b)| Edit::OverwritePattern(a, b)),
        1 => (n(), n()).prop_map(|(a, b)| Edit::InsertPattern(a, b)),
        1 => (n(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(a, b)| Edit::Insert(a, b)),
        1 => (n(), 1usize..64).prop_map(|(a, b)| Edit::Delete(a, b)),
        1 => n().prop_map(Edit::Truncate),
        1 => (n(), n(), 1usize..512, n()).prop_map(|(seed, from, len, at)| Edit::Splice { seed, from, len, at }),
    ]
}

/// Inputs for one parser: 85% a seed with 1 to 5 edits, 5% a seed unchanged, 10% random bytes.
pub fn mutated(dict: Arc<Dictionary>, edits: BoxedStrategy<Edit>) -> BoxedStrategy<Bytes> {
    mutated_with(dict, edits, 10)
}

/// As [`mutated`], with `random` percent of random bytes (the rest split 85:5 as there).
pub fn mutated_with(
    dict: Arc<Dictionary>,
    edits: BoxedStrategy<Edit>,
    random: u32,
) -> BoxedStrategy<Bytes> {
    let seeds = dict.seeds.len();
    let d = dict.clone();
    let edited = (0..seeds, proptest::collection::vec(edits, 1..6)).prop_map(move |(i, edits)| {
        let mut buf = d.seeds[i].clone();
        for e in &edits {
            d.apply(&mut buf, e);
        }
        Bytes(buf)
    });
    let unchanged = (0..seeds).prop_map(move |i| Bytes(dict.seeds[i].clone()));
    if random == 0 {
        return prop_oneof![17 => edited, 1 => unchanged].boxed();
    }
    prop_oneof![
        85 => edited,
        5 => unchanged,
        random => proptest::collection::vec(any::<u8>(), 0..2048).prop_map(Bytes),
    ]
    .boxed()
}
