//! The redaction pass: removes credentials from any text before it reaches an error or a log.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// What replaces a secret.
pub const REDACTED: &str = "[REDACTED]";

/// Known secrets shorter than this are not searched for verbatim: replacing every occurrence
/// of a two-letter "key" would mangle the message and protect nothing.
const MIN_KNOWN_SECRET_LEN: usize = 8;

/// Patterns, applied in order. Each keeps the label (group 1, 2) and replaces only the value.
static PATTERNS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    let rules: [(&str, &'static str); 5] = [
        // Credentials in a URL authority: scheme://user:pass@host.
        (
            r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@?#]+@",
            "${1}[REDACTED]@",
        ),
        // Header-, JSON- or query-style secrets: `X-API-Key: v`, `"envdAccessToken":"v"`, `&signature=v`.
        (
            r#"(?i)\b(x-api-key|x-access-token|proxy-authorization|authorization|api[_\-]?key|apikey|access[_\-]?token|envd[_\-]?access[_\-]?token|traffic[_\-]?access[_\-]?token|refresh[_\-]?token|token|signature|password|passwd|secret)(["']?\s*[:=]\s*["']?)(?:(?:bearer|basic|token)\s+)?[^\s"',;&}]+"#,
            "${1}${2}[REDACTED]",
        ),
        // Authorization schemes wherever they appear.
        (
            r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{4,}",
            "${1} [REDACTED]",
        ),
        // Anything shaped like an E2B key.
        (r"(?i)e2b_[A-Za-z0-9_\-]{6,}", "[REDACTED]"),
        // Long hex or base64url runs after `sk_`/`pk_`-style prefixes.
        (r"\b(?:sk|pk|rk)_[A-Za-z0-9]{16,}", "[REDACTED]"),
    ];
    rules
        .into_iter()
        .map(|(pattern, replacement)| {
            (
                Regex::new(pattern).expect("redaction patterns are valid"),
                replacement,
            )
        })
        .collect()
});

/// Removes credentials from `text`: API keys (`e2b_…`), bearer and basic tokens, the values of
/// `X-API-Key`, `X-Access-Token`, `Authorization` and similar headers or JSON fields, secret
/// query parameters (`signature=`, `token=`, …) and `user:pass@` in URLs.
///
/// Usable by any crate that formats text which might carry a URL or a header. It recognises
/// secrets by shape; secrets with no recognisable shape must be removed by value (the client
/// does that for its own API key and access tokens).
///
/// ```
/// let line = "GET https://bob:hunter2@api.e2b.app/x?signature=v1_abc X-API-Key: e2b_1234567890";
/// let clean = e2b_client::redact(line);
/// assert!(!clean.contains("hunter2") && !clean.contains("v1_abc") && !clean.contains("1234567890"));
/// ```
pub fn redact(text: &str) -> String {
    let mut out = Cow::Borrowed(text);
    for (regex, replacement) in PATTERNS.iter() {
        let replaced = regex.replace_all(&out, |found: &regex::Captures<'_>| {
            let whole = &found[0];
            if is_variable_name(whole) {
                return whole.to_owned();
            }
            let mut expanded = String::new();
            found.expand(replacement, &mut expanded);
            expanded
        });
        if let Cow::Owned(replaced) = replaced {
            out = Cow::Owned(replaced);
        }
    }
    out.into_owned()
}

/// The names of E2B's environment variables (`E2B_API_KEY`, `E2B_DOMAIN`, ...) are shaped like
/// a key to the `e2b_` pattern, but they are the words that tell a person what to fix. They
/// are uppercase letters and underscores only; an E2B key is `e2b_` and lowercase hex, so no
/// key reads as one.
fn is_variable_name(text: &str) -> bool {
    text.strip_prefix("E2B_").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
    })
}

/// Removes every occurrence of each known secret, then applies [`redact`].
pub fn redact_with(text: &str, known_secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for secret in known_secrets {
        if secret.len() >= MIN_KNOWN_SECRET_LEN && out.contains(secret) {
            out = out.replace(secret, REDACTED);
        }
    }
    redact(&out)
}

/// Longest server text kept in an error; the rest is cut so a hostile body cannot bloat errors.
const MAX_TEXT: usize = 1024;

/// The full cleaning applied to every text an error stores: known secrets, secret shapes,
/// control characters and length. Time wording is left alone: what a caller must not show
/// (Hermes: the word "timeout") is the caller's boundary to rewrite.
pub(crate) fn clean_text(text: &str, known_secrets: &[&str]) -> String {
    let mut cut: String = text
        .chars()
        .take(MAX_TEXT)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(MAX_TEXT).is_some() {
        cut.push('…');
    }
    redact_with(&cut, known_secrets)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn keeps_e2b_variable_names_and_removes_keys_in_any_case() {
        // contract: X4, O5 — a hint may name E2B_API_KEY; a key never survives.
        let text = "set E2B_API_KEY, E2B_DOMAIN or E2B_API_URL";
        assert_eq!(redact(text), text);
        for key in [
            "e2b_53ae1fed82754c17ad8077fbc8bcdd90",
            "E2B_53AE1FED82754C17AD8077FBC8BCDD90",
            "E2B_ABCDEF1",
        ] {
            let clean = redact(&format!("key {key} used"));
            assert_eq!(clean, "key [REDACTED] used", "{key}");
        }
    }

    #[test]
    fn removes_each_shape() {
        // contract: X4
        let cases = [
            ("key e2b_53ae1fed82754c17ad8077fbc8bcdd90 used", "53ae1fed"),
            ("Authorization: Bearer abc.def-ghi", "abc.def-ghi"),
            ("authorization=Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
            ("x-api-key: my-plain-key", "my-plain-key"),
            ("X-Access-Token=tok_1234", "tok_1234"),
            (r#"{"envdAccessToken":"abcdef123"}"#, "abcdef123"),
            ("https://alice:s3cret@host/path", "s3cret"),
            ("https://alice:s3cret@host/path", "alice"),
            ("http://h/files?path=a&signature=v1_xyz&x=1", "v1_xyz"),
            ("postgres://u:pw1234@db", "pw1234"),
            ("token=abcd1234 left", "abcd1234"),
        ];
        for (text, secret) in cases {
            let clean = redact(text);
            assert!(!clean.contains(secret), "{text:?} -> {clean:?}");
            assert!(clean.contains(REDACTED), "{text:?} -> {clean:?}");
        }
    }

    #[test]
    fn leaves_ordinary_text_alone() {
        let text = "E2B kill sandbox failed for sandbox ikk8xw53: HTTP 404: Sandbox \"ikk8\" doesn't exist";
        assert_eq!(redact(text), text);
    }

    #[test]
    fn known_secrets_are_removed_by_value() {
        let clean = redact_with("server said: key plainvalue99 rejected", &["plainvalue99"]);
        assert_eq!(clean, "server said: key [REDACTED] rejected");
        // Too short to search for without mangling the text.
        assert_eq!(redact_with("a b", &["a"]), "a b");
    }

    #[test]
    fn long_text_is_cut_and_control_characters_flattened() {
        let long = "x".repeat(5000) + "\r\nInjected: header";
        let clean = clean_text(&long, &[]);
        assert!(clean.chars().count() <= MAX_TEXT + 1);
        assert!(!clean.contains('\n'));
    }

    proptest! {
        #[test]
        fn urls_with_credentials_never_survive(
            user in "[A-Z][0-9][A-Za-z0-9]{6,20}",
            pass in "[A-Z][0-9][A-Za-z0-9._~!$-]{6,20}",
            sig in "[A-Z][0-9][A-Za-z0-9_-]{6,40}",
            host in "[a-z]{1,10}\\.[a-z]{2,5}",
        ) {
            // contract: X4
            let text = format!("request to https://{user}:{pass}@{host}/files?path=x&signature={sig} failed");
            let clean = redact(&text);
            prop_assert!(!clean.contains(&user));
            prop_assert!(!clean.contains(&pass));
            prop_assert!(!clean.contains(&sig));
        }

        #[test]
        fn key_shaped_strings_never_survive(body in "[a-f0-9]{20,40}", prefix in "[ :=\"]{0,3}") {
            // contract: X4
            let text = format!("bad key{prefix}e2b_{body} given");
            prop_assert!(!redact(&text).contains(&body));
        }
    }
}
