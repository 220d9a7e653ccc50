//! Parquet input (the format HF `datasets` writes): one document per row, from a string column,
//! read one row group at a time so a large file is never held whole in memory.

use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;

use crate::error::{DataError, Result, panic_message};

/// The documents of a Parquet file's text column, row group by row group.
pub struct ParquetDocuments {
    path: PathBuf,
    reader: SerializedFileReader<File>,
    projection: Type,
    column: String,
    next: usize,
}

fn err(path: &Path, message: impl Into<String>) -> DataError {
    DataError::Parquet {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Runs a call into the `parquet` crate, turning a panic into an error naming the file.
///
/// The crate's decoders index page buffers with lengths read from the file, and some corrupt
/// pages make them panic (a slice index out of range in `bit_util`, found by the fuzz) instead
/// of returning an error. Those lengths cannot all be checked before decoding without
/// re-implementing the decoders, so the panic is caught here and reported as the corrupt file it
/// is; the reader is not used after it (see [`ParquetDocuments::next_row_group`]).
fn guarded<T>(path: &Path, call: impl FnOnce() -> Result<T>) -> Result<T> {
    quiet_panics::install();
    let result = quiet_panics::QUIET.with(|quiet| {
        quiet.set(true);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
        quiet.set(false);
        result
    });
    result.unwrap_or_else(|panic| {
        Err(err(
            path,
            format!(
                "corrupt Parquet data: the parquet crate failed while decoding it ({})",
                panic_message(&*panic)
            ),
        ))
    })
}

/// The panic hook's message ("thread ... panicked at ...") is not printed for a panic that
/// [`guarded`] turns into an error: a user would read it as a crash before the error that names
/// the corrupt file. One hook, installed once for the process, stays silent only on a thread
/// inside [`guarded`] and hands every other panic to the hook it replaced.
mod quiet_panics {
    use std::cell::Cell;
    use std::sync::Once;

    thread_local! {
        pub static QUIET: Cell<bool> = const { Cell::new(false) };
    }

    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if !QUIET.with(Cell::get) {
                    previous(info);
                }
            }));
        });
    }
}

/// Every column chunk the footer lists must lie inside the file: the `parquet` crate asserts
/// (panics) on a negative offset or size when it reads the chunk, and a size beyond the file
/// would only fail later, after allocating for it.
fn check_chunks(path: &Path, reader: &SerializedFileReader<File>, file_len: u64) -> Result<()> {
    for (g, group) in reader.metadata().row_groups().iter().enumerate() {
        for chunk in group.columns() {
            let start = chunk
                .dictionary_page_offset()
                .unwrap_or(chunk.data_page_offset());
            let len = chunk.compressed_size();
            let inside = start >= 0
                && len >= 0
                && (start as u64)
                    .checked_add(len as u64)
                    .is_some_and(|end| end <= file_len);
            if !inside {
                return Err(err(
                    path,
                    format!(
                        "row group {g}, column `{}`: the footer places its data at byte {start}, \
                         {len} bytes long, outside the file ({file_len} bytes); the file is corrupt",
                        chunk.column_path()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Every row of a Parquet file as a JSON object (column name to value, nested lists and
/// structs included), with its 0-based row number: the reader of small tables such as
/// multiple-choice tasks, held whole in memory. More than `max_rows` rows is an error.
pub fn read_rows(
    path: &Path,
    max_rows: usize,
) -> Result<Vec<(usize, serde_json::Map<String, serde_json::Value>)>> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => DataError::MissingPath {
            path: path.to_path_buf(),
        },
        _ => DataError::io(path, e),
    })?;
    let file_len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    let reader = guarded(path, || {
        SerializedFileReader::new(file)
            .map_err(|e| err(path, format!("not a readable Parquet file: {e}")))
    })?;
    check_chunks(path, &reader, file_len)?;
    let declared = reader.metadata().file_metadata().num_rows();
    if declared < 0 || declared as u64 > max_rows as u64 {
        return Err(err(
            path,
            format!("the file declares {declared} rows; at most {max_rows} are read"),
        ));
    }
    guarded(path, || {
        let rows = reader
            .get_row_iter(None)
            .map_err(|e| err(path, e.to_string()))?;
        let mut out = Vec::new();
        for (i, row) in rows.enumerate() {
            if i == max_rows {
                return Err(err(path, format!("more than {max_rows} rows")));
            }
            let row = row.map_err(|e| err(path, format!("row {i}: {e}")))?;
            match row.to_json_value() {
                serde_json::Value::Object(map) => out.push((i, map)),
                other => return Err(err(path, format!("row {i} is not a record: {other}"))),
            }
        }
        Ok(out)
    })
}

impl ParquetDocuments {
    /// Open `path` and check that `column` is a top-level string column; the error names the
    /// file, and lists the columns it has when `column` is not one of them.
    pub fn open(path: &Path, column: &str) -> Result<Self> {
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DataError::MissingPath {
                path: path.to_path_buf(),
            },
            _ => DataError::io(path, e),
        })?;
        let file_len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
        let reader = guarded(path, || {
            SerializedFileReader::new(file)
                .map_err(|e| err(path, format!("not a readable Parquet file: {e}")))
        })?;
        check_chunks(path, &reader, file_len)?;
        let schema = reader.metadata().file_metadata().schema_descr();
        let root = schema.root_schema();
        let Some(field) = root.get_fields().iter().find(|f| f.name() == column) else {
            let names: Vec<&str> = root.get_fields().iter().map(|f| f.name()).collect();
            return Err(err(
                path,
                format!(
                    "no column `{column}` (the file has columns {names:?}; choose one with --text-column)"
                ),
            ));
        };
        let is_string = field.is_primitive()
            && field.get_physical_type() == PhysicalType::BYTE_ARRAY
            && (matches!(
                field.get_basic_info().logical_type_ref(),
                Some(LogicalType::String)
            ) || field.get_basic_info().converted_type() == ConvertedType::UTF8);
        if !is_string {
            let kind = if field.is_primitive() {
                format!(
                    "{}{}",
                    field.get_physical_type(),
                    match field.get_basic_info().logical_type_ref() {
                        Some(l) => format!(" ({l:?})"),
                        None => String::new(),
                    }
                )
            } else {
                "a nested group".into()
            };
            return Err(err(
                path,
                format!("column `{column}` has type {kind}, expected a string (UTF8) column"),
            ));
        }
        let projection = Type::group_type_builder(root.name())
            .with_fields(vec![field.clone()])
            .build()
            .map_err(|e| err(path, e.to_string()))?;
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            projection,
            column: column.to_string(),
            next: 0,
        })
    }

    /// Row groups in the file.
    pub fn num_row_groups(&self) -> usize {
        self.reader.metadata().num_row_groups()
    }

    /// The non-empty documents of the next row group (null and blank cells are skipped, as
    /// blank documents are in every format), or `None` after the last one.
    pub fn next_row_group(&mut self) -> Option<Result<Vec<String>>> {
        if self.next >= self.num_row_groups() {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let read = guarded(&self.path, || self.read_row_group(index));
        if read.is_err() {
            // After an error (a caught panic above all) the reader is not used again.
            self.next = usize::MAX;
        }
        Some(read)
    }

    fn read_row_group(&self, index: usize) -> Result<Vec<String>> {
        let context =
            |e: parquet::errors::ParquetError| err(&self.path, format!("row group {index}: {e}"));
        let group = self.reader.get_row_group(index).map_err(context)?;
        let rows = group
            .get_row_iter(Some(self.projection.clone()))
            .map_err(context)?;
        let mut docs = Vec::new();
        for row in rows {
            let row = row.map_err(context)?;
            for (_, field) in row.get_column_iter() {
                match field {
                    Field::Str(s) if !s.trim().is_empty() => docs.push(s.clone()),
                    Field::Str(_) | Field::Null => {}
                    other => {
                        return Err(err(
                            &self.path,
                            format!("column `{}` holds {other:?}, expected strings", self.column),
                        ));
                    }
                }
            }
        }
        Ok(docs)
    }
}
