//! The HTTP/1.1 of the blocking path, without I/O: a request's bytes, a response head, and a
//! body's framing (chunked, a length, or up to the connection's close) taken off as bytes
//! arrive. Only what envd's Connect streams use; anything else is refused by name.

use bytes::{Buf, BytesMut};

/// Bytes a response head may take.
pub(super) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Bytes a chunk-size line (or a trailer line) may take.
const MAX_LINE_BYTES: usize = 4096;
/// Headers a response head may have.
const MAX_HEADERS: usize = 64;

/// A request: `method path`, then `headers` (names and values already checked: they come
/// from `http::HeaderValue`s or constants), then `body` with its length.
pub(super) fn request(
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() || method == "POST" {
        out.extend_from_slice(b"Content-Length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// A parsed response head.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) status: u16,
    pub(super) content_type: String,
    pub(super) framing: Framing,
    /// Whether the server keeps the connection open after this response.
    pub(super) keep_alive: bool,
}

/// Parses a response head from the front of `buf` and takes it off; `Ok(None)` if more bytes
/// are needed. Interim (1xx) heads are skipped.
pub(super) fn head(buf: &mut BytesMut) -> Result<Option<Head>, String> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        let length = match response.parse(buf) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
                return Err(format!("the response head is over {MAX_HEAD_BYTES} bytes"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(error) => return Err(format!("invalid response head: {error}")),
        };
        let status = response.code.unwrap_or(0);
        if (100..200).contains(&status) {
            if status == 101 {
                return Err("the server switched protocols".to_owned());
            }
            buf.advance(length);
            continue;
        }
        let mut content_type = String::new();
        let mut chunked = false;
        let mut length_header: Option<u64> = None;
        let mut keep_alive = response.version == Some(1);
        for header in response.headers.iter() {
            let value = std::str::from_utf8(header.value)
                .map_err(|_| format!("the {} header is not text", header.name))?
                .trim();
            if header.name.eq_ignore_ascii_case("content-type") {
                value.clone_into(&mut content_type);
            } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                // Only `chunked`, last, is a framing this client reads.
                let last = value.rsplit(',').next().unwrap_or("").trim();
                if !last.eq_ignore_ascii_case("chunked") {
                    return Err(format!("unsupported transfer encoding '{value}'"));
                }
                chunked = true;
            } else if header.name.eq_ignore_ascii_case("content-length") {
                let parsed = value
                    .parse::<u64>()
                    .map_err(|_| format!("invalid content length '{value}'"))?;
                if length_header.is_some_and(|known| known != parsed) {
                    return Err("conflicting content lengths".to_owned());
                }
                length_header = Some(parsed);
            } else if header.name.eq_ignore_ascii_case("connection") {
                for token in value.split(',') {
                    let token = token.trim();
                    if token.eq_ignore_ascii_case("close") {
                        keep_alive = false;
                    } else if token.eq_ignore_ascii_case("keep-alive") {
                        keep_alive = true;
                    }
                }
            }
        }
        let framing = if chunked {
            Framing::Chunked(Chunk::Size)
        } else if let Some(length) = length_header {
            Framing::Length(length)
        } else if status == 204 || status == 304 {
            Framing::Length(0)
        } else {
            keep_alive = false;
            Framing::UntilClose
        };
        buf.advance(length);
        return Ok(Some(Head {
            status,
            content_type,
            framing,
            keep_alive,
        }));
    }
}

/// How the body is delimited, and how far it has been read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Framing {
    /// `Transfer-Encoding: chunked`.
    Chunked(Chunk),
    /// This many bytes are still to come.
    Length(u64),
    /// The body ends when the server closes the connection.
    UntilClose,
    /// The whole body has been taken.
    Done,
}

/// Where a chunked body stands.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Chunk {
    /// A chunk-size line comes next.
    Size,
    /// This many bytes of the chunk's data are still to come.
    Data(u64),
    /// The CRLF after a chunk's data comes next.
    DataEnd,
    /// Trailer lines, up to an empty one, come next.
    Trailers,
}

impl Framing {
    /// Moves the body bytes at the front of `buf` to `out`, as far as they go; bytes past the
    /// body's end stay in `buf`.
    pub(super) fn take(
        &mut self,
        buf: &mut BytesMut,
        out: &mut impl FnMut(&[u8]),
    ) -> Result<(), String> {
        loop {
            match self {
                Framing::Done => return Ok(()),
                Framing::UntilClose => {
                    if !buf.is_empty() {
                        out(buf);
                        buf.clear();
                    }
                    return Ok(());
                }
                Framing::Length(left) => {
                    let now = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    if now > 0 {
                        out(&buf[..now]);
                        buf.advance(now);
                        *left -= now as u64;
                    }
                    if *left == 0 {
                        *self = Framing::Done;
                    }
                    return Ok(());
                }
                Framing::Chunked(state) => match state {
                    Chunk::Size => {
                        let Some(line) = line(buf)? else {
                            return Ok(());
                        };
                        let digits = line[..].split(|byte| *byte == b';').next().unwrap_or(&[]);
                        let digits = std::str::from_utf8(digits)
                            .map_err(|_| "invalid chunk size".to_owned())?
                            .trim();
                        let size = u64::from_str_radix(digits, 16)
                            .map_err(|_| format!("invalid chunk size '{digits}'"))?;
                        *state = if size == 0 {
                            Chunk::Trailers
                        } else {
                            Chunk::Data(size)
                        };
                    }
                    Chunk::Data(left) => {
                        let now = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                        if now == 0 {
                            return Ok(());
                        }
                        out(&buf[..now]);
                        buf.advance(now);
                        *left -= now as u64;
                        if *left == 0 {
                            *state = Chunk::DataEnd;
                        }
                    }
                    Chunk::DataEnd => {
                        if buf.len() < 2 {
                            return Ok(());
                        }
                        if &buf[..2] != b"\r\n" {
                            return Err("a chunk's data is not followed by CRLF".to_owned());
                        }
                        buf.advance(2);
                        *state = Chunk::Size;
                    }
                    Chunk::Trailers => {
                        let Some(line) = line(buf)? else {
                            return Ok(());
                        };
                        if line.is_empty() {
                            *self = Framing::Done;
                        }
                    }
                },
            }
        }
    }

    /// Whether the whole body has been taken.
    pub(super) fn is_done(&self) -> bool {
        *self == Framing::Done
    }
}

/// Takes one CRLF-terminated line off the front of `buf` (without its CRLF); `Ok(None)` if it
/// is not complete yet.
fn line(buf: &mut BytesMut) -> Result<Option<BytesMut>, String> {
    match buf.windows(2).position(|pair| pair == b"\r\n") {
        Some(end) => {
            let line = buf.split_to(end);
            buf.advance(2);
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE_BYTES => {
            Err(format!("a chunk line is over {MAX_LINE_BYTES} bytes"))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(framing: &mut Framing, pieces: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            framing
                .take(&mut buf, &mut |bytes| body.extend_from_slice(bytes))
                .expect("valid");
        }
        (body, buf.to_vec())
    }

    #[test]
    fn a_request_carries_its_headers_length_and_body() {
        let bytes = request(
            "POST",
            "/process.Process/Start",
            "127.0.0.1:3000",
            &[("X-A", b"1")],
            b"{}",
        );
        assert_eq!(
            bytes,
            b"POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1:3000\r\nX-A: 1\r\nContent-Length: 2\r\n\r\n{}"
        );
        let get = request("GET", "/health", "h:1", &[], b"");
        assert_eq!(get, b"GET /health HTTP/1.1\r\nHost: h:1\r\n\r\n");
    }

    #[test]
    fn a_head_split_anywhere_parses_the_same() {
        let raw: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
        for split in 0..raw.len() {
            let mut buf = BytesMut::from(&raw[..split]);
            let parsed = match head(&mut buf).expect("valid") {
                Some(parsed) => {
                    buf.extend_from_slice(&raw[split..]);
                    parsed
                }
                None => {
                    buf.extend_from_slice(&raw[split..]);
                    head(&mut buf).expect("valid").expect("complete")
                }
            };
            assert_eq!(
                parsed,
                Head {
                    status: 200,
                    content_type: "application/connect+json".to_owned(),
                    framing: Framing::Chunked(Chunk::Size),
                    keep_alive: true,
                },
                "split at {split}"
            );
            assert_eq!(&buf[..], b"5\r\nhello\r\n");
        }
    }

    #[test]
    fn heads_that_cannot_be_read_are_refused_by_name() {
        let refused = |raw: &[u8]| head(&mut BytesMut::from(raw)).expect_err("refused");
        assert!(refused(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n").contains("gzip"));
        assert!(
            refused(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
                .contains("conflicting")
        );
        assert!(refused(b"HTTP/1.1 101 Switching\r\n\r\n").contains("switched"));
        assert!(refused(b"NOT HTTP\r\n\r\n").contains("invalid response head"));
        let mut long = BytesMut::from(&b"HTTP/1.1 200 OK\r\nX: "[..]);
        long.extend_from_slice(&vec![b'a'; MAX_HEAD_BYTES + 1]);
        assert!(head(&mut long).expect_err("refused").contains("over"));
    }

    #[test]
    fn connection_close_and_a_missing_length_end_keep_alive() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"[..],
        );
        let parsed = head(&mut buf).expect("valid").expect("complete");
        assert!(!parsed.keep_alive);
        assert_eq!(parsed.framing, Framing::Length(0));
        let mut buf = BytesMut::from(&b"HTTP/1.1 502 Bad Gateway\r\n\r\nbody"[..]);
        let parsed = head(&mut buf).expect("valid").expect("complete");
        assert_eq!((parsed.status, parsed.keep_alive), (502, false));
        assert_eq!(parsed.framing, Framing::UntilClose);
    }

    #[test]
    fn a_chunked_body_split_anywhere_gives_the_same_bytes_and_leaves_what_follows() {
        let raw: &[u8] = b"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        for split in 0..raw.len() {
            let mut framing = Framing::Chunked(Chunk::Size);
            let (body, rest) = body_of(&mut framing, &[&raw[..split], &raw[split..]]);
            assert_eq!(body, b"abc0123456789abcdef", "split at {split}");
            assert!(framing.is_done(), "split at {split}");
            assert_eq!(rest, b"NEXT");
        }
    }

    #[test]
    fn a_length_body_stops_at_its_length() {
        let mut framing = Framing::Length(4);
        let (body, rest) = body_of(&mut framing, &[b"ab", b"cdEF"]);
        assert_eq!(
            (body.as_slice(), rest.as_slice()),
            (&b"abcd"[..], &b"EF"[..])
        );
        assert!(framing.is_done());
    }

    #[test]
    fn bad_chunks_are_refused() {
        let bad = |raw: &[u8]| {
            let mut buf = BytesMut::from(raw);
            Framing::Chunked(Chunk::Size)
                .take(&mut buf, &mut |_| {})
                .expect_err("refused")
        };
        assert!(bad(b"zz\r\n").contains("invalid chunk size"));
        assert!(bad(b"1\r\naXY").contains("CRLF"));
        assert!(bad(b"fffffffffffffffffffff\r\n").contains("invalid chunk size"));
        assert!(bad(&vec![b'1'; MAX_LINE_BYTES + 1]).contains("over"));
    }
}
