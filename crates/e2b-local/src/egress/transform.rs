//! E2B's `network.rules` (per-domain request transforms: headers the egress proxy sets)
//! and `network.egressProxy`, checked with E2B's limits as they arrive.
//!
//! Header values and the proxy password are secrets (API keys, mostly): they are kept in
//! [`Secret`], whose `Debug` says nothing, and no error text here ever quotes one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// At most this many domains carry rules (E2B's limit).
pub(crate) const MAX_DOMAINS: usize = 10;
/// At most this many headers one rule sets (E2B's limit).
pub(crate) const MAX_HEADERS: usize = 20;
/// The longest header name (E2B's limit).
pub(crate) const MAX_HEADER_NAME: usize = 64;
/// The longest header value (E2B's limit).
pub(crate) const MAX_HEADER_VALUE: usize = 2048;

/// A value that must never be shown: `Debug` prints `<redacted>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    /// The value itself, for the one place that sends it on.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

/// One rule of a domain: what is done to its requests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) transform: Option<Transform>,
}

/// The transform of a rule: headers set on every request (replacing the client's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Transform {
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, Secret>,
}

/// `network.egressProxy`: a SOCKS5 proxy that allowed traffic goes through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EgressProxy {
    pub(crate) address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) password: Option<Secret>,
}

/// Checks `network.rules` as sent (kept as JSON so that no parse error can quote a
/// value) and returns them typed; the error is the 400 text, naming the field.
pub(crate) fn parse_rules(
    raw: &BTreeMap<String, Value>,
) -> Result<BTreeMap<String, Vec<Rule>>, String> {
    if raw.len() > MAX_DOMAINS {
        return Err(format!(
            "network.rules has {} domains: at most {MAX_DOMAINS} are allowed",
            raw.len()
        ));
    }
    let mut rules = BTreeMap::new();
    for (domain, value) in raw {
        let field = format!("network.rules['{}']", shown(domain));
        if !plain_domain(domain) {
            return Err(format!(
                "{field}: the key must be a plain DNS name (no wildcard, IP address or port)"
            ));
        }
        let Value::Array(list) = value else {
            return Err(format!("{field} must be a list of rules"));
        };
        if list.len() > 1 {
            return Err(format!(
                "{field} has {} rules: at most one rule per domain is allowed",
                list.len()
            ));
        }
        let mut parsed = Vec::with_capacity(list.len());
        for rule in list {
            parsed.push(parse_rule(&field, rule)?);
        }
        rules.insert(domain.clone(), parsed);
    }
    Ok(rules)
}

fn parse_rule(field: &str, rule: &Value) -> Result<Rule, String> {
    let Value::Object(rule) = rule else {
        return Err(format!("{field}[0] must be an object"));
    };
    if let Some(key) = rule.keys().find(|key| *key != "transform") {
        return Err(format!(
            "{field}[0].{} is not supported by e2b-local (only transform is)",
            shown(key)
        ));
    }
    let transform = match rule.get("transform") {
        None | Some(Value::Null) => None,
        Some(Value::Object(transform)) => {
            if let Some(key) = transform.keys().find(|key| *key != "headers") {
                return Err(format!(
                    "{field}[0].transform.{} is not supported by e2b-local (only headers is)",
                    shown(key)
                ));
            }
            let headers = match transform.get("headers") {
                None | Some(Value::Null) => BTreeMap::new(),
                Some(Value::Object(headers)) => parse_headers(field, headers)?,
                Some(_) => {
                    return Err(format!(
                        "{field}[0].transform.headers must be an object of header names to values"
                    ));
                }
            };
            Some(Transform { headers })
        }
        Some(_) => return Err(format!("{field}[0].transform must be an object")),
    };
    Ok(Rule { transform })
}

fn parse_headers(
    field: &str,
    headers: &serde_json::Map<String, Value>,
) -> Result<BTreeMap<String, Secret>, String> {
    if headers.len() > MAX_HEADERS {
        return Err(format!(
            "{field}[0].transform.headers has {} headers: at most {MAX_HEADERS} are allowed",
            headers.len()
        ));
    }
    let mut parsed = BTreeMap::new();
    for (name, value) in headers {
        let at = format!("{field}[0].transform.headers['{}']", shown(name));
        if name.is_empty() || name.len() > MAX_HEADER_NAME {
            return Err(format!(
                "{at}: a header name has 1 to {MAX_HEADER_NAME} characters"
            ));
        }
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("{at}: not a valid HTTP header name"));
        }
        // The value is never quoted: it is a secret.
        let Value::String(value) = value else {
            return Err(format!("{at}: the value must be a string"));
        };
        if value.len() > MAX_HEADER_VALUE {
            return Err(format!(
                "{at}: the value is longer than {MAX_HEADER_VALUE} characters"
            ));
        }
        if http::HeaderValue::from_str(value).is_err() {
            return Err(format!(
                "{at}: the value is not a valid HTTP header value (control characters or non-ASCII)"
            ));
        }
        parsed.insert(name.clone(), Secret(value.clone()));
    }
    Ok(parsed)
}

/// Checks `network.egressProxy` (`null` is none).
pub(crate) fn parse_egress_proxy(raw: &Value) -> Result<Option<EgressProxy>, String> {
    let proxy = match raw {
        Value::Null => return Ok(None),
        Value::Object(proxy) => proxy,
        _ => return Err("network.egressProxy must be an object".to_owned()),
    };
    if let Some(key) = proxy
        .keys()
        .find(|key| !["address", "username", "password"].contains(&key.as_str()))
    {
        return Err(format!(
            "network.egressProxy.{} is not a field of egressProxy (address, username, password)",
            shown(key)
        ));
    }
    let address = match proxy.get("address") {
        Some(Value::String(address)) => address.clone(),
        _ => {
            return Err(
                "network.egressProxy.address is required: the SOCKS5 proxy as host:port".to_owned(),
            );
        }
    };
    let port_ok = address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok {
        return Err(format!(
            "network.egressProxy.address '{}' is not host:port",
            shown(&address)
        ));
    }
    let text = |key: &str| match proxy.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if text.len() <= 255 => Ok(Some(text.clone())),
        // RFC 1929: one length byte each.
        Some(_) => Err(format!(
            "network.egressProxy.{key} must be a string of at most 255 bytes"
        )),
    };
    Ok(Some(EgressProxy {
        address,
        username: text("username")?,
        password: text("password")?.map(Secret),
    }))
}

/// One label of a domain name as the rules take it: 1 to 63 letters, digits, `-` and
/// `_`, no hyphen at either end.
pub(super) fn label_ok(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A domain key of `rules`: a DNS name, not a wildcard, an address or with a port.
fn plain_domain(domain: &str) -> bool {
    let name = domain.strip_suffix('.').unwrap_or(domain);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(label_ok)
        && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// A key as quoted in an error: keys are not secrets, but are cut short and printable.
fn shown(key: &str) -> String {
    key.chars()
        .take(80)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The headers to set on requests for `host` (HTTP `Host` or TLS SNI), if a rule names it;
/// matched without case and a trailing dot, exactly (E2B's keys are plain names).
pub(crate) fn headers_for<'a>(
    rules: &'a BTreeMap<String, Vec<Rule>>,
    host: &str,
) -> Option<&'a BTreeMap<String, Secret>> {
    let host = host.trim().trim_end_matches('.');
    rules.iter().find_map(|(domain, list)| {
        domain
            .trim_end_matches('.')
            .eq_ignore_ascii_case(host)
            .then(|| list.iter().find_map(|rule| rule.transform.as_ref()))
            .flatten()
            .map(|transform| &transform.headers)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(value: Value) -> Result<BTreeMap<String, Vec<Rule>>, String> {
        let map: BTreeMap<String, Value> = serde_json::from_value(value).expect("object");
        parse_rules(&map)
    }

    #[test]
    fn rules_within_the_limits_are_kept_and_matched_by_name() {
        // contract: X12, X14 (Debug redacts the value)
        let parsed = rules(json!({"api.example.test": [{"transform": {"headers": {"Authorization": "Bearer s3cr3t"}}}]}))
            .expect("valid");
        let headers = headers_for(&parsed, "API.example.test.").expect("matched");
        assert_eq!(headers["Authorization"].expose(), "Bearer s3cr3t");
        assert!(headers_for(&parsed, "other.test").is_none());
        assert!(headers_for(&parsed, "x.api.example.test").is_none());
        assert!(!format!("{parsed:?}").contains("s3cr3t"));
        // Stored verbatim.
        assert_eq!(
            serde_json::to_value(&parsed).expect("json"),
            json!({"api.example.test": [{"transform": {"headers": {"Authorization": "Bearer s3cr3t"}}}]})
        );
    }

    #[test]
    fn rules_past_the_limits_are_refused_naming_the_field_and_never_the_value() {
        // contract: X12
        let many: serde_json::Map<String, Value> =
            (0..11).map(|i| (format!("d{i}.test"), json!([]))).collect();
        let headers: serde_json::Map<String, Value> =
            (0..21).map(|i| (format!("h{i}"), json!("v"))).collect();
        let cases = [
            (Value::Object(many), "at most 10"),
            (json!({"*.example.test": []}), "plain DNS name"),
            (json!({"10.0.0.1": []}), "plain DNS name"),
            (json!({"a.test": [{}, {}]}), "at most one rule"),
            (
                json!({"a.test": [{"transform": {"headers": headers}}]}),
                "at most 20",
            ),
            (
                json!({"a.test": [{"transform": {"headers": {"x".repeat(65): "SECRETVALUE"}}}]}),
                "1 to 64",
            ),
            (
                json!({"a.test": [{"transform": {"headers": {"a b": "SECRETVALUE"}}}]}),
                "valid HTTP header name",
            ),
            (
                json!({"a.test": [{"transform": {"headers": {"x": "SECRETVALUE\n".repeat(3)}}}]}),
                "not a valid HTTP header value",
            ),
            (
                json!({"a.test": [{"transform": {"headers": {"x": "SECRETVALUE".repeat(200)}}}]}),
                "longer than 2048",
            ),
            (
                json!({"a.test": [{"transform": {"headers": "SECRETVALUE"}}]}),
                "transform.headers must be an object",
            ),
        ];
        for (value, needle) in cases {
            let error = rules(value.clone()).expect_err("refused");
            assert!(error.contains(needle), "{value}: {error}");
            assert!(error.contains("network.rules"), "{error}");
            assert!(!error.contains("SECRETVALUE"), "{error}");
        }
    }

    #[test]
    fn egress_proxy_keeps_its_password_out_of_debug() {
        // contract: X12
        let proxy = parse_egress_proxy(
            &json!({"address": "127.0.0.1:1080", "username": "u", "password": "hunter2"}),
        )
        .expect("valid")
        .expect("some");
        assert!(!format!("{proxy:?}").contains("hunter2"));
        assert_eq!(proxy.password.as_ref().map(Secret::expose), Some("hunter2"));
        assert!(parse_egress_proxy(&json!({"address": "nope"})).is_err());
        assert!(parse_egress_proxy(&json!({"username": "u"})).is_err());
        assert_eq!(parse_egress_proxy(&Value::Null), Ok(None));
    }
}
