//! Connect protocol framing with the JSON codec: unary requests and replies, server
//! streams of envelopes, and Connect error codes.

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};

use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use tokio::sync::mpsc;

use crate::conn::ConnSocket;

/// Largest request message accepted (stdin chunks, paths): envd never needs more.
pub(crate) const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// Envelope flag of the final frame of a stream.
pub(crate) const END_STREAM: u8 = 0x02;

/// A Connect error code (the string form goes on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    Unauthenticated,
    Unimplemented,
    Unknown,
    Internal,
    Unavailable,
    DeadlineExceeded,
}

impl Code {
    fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::Unauthenticated => "unauthenticated",
            Code::Unimplemented => "unimplemented",
            Code::Unknown => "unknown",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
        }
    }

    fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal | Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

/// An RPC failure: `{"code":"not_found","message":"..."}`.
#[derive(Debug, Clone)]
pub(crate) struct ConnectError {
    pub(crate) code: Code,
    pub(crate) message: String,
}

impl ConnectError {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }

    /// The error as a unary reply.
    pub(crate) fn unary(&self) -> Response {
        let mut response = Response::new(Body::from(self.json().to_string()));
        *response.status_mut() = self.code.http_status();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }

    /// The error as a whole (HTTP 200) stream: just the end-stream frame.
    pub(crate) fn stream(&self) -> Response {
        let body = end_frame(Some(self));
        stream_headers(Response::new(Body::from(body)))
    }
}

/// A unary success reply.
pub(crate) fn unary_ok(value: &serde_json::Value) -> Response {
    let mut response = Response::new(Body::from(value.to_string()));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The reply to a request with a codec we do not speak (binary proto, gRPC).
pub(crate) fn unsupported_media_type() -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    response.headers_mut().insert(
        http::HeaderName::from_static("accept-post"),
        HeaderValue::from_static("application/json, application/connect+json"),
    );
    response
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// True for a request using the streaming content type.
pub(crate) fn is_stream_request(headers: &HeaderMap) -> bool {
    content_type(headers) == "application/connect+json"
}

async fn read_body(request: Request) -> Result<Bytes, ConnectError> {
    let limited = http_body_util::Limited::new(request.into_body(), MAX_REQUEST_BYTES);
    limited
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("reading request body: {e}")))
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConnectError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| {
        ConnectError::new(
            Code::InvalidArgument,
            format!("invalid request message: {e}"),
        )
    })
}

/// Reads a unary request: `Err(response)` is the complete answer for a bad request.
pub(crate) async fn read_unary<T: DeserializeOwned>(request: Request) -> Result<T, Response> {
    if content_type(request.headers()) != "application/json" {
        return Err(unsupported_media_type());
    }
    let bytes = read_body(request).await.map_err(|e| e.unary())?;
    decode(&bytes).map_err(|e| e.unary())
}

/// Reads the single message of a server-streaming request (one envelope; the body may
/// arrive chunked or sized).
pub(crate) async fn read_stream_request<T: DeserializeOwned>(
    request: Request,
) -> Result<T, Response> {
    if !is_stream_request(request.headers()) {
        return Err(unsupported_media_type());
    }
    let bytes = read_body(request).await.map_err(|e| e.stream())?;
    let frames = parse_frames(&bytes).map_err(|e| e.stream())?;
    let Some((_, payload)) = frames
        .into_iter()
        .find(|(flags, _)| flags & END_STREAM == 0)
    else {
        return Err(ConnectError::new(Code::InvalidArgument, "missing request message").stream());
    };
    decode(&payload).map_err(|e| e.stream())
}

/// Splits a buffer into (flags, payload) envelopes.
pub(crate) fn parse_frames(mut bytes: &[u8]) -> Result<Vec<(u8, Bytes)>, ConnectError> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 5 {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "truncated envelope header",
            ));
        }
        let flags = bytes[0];
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        if flags & 0x01 != 0 {
            return Err(ConnectError::new(
                Code::Internal,
                "compressed messages are not supported",
            ));
        }
        let rest = &bytes[5..];
        if rest.len() < len {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "truncated envelope",
            ));
        }
        frames.push((flags, Bytes::copy_from_slice(&rest[..len])));
        bytes = &rest[len..];
    }
    Ok(frames)
}

/// One data envelope holding `value`.
pub(crate) fn frame(value: &serde_json::Value) -> Bytes {
    envelope(0, value.to_string().as_bytes())
}

/// The end-stream envelope, with an error when the stream failed.
pub(crate) fn end_frame(error: Option<&ConnectError>) -> Bytes {
    let payload = match error {
        Some(error) => serde_json::json!({"error": error.json()}),
        None => serde_json::json!({}),
    };
    envelope(END_STREAM, payload.to_string().as_bytes())
}

fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

pub(crate) fn stream_headers(mut response: Response) -> Response {
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    response
}

/// What a stream's producer hands its response.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// The next envelope.
    Frame(Bytes),
    /// Break the response off where it is: no end-stream frame, and the connection closes
    /// (HTTP/1.1 without its last chunk). A sandbox that dies takes envd's open streams with
    /// it this way on E2B, and clients tell that apart from a clean end.
    Cut,
}

/// How a stream's response is broken off ([`Outgoing::Cut`]): the body fails, so HTTP/2
/// resets the stream; on HTTP/1.1 the connection is also reset rather than closed, as a
/// connection to a dead sandbox is on E2B.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BreakOff(Option<ConnSocket>);

impl BreakOff {
    /// For the answer to `request`.
    pub(crate) fn of(request: &Request) -> BreakOff {
        let socket = (request.version() < http::Version::HTTP_2)
            .then(|| request.extensions().get::<ConnectInfo<ConnSocket>>())
            .flatten()
            .map(|info| info.0);
        BreakOff(socket)
    }
}

/// A streaming response whose frames come from `frames` (a bounded channel, so a slow
/// reader slows the producer down).
pub(crate) fn stream_response(frames: mpsc::Receiver<Outgoing>, break_off: BreakOff) -> Response {
    let stream = futures::stream::unfold(Some(frames), move |rx| async move {
        let mut rx = rx?;
        match rx.recv().await? {
            Outgoing::Frame(bytes) => Some((Ok(bytes), Some(rx))),
            Outgoing::Cut => {
                // Polled by the connection itself, which is therefore still open.
                if let Some(socket) = break_off.0 {
                    socket.reset_on_close();
                }
                Some((Err(std::io::Error::other("the sandbox is gone")), None))
            }
        }
    });
    stream_headers(Response::new(Body::from_stream(stream)))
}

/// Accepts a uint32 as a JSON number or string (proto3 JSON allows both on input).
pub(crate) fn de_opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Flex {
        Num(u32),
        Text(String),
    }
    match Option::<Flex>::deserialize(d)? {
        None => Ok(None),
        Some(Flex::Num(n)) => Ok(Some(n)),
        Some(Flex::Text(s)) => s.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&frame(&serde_json::json!({"a": 1})));
        buf.extend_from_slice(&end_frame(Some(&ConnectError::new(Code::NotFound, "x"))));
        let frames = parse_frames(&buf).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].0, 0);
        assert_eq!(&frames[0].1[..], br#"{"a":1}"#);
        assert_eq!(frames[1].0, END_STREAM);
        let end: serde_json::Value = serde_json::from_slice(&frames[1].1).unwrap();
        assert_eq!(end["error"]["code"], "not_found");
    }

    #[test]
    fn truncated_frames_are_refused() {
        assert!(parse_frames(&[0, 0, 0, 0, 9, b'{']).is_err());
        assert!(parse_frames(&[0, 0]).is_err());
        assert!(parse_frames(&[1, 0, 0, 0, 0]).is_err());
    }
}
