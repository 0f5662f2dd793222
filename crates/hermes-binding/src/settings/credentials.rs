//! The `credentials` setting: variable name → hosts, header and format, checked by
//! agent-sandbox's [`Credential`]. Values never come from here: the profile's `.env` holds
//! them (X16).

use std::collections::BTreeMap;

use agent_sandbox::{Credential, Credentials};

use super::{Value, invalid};
use crate::error::Error;

const KEY: &str = "credentials";

/// The credentials of the `credentials` setting: a mapping of variable names to `{hosts,
/// header, format}` (or to the hosts alone), or its JSON text (Hermes' config screens hand
/// mappings over as text). The error names the setting and the variable.
pub fn credentials(raw: &BTreeMap<String, Value>) -> Result<Vec<Credential>, Error> {
    let entries = match raw.get(KEY) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Map(entries)) => entries.clone(),
        Some(Value::Str(text)) if text.trim().is_empty() => return Ok(Vec::new()),
        Some(Value::Str(text)) => match from_json(
            serde_json::from_str(text)
                .map_err(|error| invalid(KEY, format!("is not a JSON mapping ({error})")))?,
        ) {
            Value::Map(entries) => entries,
            other => {
                return Err(invalid(
                    KEY,
                    format!("must be a mapping, not {}", other.kind()),
                ));
            }
        },
        Some(other) => {
            return Err(invalid(
                KEY,
                format!(
                    "must be a mapping of variable names to hosts, not {}",
                    other.kind()
                ),
            ));
        }
    };
    let list = entries
        .into_iter()
        .map(|(name, entry)| credential(name, entry))
        .collect::<Result<Vec<_>, Error>>()?;
    // Conflicts and E2B's limits, checked now (the values come later).
    Credentials::new(list.clone(), std::sync::Arc::new(|_| None), String::new())
        .map_err(|error| invalid(KEY, error.to_string()))?;
    Ok(list)
}

fn credential(name: String, entry: Value) -> Result<Credential, Error> {
    let text = |field: &str, value: Option<&Value>| -> Result<Option<String>, Error> {
        match value {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Str(text)) => Ok(Some(text.clone())),
            Some(other) => Err(invalid(
                KEY,
                format!("{name}.{field} must be text, not {}", other.kind()),
            )),
        }
    };
    let (hosts, header, format) = match &entry {
        Value::Map(fields) => {
            if let Some(unknown) = fields
                .keys()
                .find(|field| !matches!(field.as_str(), "hosts" | "header" | "format"))
            {
                return Err(invalid(
                    KEY,
                    format!("{name} has an unknown field {unknown} (hosts, header, format)"),
                ));
            }
            (
                hosts(&name, fields.get("hosts"))?,
                text("header", fields.get("header"))?,
                text("format", fields.get("format"))?,
            )
        }
        // The hosts alone: `GITHUB_TOKEN: [api.github.com]`.
        Value::List(_) | Value::Str(_) => (hosts(&name, Some(&entry))?, None, None),
        other => {
            return Err(invalid(
                KEY,
                format!("{name} must be a mapping with hosts, not {}", other.kind()),
            ));
        }
    };
    Credential::new(name, hosts, header, format).map_err(|error| invalid(KEY, error.to_string()))
}

fn hosts(name: &str, value: Option<&Value>) -> Result<Vec<String>, Error> {
    match value {
        Some(Value::List(items)) => items
            .iter()
            .map(|item| match item {
                Value::Str(text) => Ok(text.trim().to_owned()),
                other => Err(invalid(
                    KEY,
                    format!("{name}.hosts entries must be text, not {}", other.kind()),
                )),
            })
            .collect(),
        Some(Value::Str(text)) => Ok(text
            .split([',', ' ', '\n', '\t'])
            .filter(|host| !host.is_empty())
            .map(str::to_owned)
            .collect()),
        None | Some(Value::Null) => Err(invalid(KEY, format!("{name} lists no hosts"))),
        Some(other) => Err(invalid(
            KEY,
            format!("{name}.hosts must be a list, not {}", other.kind()),
        )),
    }
}

fn from_json(value: serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(flag) => Value::Bool(flag),
        serde_json::Value::Number(number) => number
            .as_i64()
            .map(Value::Int)
            .unwrap_or_else(|| Value::Float(number.as_f64().unwrap_or_default())),
        serde_json::Value::String(text) => Value::Str(text),
        serde_json::Value::Array(items) => Value::List(items.into_iter().map(from_json).collect()),
        serde_json::Value::Object(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(key, value)| (key, from_json(value)))
                .collect(),
        ),
    }
}

/// The credentials of Hermes' own egress firewall (`proxy:` in `config.yaml`, enabled, and
/// its `mappings.json`: `env_name`, `upstream_hosts`, `match_headers`, `alias_env_names`), as
/// this backend applies them: every matched header set (`Bearer {value}` for `Authorization`,
/// the bare value otherwise), but an `Authorization` after the provider's own header; the
/// stand-in under every alias too, and an alias's value where the name has none; wildcard hosts (which
/// E2B-compatible servers need not take) are left out, and a mapping left with no host is
/// skipped. Names the plugin's own `credentials`
/// setting configures are not taken from here.
pub(super) fn from_hermes_mappings(
    mappings: &[Value],
    configured: &[Credential],
) -> Result<Vec<Credential>, Error> {
    let mut out = Vec::new();
    for mapping in mappings {
        let Value::Map(fields) = mapping else {
            continue;
        };
        let Some(Value::Str(name)) = fields.get("env_name") else {
            continue;
        };
        if configured.iter().any(|c| c.name() == name) {
            continue;
        }
        let hosts: Vec<String> = match fields.get("upstream_hosts") {
            Some(Value::List(items)) => items
                .iter()
                .filter_map(|item| match item {
                    Value::Str(host) if !host.contains('*') => Some(host.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        if hosts.is_empty() {
            continue;
        }
        let strings = |key: &str| -> Vec<String> {
            match fields.get(key) {
                Some(Value::List(items)) => items
                    .iter()
                    .filter_map(|item| match item {
                        Value::Str(text) => Some(text.clone()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            }
        };
        // Every header the firewall swaps gets the value (Hermes' default: Authorization),
        // but for an `Authorization` listed after the provider's own header: Hermes swaps a
        // token only where the client sent it, while E2B's rule sets the header on every
        // request, and an API that reads a Bearer value as an OAuth or Entra token would
        // refuse a request carrying its key both ways.
        let mut headers = strings("match_headers");
        if headers.is_empty() {
            headers.push(agent_sandbox::DEFAULT_CREDENTIAL_HEADER.to_owned());
        }
        let first = headers[0].clone();
        headers.retain(|header| *header == first || !header.eq_ignore_ascii_case("authorization"));
        let format_for = |header: &str| {
            if header.eq_ignore_ascii_case("authorization") {
                agent_sandbox::DEFAULT_CREDENTIAL_FORMAT.to_owned()
            } else {
                agent_sandbox::VALUE_PLACEHOLDER.to_owned()
            }
        };
        let refused = |error: agent_sandbox::Error| invalid("proxy", error.to_string());
        let mut credential = Credential::new(
            name.clone(),
            hosts,
            Some(headers[0].clone()),
            Some(format_for(&headers[0])),
        )
        .map_err(refused)?;
        for header in &headers[1..] {
            credential = credential
                .with_header(header.clone(), format_for(header))
                .map_err(refused)?;
        }
        let credential = credential
            .with_aliases(strings("alias_env_names"))
            .map_err(refused)?;
        out.push(credential);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(value: Value) -> BTreeMap<String, Value> {
        BTreeMap::from([(KEY.to_owned(), value)])
    }

    fn map(pairs: Vec<(&str, Value)>) -> Value {
        Value::Map(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }

    fn s(text: &str) -> Value {
        Value::Str(text.to_owned())
    }

    #[test]
    fn the_issue_example_parses_with_defaults() {
        // contract: X17
        let value = map(vec![
            (
                "GITHUB_TOKEN",
                map(vec![("hosts", Value::List(vec![s("api.github.com")]))]),
            ),
            (
                "EXAMPLE_KEY",
                map(vec![
                    ("hosts", Value::List(vec![s("api.example.test")])),
                    ("header", s("x-api-key")),
                    ("format", s("{value}")),
                ]),
            ),
        ]);
        let list = credentials(&raw(value)).unwrap();
        assert_eq!(list.len(), 2);
        let github = list.iter().find(|c| c.name() == "GITHUB_TOKEN").unwrap();
        assert_eq!(github.header(), "Authorization");
        assert_eq!(github.format(), "Bearer {value}");
        let example = list.iter().find(|c| c.name() == "EXAMPLE_KEY").unwrap();
        assert_eq!(example.header(), "x-api-key");
        // The text form and the hosts-only shorthand.
        let text = credentials(&raw(s(
            r#"{"GITHUB_TOKEN": {"hosts": ["api.github.com"]}}"#,
        )))
        .unwrap();
        assert_eq!(text[0].hosts(), ["api.github.com"]);
        let short = credentials(&raw(map(vec![("GITHUB_TOKEN", s("api.github.com"))]))).unwrap();
        assert_eq!(short[0].hosts(), ["api.github.com"]);
        assert!(credentials(&BTreeMap::new()).unwrap().is_empty());
    }

    #[test]
    fn bad_entries_name_the_setting_and_the_variable() {
        for value in [
            map(vec![("GITHUB_TOKEN", map(vec![]))]),
            map(vec![(
                "GITHUB_TOKEN",
                map(vec![("hosts", Value::List(vec![s("*.github.com")]))]),
            )]),
            map(vec![(
                "GITHUB_TOKEN",
                map(vec![
                    ("hosts", Value::List(vec![s("api.github.com")])),
                    ("value", s("ghp_x")),
                ]),
            )]),
        ] {
            let text = credentials(&raw(value)).unwrap_err().to_string();
            assert!(
                text.contains("credentials") && text.contains("GITHUB_TOKEN"),
                "{text}"
            );
        }
        assert!(credentials(&raw(Value::Int(3))).is_err());
    }

    #[test]
    fn hermes_proxy_mappings_become_credentials() {
        // contract: X17
        let mappings = vec![
            map(vec![
                ("env_name", s("OPENAI_API_KEY")),
                ("upstream_hosts", Value::List(vec![s("api.openai.com")])),
                ("match_headers", Value::List(vec![s("Authorization")])),
            ]),
            map(vec![
                ("env_name", s("ANTHROPIC_API_KEY")),
                ("upstream_hosts", Value::List(vec![s("api.anthropic.com")])),
                (
                    "match_headers",
                    Value::List(vec![s("x-api-key"), s("Authorization")]),
                ),
            ]),
            map(vec![
                ("env_name", s("OPENROUTER_API_KEY")),
                ("upstream_hosts", Value::List(vec![s("*.openrouter.ai")])),
            ]),
            map(vec![
                ("env_name", s("EXAMPLE_KEY")),
                ("upstream_hosts", Value::List(vec![s("api.example.test")])),
                (
                    "match_headers",
                    Value::List(vec![s("x-api-key"), s("api-key"), s("Authorization")]),
                ),
            ]),
            map(vec![
                ("env_name", s("GEMINI_API_KEY")),
                (
                    "upstream_hosts",
                    Value::List(vec![s("generativelanguage.googleapis.com")]),
                ),
                ("match_headers", Value::List(vec![s("x-goog-api-key")])),
                ("alias_env_names", Value::List(vec![s("GOOGLE_API_KEY")])),
            ]),
        ];
        let list = from_hermes_mappings(&mappings, &[]).unwrap();
        assert_eq!(list.len(), 4, "the wildcard-only mapping is skipped");
        // Every other matched header is set.
        let example: Vec<(&str, &str)> = list[2].headers().collect();
        assert_eq!(example, [("x-api-key", "{value}"), ("api-key", "{value}")]);
        let list: Vec<_> = list
            .into_iter()
            .filter(|c| c.name() != "EXAMPLE_KEY")
            .collect();
        assert_eq!(list[0].format(), "Bearer {value}");
        // The provider's own header is set; an Authorization after it is not (E2B would set
        // both on every request).
        let anthropic: Vec<(&str, &str)> = list[1].headers().collect();
        assert_eq!(anthropic, [("x-api-key", "{value}")]);
        // An alias sees the same stand-in; its header is the mapping's.
        assert_eq!(list[2].aliases(), ["GOOGLE_API_KEY"]);
        assert_eq!(list[2].header(), "x-goog-api-key");
        let own = Credential::new(
            "OPENAI_API_KEY".to_owned(),
            vec!["api.openai.com".to_owned()],
            None,
            None,
        )
        .unwrap();
        let merged = from_hermes_mappings(&mappings, &[own]).unwrap();
        assert_eq!(
            merged.len(),
            3,
            "the plugin's own setting wins for OPENAI_API_KEY"
        );
        assert!(merged.iter().all(|c| c.name() != "OPENAI_API_KEY"));
    }
}
