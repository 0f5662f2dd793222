//! Request parsing shared by the control plane, the admin routes and `/files`: Go's
//! query unescaping and lenient JSON bodies, answered with an [`ApiError`] when bad.

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::reply::ApiError;

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte; bad escapes are errors.
pub(crate) fn query_unescape(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Splits a raw query string into decoded pairs (undecodable pairs are skipped).
pub(crate) fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((query_unescape(k)?, query_unescape(v)?))
        })
        .collect()
}

/// Parses a JSON body; an empty body is `{}`.
pub(crate) fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let bytes: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}
