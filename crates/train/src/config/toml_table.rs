//! Operations on the TOML table of a run config before it is parsed: `--set` overrides, the
//! search for non-finite floats, and the conversion of the `[model]` table to HF JSON.

use crate::error::{Result, TrainError};

/// Parse `value` of a `--set key=value` as TOML, or as a bare string.
fn parse_override_value(value: &str) -> toml::Value {
    let doc = format!("v = {value}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(value.to_string())),
        Err(_) => toml::Value::String(value.to_string()),
    }
}

/// Apply `section.key=value` overrides to a TOML table.
pub fn apply_overrides(table: &mut toml::Table, overrides: &[String]) -> Result<()> {
    for item in overrides {
        // The error names the override as given when there is no usable key in it.
        let malformed = || {
            TrainError::config(
                "--set",
                format!("`{item}`: expected `section.key=value`, e.g. `optimizer.lr=3e-4`"),
            )
        };
        let (key, value) = item.split_once('=').ok_or_else(malformed)?;
        let path: Vec<&str> = key.trim().split('.').collect();
        if path.len() < 2 || path.iter().any(|p| p.is_empty()) {
            return Err(malformed());
        }
        let mut node = &mut *table;
        for part in &path[..path.len() - 1] {
            let entry = node
                .entry(part.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            node = entry
                .as_table_mut()
                .ok_or_else(|| TrainError::config(key, format!("`{part}` is not a table")))?;
        }
        node.insert(
            path[path.len() - 1].to_string(),
            parse_override_value(value.trim()),
        );
    }
    Ok(())
}

/// The first float in `table` that is NaN or infinite, as `(dotted key, value)`. No setting of
/// a run config takes one, and JSON (the `[model]` table's path to the HF parser) has no
/// spelling for them: they would silently become `null`, that is, the default.
pub(super) fn first_non_finite(table: &toml::Table) -> Option<(String, f64)> {
    fn walk(value: &toml::Value, path: &str) -> Option<(String, f64)> {
        match value {
            toml::Value::Float(f) if !f.is_finite() => Some((path.to_string(), *f)),
            toml::Value::Table(t) => t.iter().find_map(|(k, v)| walk(v, &format!("{path}.{k}"))),
            toml::Value::Array(a) => a
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, &format!("{path}[{i}]"))),
            _ => None,
        }
    }
    table.iter().find_map(|(k, v)| walk(v, k))
}

/// Convert a TOML value to JSON (for the HF-style `[model]` table). Non-finite floats have no
/// JSON spelling and become `null`; [`RunConfig::from_table`] refuses them before this runs.
pub fn toml_to_json(value: &toml::Value) -> serde_json::Value {
    match value {
        toml::Value::String(s) => serde_json::Value::String(s.clone()),
        toml::Value::Integer(i) => serde_json::json!(i),
        toml::Value::Float(f) => serde_json::json!(f),
        toml::Value::Boolean(b) => serde_json::Value::Bool(*b),
        toml::Value::Datetime(d) => serde_json::Value::String(d.to_string()),
        toml::Value::Array(a) => serde_json::Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => serde_json::Value::Object(
            t.iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
        ),
    }
}
