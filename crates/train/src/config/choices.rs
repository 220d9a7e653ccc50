//! Wording of a config error where a named choice (an enum key) got a bool or a number.

use serde::de::DeserializeOwned;

/// The TOML value at a dotted `key` of `table`.
pub(super) fn lookup<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

/// How a TOML value's type reads in a message.
pub(super) fn toml_type(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// The allowed values of the enum at `path` (dotted, inside the section `value`), as serde's
/// "unknown variant" message lists them: `value` with that key set to a string no variant has.
pub(super) fn allowed_values<T: DeserializeOwned>(value: &toml::Value, path: &str) -> String {
    let mut probe = value.clone();
    let mut slot = Some(&mut probe);
    for part in path.split('.') {
        slot = slot
            .and_then(|v| v.as_table_mut())
            .and_then(|t| t.get_mut(part));
    }
    let Some(slot) = slot else {
        return "its named values".to_string();
    };
    *slot = toml::Value::String("\u{1}".to_string());
    match serde_path_to_error::deserialize::<_, T>(probe) {
        Err(e) => {
            let message = e.into_inner().message().to_string();
            message
                .split_once("expected ")
                .map_or("its named values".to_string(), |(_, rest)| {
                    rest.trim_start_matches("one of ").to_string()
                })
        }
        Ok(_) => "its named values".to_string(),
    }
}
