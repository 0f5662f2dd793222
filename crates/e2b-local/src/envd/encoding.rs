//! `/files` content codings as envd negotiates them: `Content-Encoding` on uploads and
//! `Accept-Encoding` on downloads, gzip being the one coding besides identity.

use http::HeaderMap;

/// A content coding `/files` speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Coding {
    Identity,
    Gzip,
}

/// envd's list, as its error texts print it (Go's `%v` of a string slice).
const SUPPORTED: &str = "[gzip]";

/// One `coding;q=x` entry, the coding lowercased (RFC 9110: codings are case-insensitive).
fn with_quality(value: &str) -> (String, f64) {
    let mut parts = value.split(';');
    let coding = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let mut quality = 1.0;
    for param in parts {
        let param = param.trim();
        if param.len() >= 2
            && param[..2].eq_ignore_ascii_case("q=")
            && let Ok(q) = param[2..].parse::<f64>()
        {
            quality = q;
        }
    }
    (coding, quality)
}

fn header(headers: &HeaderMap, name: http::header::HeaderName) -> &str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The coding of an upload's body; `Err` carries envd's text for an unsupported one.
pub(crate) fn content_encoding(headers: &HeaderMap) -> Result<Coding, String> {
    let raw = header(headers, http::header::CONTENT_ENCODING);
    if raw.is_empty() {
        return Ok(Coding::Identity);
    }
    match with_quality(raw).0.as_str() {
        "identity" => Ok(Coding::Identity),
        "gzip" => Ok(Coding::Gzip),
        _ => Err(format!(
            "unsupported Content-Encoding: {raw}, supported: {SUPPORTED}"
        )),
    }
}

/// The entries of `Accept-Encoding` and whether identity is refused (`identity;q=0`, or
/// `*;q=0` without an `identity` of positive quality).
fn accepted(headers: &HeaderMap) -> (Vec<(String, f64)>, bool) {
    let raw = header(headers, http::header::ACCEPT_ENCODING);
    if raw.is_empty() {
        return (Vec::new(), false);
    }
    let entries: Vec<(String, f64)> = raw.split(',').map(with_quality).collect();
    let mut identity_refused = false;
    let mut identity_accepted = false;
    let mut wildcard_refused = false;
    for (coding, q) in &entries {
        match coding.as_str() {
            "identity" if *q == 0.0 => identity_refused = true,
            "identity" => identity_accepted = true,
            "*" if *q == 0.0 => wildcard_refused = true,
            _ => {}
        }
    }
    (
        entries,
        identity_refused || (wildcard_refused && !identity_accepted),
    )
}

/// True unless `Accept-Encoding` refuses identity.
pub(crate) fn identity_acceptable(headers: &HeaderMap) -> bool {
    !accepted(headers).1
}

/// The coding a download is sent with: the acceptable one of highest quality (the first
/// among equals), identity when nothing supported is named; `Err` when identity is refused
/// and nothing else fits (envd answers 406).
pub(crate) fn accept_encoding(headers: &HeaderMap) -> Result<Coding, String> {
    let (mut entries, identity_refused) = accepted(headers);
    // A stable sort keeps the header's order among equal qualities, as Go's SortFunc
    // does for the short lists clients send.
    entries.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (coding, q) in &entries {
        if *q == 0.0 {
            continue;
        }
        match coding.as_str() {
            "identity" => return Ok(Coding::Identity),
            "*" if identity_refused => return Ok(Coding::Gzip),
            "*" => return Ok(Coding::Identity),
            "gzip" => return Ok(Coding::Gzip),
            _ => {}
        }
    }
    if identity_refused {
        Err(format!(
            "no acceptable encoding found, supported: {SUPPORTED}"
        ))
    } else {
        Ok(Coding::Identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: http::header::HeaderName, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, value.parse().unwrap());
        headers
    }

    #[test]
    fn accept_encoding_picks_as_envd_does() {
        let accept = |v: &str| accept_encoding(&with(http::header::ACCEPT_ENCODING, v));
        assert_eq!(accept_encoding(&HeaderMap::new()), Ok(Coding::Identity));
        assert_eq!(accept("gzip"), Ok(Coding::Gzip));
        assert_eq!(accept("GZIP"), Ok(Coding::Gzip));
        // httpx's default: gzip comes first.
        assert_eq!(accept("gzip, deflate"), Ok(Coding::Gzip));
        assert_eq!(accept("br"), Ok(Coding::Identity));
        assert_eq!(accept("identity;q=1, gzip;q=0.5"), Ok(Coding::Identity));
        assert_eq!(accept("gzip;q=0"), Ok(Coding::Identity));
        assert_eq!(accept("*"), Ok(Coding::Identity));
        assert_eq!(accept("*;q=0, gzip"), Ok(Coding::Gzip));
        assert_eq!(accept("identity;q=0, *"), Ok(Coding::Gzip));
        assert!(accept("identity;q=0, br").is_err());
        assert!(accept("*;q=0").is_err());
        assert!(!identity_acceptable(&with(
            http::header::ACCEPT_ENCODING,
            "identity;q=0"
        )));
        assert!(identity_acceptable(&with(
            http::header::ACCEPT_ENCODING,
            "*;q=0, identity"
        )));
    }

    #[test]
    fn content_encoding_accepts_gzip_and_identity_only() {
        let content = |v: &str| content_encoding(&with(http::header::CONTENT_ENCODING, v));
        assert_eq!(content_encoding(&HeaderMap::new()), Ok(Coding::Identity));
        assert_eq!(content("gzip"), Ok(Coding::Gzip));
        assert_eq!(content("Identity"), Ok(Coding::Identity));
        assert_eq!(
            content("br"),
            Err("unsupported Content-Encoding: br, supported: [gzip]".to_owned())
        );
    }
}
