//! TensorBoard event files (`logging.tensorboard = true`): every scalar of `metrics.jsonl`, in
//! `RUN/tensorboard/events.out.tfevents.<secs>.qwen-burn`, under the tag of its JSON path
//! (`train/loss`, `val/bpb`, `task/austen_cloze/acc_norm`, `train/moe_router/3/max_over_mean_load`).
//!
//! The format is TensorFlow's TFRecord framing (length, masked CRC-32C of the length, the
//! record, masked CRC-32C of the record) around `Event` protobufs (`wall_time`, `step`,
//! `summary.value { tag, simple_value }`). Both are written here, in 80 lines: the Rust
//! TensorBoard writers are unmaintained (`tensorboard-rs`, last released 2021, on protobuf 2)
//! and a protobuf crate's derive changed dependency features enough to rebuild Burn (see
//! `benches/README.md` on `hf-hub`). `crates/train/tests/tensorboard.rs` checks the bytes
//! against an event file written by TensorBoard's own writer, and
//! `crates/train/tests/fixtures/tensorboard/read_back.py` reads a run's file with TensorBoard's
//! reader and compares every scalar with `metrics.jsonl`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Result, TrainError};

/// CRC-32C (Castagnoli), bitwise with the reflected polynomial.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An `Event` protobuf: `wall_time` (1, double), `step` (2, int64), then either `file_version`
/// (3, string) or `summary` (5) with one `value { tag (1), simple_value (2, float) }` per scalar.
pub fn event(
    wall_time: f64,
    step: i64,
    file_version: Option<&str>,
    scalars: &[(String, f32)],
) -> Vec<u8> {
    let mut out = Vec::new();
    varint(&mut out, (1 << 3) | 1);
    out.extend_from_slice(&wall_time.to_le_bytes());
    if step != 0 {
        // proto3 leaves a field at its default value out.
        varint(&mut out, 2 << 3);
        varint(&mut out, step as u64);
    }
    if let Some(version) = file_version {
        bytes_field(&mut out, 3, version.as_bytes());
    }
    if !scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, v) in scalars {
            let mut value = Vec::new();
            bytes_field(&mut value, 1, tag.as_bytes());
            varint(&mut value, (2 << 3) | 5);
            value.extend_from_slice(&v.to_le_bytes());
            bytes_field(&mut summary, 1, &value);
        }
        bytes_field(&mut out, 5, &summary);
    }
    out
}

/// One TFRecord: the framing around `data`.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// Every finite number of a JSON record, as `(tag, value)`: object keys and array indices joined
/// by `/` under `prefix`; `step` and the record's kind are not scalars.
pub fn scalars(prefix: &str, value: &Value, out: &mut Vec<(String, f32)>) {
    match value {
        Value::Number(n) => {
            if let Some(v) = n.as_f64().filter(|v| v.is_finite()) {
                out.push((prefix.to_string(), v as f32));
            }
        }
        Value::Bool(b) => out.push((prefix.to_string(), f32::from(u8::from(*b)))),
        Value::Object(map) => {
            for (k, v) in map {
                if !matches!(k.as_str(), "step" | "split" | "task") {
                    scalars(&format!("{prefix}/{k}"), v, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                scalars(&format!("{prefix}/{i}"), v, out);
            }
        }
        Value::Null | Value::String(_) => {}
    }
}

/// An open event file.
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `RUN/tensorboard/` (a resumed run adds one; TensorBoard reads the
    /// folder as one run).
    pub fn create(run_dir: &Path) -> Result<Self> {
        let dir = run_dir.join("tensorboard");
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::io("create directory", &dir, e))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mut n = 0;
        let path = loop {
            let p = dir.join(format!(
                "events.out.tfevents.{}.qwen-burn.{n}",
                now.as_secs()
            ));
            if !p.exists() {
                break p;
            }
            n += 1;
        };
        let file = File::create(&path).map_err(|e| TrainError::io("create", &path, e))?;
        let mut writer = Self {
            file: BufWriter::new(file),
            path,
        };
        writer.append(&event(now.as_secs_f64(), 0, Some("brain.Event:2"), &[]))?;
        Ok(writer)
    }

    fn append(&mut self, event: &[u8]) -> Result<()> {
        self.file
            .write_all(&record(event))
            .and_then(|()| self.file.flush())
            .map_err(|e| TrainError::io("write", &self.path, e))
    }

    /// The scalars of one `metrics.jsonl` record (its JSON form), under `prefix`.
    pub fn write(&mut self, prefix: &str, step: usize, json: &Value) -> Result<()> {
        let mut values = Vec::new();
        scalars(prefix, json, &mut values);
        if values.is_empty() {
            return Ok(());
        }
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.append(&event(wall, step as i64, None, &values))
    }
}
