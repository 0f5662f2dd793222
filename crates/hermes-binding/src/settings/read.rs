//! One setting's value read and checked by its kind: text, a flag, seconds, a count, a URL,
//! metadata (a map, or text). Each refusal names the key and what is valid.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Value;
use super::table::{MAX_SETTING_SECONDS, Setting, SettingKind};
use crate::error::Error;

/// A setting refused: its key and why (the file is named by the caller that knows it).
pub(super) fn invalid(key: &str, reason: impl Into<String>) -> Error {
    Error::InvalidSetting {
        key: key.to_owned(),
        reason: reason.into(),
        file: None,
    }
}

/// A text setting, trimmed; absent or null is `None`.
pub(super) fn string(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<String>, Error> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Str(value)) => Ok(Some(value.trim().to_owned())),
        Some(other) => Err(invalid(
            key,
            format!("must be a string, not {}", other.kind()),
        )),
    }
}

/// A true-or-false setting; absent or null is `None`.
pub(super) fn boolean(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<bool>, Error> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(value)) => Ok(Some(*value)),
        Some(other) => Err(invalid(
            key,
            format!("must be true or false, not {}", other.kind()),
        )),
    }
}

/// One metadata value: text, or a number or flag written as text.
pub(super) fn metadata_value(key: &str, value: &Value) -> Result<String, Error> {
    match value {
        Value::Str(text) => Ok(text.clone()),
        Value::Int(number) => Ok(number.to_string()),
        Value::Bool(flag) => Ok(flag.to_string()),
        other => Err(invalid(
            "metadata",
            format!("value of {key:?} must be a string, not {}", other.kind()),
        )),
    }
}

/// How the text form is written, for error messages.
const METADATA_TEXT_FORM: &str =
    "write key=value pairs separated by commas or new lines, or a JSON object";

/// `metadata` given as text: a JSON object (`{"team": "infra"}`), or `key=value` pairs
/// separated by commas or new lines (`team=infra, tier=2`). Blank text is no metadata.
pub(super) fn metadata_text(text: &str) -> Result<BTreeMap<String, String>, Error> {
    let text = text.trim();
    if text.starts_with('{') {
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)
            .map_err(|error| {
                invalid(
                    "metadata",
                    format!("is not a JSON object ({error}); {METADATA_TEXT_FORM}"),
                )
            })?;
        return object
            .into_iter()
            .map(|(key, value)| {
                let value = match value {
                    serde_json::Value::String(text) => Value::Str(text),
                    serde_json::Value::Bool(flag) => Value::Bool(flag),
                    serde_json::Value::Number(number) => match number.as_i64() {
                        Some(number) => Value::Int(number),
                        None => Value::Other("a fractional number".to_owned()),
                    },
                    serde_json::Value::Null => Value::Null,
                    serde_json::Value::Array(_) => Value::Other("a list".to_owned()),
                    serde_json::Value::Object(_) => Value::Map(BTreeMap::new()),
                };
                Ok((key.clone(), metadata_value(&key, &value)?))
            })
            .collect();
    }
    let mut metadata = BTreeMap::new();
    for pair in text.split([',', '\n']).map(str::trim) {
        if pair.is_empty() {
            continue;
        }
        let Some((key, value)) = pair.split_once('=') else {
            return Err(invalid(
                "metadata",
                format!("{pair:?} has no '='; {METADATA_TEXT_FORM}"),
            ));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(invalid(
                "metadata",
                format!("{pair:?} has no key; {METADATA_TEXT_FORM}"),
            ));
        }
        if metadata
            .insert(key.to_owned(), value.trim().to_owned())
            .is_some()
        {
            return Err(invalid("metadata", format!("key {key:?} is given twice")));
        }
    }
    Ok(metadata)
}

/// A whole number of seconds within the setting's bounds; absent or null is `None`.
pub(super) fn seconds(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<Duration>, Error> {
    let min = match Setting::find(key).map(|setting| setting.kind) {
        Some(SettingKind::Seconds { min }) => min,
        _ => 0,
    };
    Ok(
        whole_number(raw, key, (min, MAX_SETTING_SECONDS), Some("seconds"))?
            .map(Duration::from_secs),
    )
}

/// A whole number within the setting's bounds; absent or null is `None`.
pub(super) fn count(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<usize>, Error> {
    let bounds = match Setting::find(key).map(|setting| setting.kind) {
        Some(SettingKind::Count { min, max }) => (min, max),
        _ => (0, u64::MAX),
    };
    Ok(whole_number(raw, key, bounds, None)?.map(|n| n as usize))
}

/// A whole number (an integer, or a float without a fraction) within `(min, max)`, refused
/// naming the `unit` it counts when there is one; absent or null is `None`.
fn whole_number(
    raw: &BTreeMap<String, Value>,
    key: &str,
    (min, max): (u64, u64),
    unit: Option<&str>,
) -> Result<Option<u64>, Error> {
    let value = match raw.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Int(value)) => *value,
        Some(Value::Float(value)) if value.fract() == 0.0 && value.is_finite() => *value as i64,
        Some(other) => {
            let of = unit.map(|unit| format!(" of {unit}")).unwrap_or_default();
            return Err(invalid(
                key,
                format!("must be a whole number{of}, not {}", other.kind()),
            ));
        }
    };
    match u64::try_from(value) {
        Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
        _ => {
            let unit = unit.map(|unit| format!(" {unit}")).unwrap_or_default();
            Err(invalid(
                key,
                format!("must be between {min} and {max}{unit}, not {value}"),
            ))
        }
    }
}

/// An http(s) URL without credentials, without its trailing slash; blank is `None`.
pub(super) fn url(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<String>, Error> {
    let Some(value) = string(raw, key)? else {
        return Ok(None);
    };
    if value.is_empty() {
        return Ok(None);
    }
    let scheme_ok = value.starts_with("http://") || value.starts_with("https://");
    if !scheme_ok || value.contains(char::is_whitespace) || value.contains('@') {
        // '@' would smuggle credentials into a URL that ends up in diagnostics.
        return Err(invalid(
            key,
            "must be an http:// or https:// URL without credentials",
        ));
    }
    Ok(Some(value.trim_end_matches('/').to_owned()))
}
