//! The egress settings, `allow_out` and `deny_out`: a list of destinations in any form
//! Hermes hands over, checked by agent-sandbox's [`EgressPolicy`].

use std::collections::BTreeMap;

use agent_sandbox::EgressPolicy;

use super::{Value, invalid};
use crate::error::Error;

/// The egress policy of `allow_out` and `deny_out`; the error names the setting and entry.
pub fn egress(raw: &BTreeMap<String, Value>) -> Result<EgressPolicy, Error> {
    let allow = destinations(raw, "allow_out")?;
    let deny = destinations(raw, "deny_out")?;
    EgressPolicy::new(allow, deny).map_err(|error| match error {
        agent_sandbox::Error::InvalidEgress {
            list,
            entry,
            reason,
        } => invalid(list, format!("entry {entry:?} {reason}")),
        other => invalid("allow_out", other.to_string()),
    })
}

/// A list setting: a YAML list of text, or text with entries separated by commas, spaces
/// or new lines (how Hermes' config screens and `hermes config set` hand it over).
pub(super) fn destinations(raw: &BTreeMap<String, Value>, key: &str) -> Result<Vec<String>, Error> {
    let split = |text: &str| -> Vec<String> {
        text.split([',', '\n', ' ', '\t'])
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(str::to_owned)
            .collect()
    };
    match raw.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Str(text)) => {
            let text = text.trim();
            // `hermes config set` writes a JSON list as text.
            if text.starts_with('[') {
                let list: Vec<String> = serde_json::from_str(text).map_err(|error| {
                    invalid(key, format!("is not a JSON list of text ({error})"))
                })?;
                return Ok(list);
            }
            Ok(split(text))
        }
        Some(Value::List(items)) => items
            .iter()
            .map(|item| match item {
                Value::Str(text) => Ok(text.trim().to_owned()),
                other => Err(invalid(
                    key,
                    format!("entries must be text, not {}", other.kind()),
                )),
            })
            .collect(),
        Some(other) => Err(invalid(
            key,
            format!("must be a list of destinations, not {}", other.kind()),
        )),
    }
}
