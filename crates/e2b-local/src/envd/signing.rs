//! Access to `/files` of a secure sandbox: the `X-Access-Token` header, or a URL signed
//! with the token as the SDK signs `download_url` / `upload_url` (envd's `validateSigning`,
//! with its texts).

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};

use super::ctx::Ctx;
use crate::app::App;
use crate::reply::ApiError;

/// The query parameters `/files` understands.
#[derive(Debug, Default)]
pub(super) struct FilesQuery {
    pub(super) path: Option<String>,
    pub(super) username: Option<String>,
    pub(super) signature: Option<String>,
    pub(super) signature_expiration: Option<String>,
}

pub(super) fn parse_query(query: Option<&str>) -> FilesQuery {
    let mut out = FilesQuery::default();
    for (key, value) in crate::parse::query_pairs(query.unwrap_or_default()) {
        match key.as_str() {
            "path" => out.path = Some(value),
            "username" => out.username = Some(value),
            "signature" => out.signature = Some(value),
            "signature_expiration" => out.signature_expiration = Some(value),
            _ => {}
        }
    }
    out
}

/// What a signature grants: reading (`GET`) or writing (`POST`) one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    Read,
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }

    fn of(request: &Request) -> Operation {
        if request.method() == http::Method::GET {
            Operation::Read
        } else {
            Operation::Write
        }
    }
}

/// `v1_` + unpadded base64 of sha256(`path:operation:user:token[:expiration]`), the
/// SDK's `get_signature` (the user is empty for the default user).
pub(crate) fn signature(
    path: &str,
    operation: Operation,
    user: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    let mut raw = format!("{path}:{}:{user}:{token}", operation.as_str());
    if let Some(exp) = expiration {
        raw.push(':');
        raw.push_str(exp);
    }
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn same_secret(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// True when the query's signature is `token`'s for this path, user and operation
/// (whatever its expiry).
fn signed_by(token: &str, query: &FilesQuery, operation: Operation) -> bool {
    let Some(given) = &query.signature else {
        return false;
    };
    let expected = signature(
        query.path.as_deref().unwrap_or_default(),
        operation,
        query.username.as_deref().unwrap_or_default(),
        token,
        query.signature_expiration.as_deref(),
    );
    same_secret(given, &expected)
}

/// envd's check: a header, if sent, must be the token; else the signature must be the
/// token's and not expired (an expiration equal to now still passes). `Err` is envd's text.
fn check(
    app: &App,
    token: &str,
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: Operation,
) -> Result<(), &'static str> {
    if let Some(given) = headers.get("x-access-token") {
        let given = given.to_str().unwrap_or_default();
        if given.is_empty() {
            // envd reads an empty header as absent.
        } else if same_secret(given, token) {
            return Ok(());
        } else {
            return Err("access token present in header but does not match");
        }
    }
    if query.signature.is_none() {
        return Err("missing signature query parameter");
    }
    if !signed_by(token, query, operation) {
        return Err("invalid signature");
    }
    match query.signature_expiration.as_deref().map(str::parse::<i64>) {
        None => Ok(()),
        Some(Ok(expires)) => {
            let now = i64::try_from(crate::clock::nanos(app.clock.now()) / 1_000_000_000)
                .unwrap_or(i64::MAX);
            if expires < now {
                Err("signature is already expired")
            } else {
                Ok(())
            }
        }
        Some(Err(_)) => Err("invalid signature"),
    }
}

/// `Err` (401) unless the request may use `/files` of this sandbox.
pub(super) fn authorize(ctx: &Ctx, request: &Request, query: &FilesQuery) -> Result<(), ApiError> {
    let Some(token) = &ctx.sandbox.token else {
        return Ok(());
    };
    check(
        &ctx.app,
        token.expose(),
        request.headers(),
        query,
        Operation::of(request),
    )
    .map_err(|text| ApiError::new(StatusCode::UNAUTHORIZED, text))
}

/// For a signed URL without the sandbox header (a URL handed to someone else): the
/// running sandbox whose token signed it, expired or not (the handler then says which).
pub(crate) fn find_signed_sandbox(app: &App, request: &Request) -> Option<String> {
    let query = parse_query(request.uri().query());
    query.signature.as_ref()?;
    let operation = Operation::of(request);
    app.store.running_ids().into_iter().find(|id| {
        app.store
            .running(id)
            .and_then(|s| s.token)
            .is_some_and(|token| signed_by(token.expose(), &query, operation))
    })
}

/// The answer to a signed `/files` URL that no running sandbox's token signed.
pub(crate) fn no_signer() -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, "invalid signature").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_sdk_formula() {
        // sha256("/a:read::tok") in unpadded standard base64, prefixed "v1_".
        let sig = signature("/a", Operation::Read, "", "tok", None);
        let expected = format!(
            "v1_{}",
            STANDARD_NO_PAD.encode(Sha256::digest(b"/a:read::tok"))
        );
        assert_eq!(sig, expected);
        // The value Python's hashlib and base64 give for the SDK's formula.
        assert_eq!(sig, "v1_2/gNbgFPxFSqkheS/SD0NHlzA121E/nxkOtc/ovxeoI");
        assert_ne!(sig, signature("/a", Operation::Write, "", "tok", None));
        assert_ne!(sig, signature("/a", Operation::Read, "", "tok", Some("10")));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("ab", "abc"));
        assert!(!same_secret("", "abc"));
    }
}
