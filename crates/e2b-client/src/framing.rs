//! Connect streaming envelopes: `[flags: u8][length: u32 BE][payload]`, decoded incrementally.

use std::pin::Pin;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use serde::Deserialize;

use crate::error::{Error, TransportStage};
use crate::http::Ctx;

/// Flag bit: the payload is compressed (we never negotiate compression, so this is an error).
const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit: this is the end-of-stream frame carrying `{}` or `{"error": …}`.
pub(crate) const FLAG_END_STREAM: u8 = 0x02;
/// Bytes in an envelope header.
const HEADER_LEN: usize = 5;

/// Wraps one message into an envelope (used for a server-stream request body).
pub(crate) fn encode_envelope(payload: &[u8]) -> Bytes {
    let len = u32::try_from(payload.len()).expect("request messages are far below 4 GiB");
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out.freeze()
}

/// One decoded envelope.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    /// The flag byte.
    pub(crate) flags: u8,
    /// The message bytes.
    pub(crate) payload: Bytes,
}

impl Frame {
    /// Whether this is the end-of-stream frame.
    pub(crate) fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// Why the byte stream is not a valid envelope sequence.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// A length prefix above the cap; nothing of the payload was buffered.
    TooLarge {
        /// The declared length.
        declared: u32,
        /// The cap.
        limit: usize,
    },
    /// A compressed frame although compression was never negotiated.
    Compressed,
    /// Unknown flag bits.
    UnknownFlags(u8),
    /// The body ended inside a frame.
    Truncated {
        /// Bytes of the unfinished frame that did arrive.
        buffered: usize,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge { declared, limit } => {
                write!(
                    f,
                    "frame of {declared} bytes exceeds the {limit}-byte frame cap"
                )
            }
            FrameError::Compressed => {
                f.write_str("compressed frame without negotiated compression")
            }
            FrameError::UnknownFlags(flags) => write!(f, "unknown frame flags {flags:#04x}"),
            FrameError::Truncated { buffered } => {
                write!(f, "stream ended inside a frame ({buffered} bytes buffered)")
            }
        }
    }
}

/// Splits a byte stream into envelopes as bytes arrive. It holds at most one unfinished frame
/// plus the chunk being split, and refuses a length prefix above its cap before buffering any of
/// that payload, so a hostile prefix cannot make it allocate gigabytes.
#[derive(Debug)]
pub(crate) struct EnvelopeDecoder {
    buf: BytesMut,
    limit: usize,
}

impl EnvelopeDecoder {
    /// A decoder that refuses frames longer than `limit` bytes.
    pub(crate) fn new(limit: usize) -> EnvelopeDecoder {
        EnvelopeDecoder {
            buf: BytesMut::new(),
            limit,
        }
    }

    /// Adds bytes from the body.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes held right now (for memory accounting in tests).
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let flags = self.buf[0];
        let declared = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        if flags & FLAG_COMPRESSED != 0 {
            return Err(FrameError::Compressed);
        }
        if flags & !FLAG_END_STREAM != 0 {
            return Err(FrameError::UnknownFlags(flags));
        }
        let len = usize::try_from(declared).unwrap_or(usize::MAX);
        if len > self.limit {
            return Err(FrameError::TooLarge {
                declared,
                limit: self.limit,
            });
        }
        if self.buf.len() < HEADER_LEN + len {
            // Reserve once for the whole frame so a frame split over many chunks is not copied
            // repeatedly while it grows.
            self.buf.reserve(HEADER_LEN + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame { flags, payload }))
    }

    /// Call at end of body: an unfinished frame is an error.
    pub(crate) fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated {
                buffered: self.buf.len(),
            })
        }
    }
}

/// Asks whether the sandbox is gone (envd's `/health` answered by the proxy's 502 "not
/// found"), for a stream that broke off: `true` only when that is certain.
pub(crate) type GoneProbe = Box<dyn FnOnce() -> BoxFuture<'static, bool> + Send>;

/// What reading a server stream gave next.
#[derive(Debug)]
pub(crate) enum Read {
    /// The payload of a message envelope.
    Message(Bytes),
    /// The end-of-stream message, without an error.
    End,
    /// The body ended cleanly without an end-of-stream message.
    BodyEnd,
}

/// The one reader of a Connect server stream's response body (process and terminal streams,
/// directory watches, a client stream's answer): envelopes decoded as they arrive (at most one
/// frame plus one network chunk held, see [`EnvelopeDecoder`]), the end-of-stream message
/// parsed (its error becomes the error), silence bounded by `idle`, and a body that breaks off
/// told apart from a clean end: when it breaks and the probe finds the sandbox gone, the error
/// says the sandbox was killed or reached its end of life.
pub(crate) struct ServerStream {
    body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    decoder: EnvelopeDecoder,
    ctx: Ctx,
    idle: Duration,
    probe: Option<GoneProbe>,
}

impl ServerStream {
    /// Reads `body`, refusing frames over `max_frame` bytes and silences over `idle`.
    pub(crate) fn new(
        ctx: Ctx,
        body: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
        max_frame: usize,
        idle: Duration,
        probe: Option<GoneProbe>,
    ) -> ServerStream {
        ServerStream {
            body: Box::pin(body),
            decoder: EnvelopeDecoder::new(max_frame),
            ctx,
            idle,
            probe,
        }
    }

    /// The context errors are made with.
    pub(crate) fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// The next message, the end, or why the stream failed.
    pub(crate) async fn next(&mut self) -> Result<Read, Error> {
        loop {
            match self.decoder.next_frame() {
                Err(error) => return Err(self.ctx.protocol(error)),
                Ok(Some(frame)) if frame.is_end_stream() => {
                    return end_of_stream(&self.ctx, &frame.payload).map(|()| Read::End);
                }
                Ok(Some(frame)) => return Ok(Read::Message(frame.payload)),
                Ok(None) => {}
            }
            match tokio::time::timeout(self.idle, self.body.next()).await {
                Err(_) => return Err(self.ctx.deadline(self.idle)),
                Ok(Some(Ok(chunk))) => self.decoder.push(&chunk),
                Ok(Some(Err(error))) => {
                    let broken = self.ctx.transport(TransportStage::Body, error);
                    return Err(self.lost(broken).await);
                }
                Ok(None) => {
                    self.decoder
                        .finish()
                        .map_err(|error| self.ctx.protocol(error))?;
                    return Ok(Read::BodyEnd);
                }
            }
        }
    }

    /// The error for a stream that broke off (`broken`) or ended short of what it owed:
    /// when the sandbox turns out to be gone, that, else `broken` itself. Probes once.
    pub(crate) async fn lost(&mut self, broken: Error) -> Error {
        lost(&self.ctx, &mut self.probe, broken).await
    }

    /// After the end-of-stream message: reads the body to its own end, so the HTTP client
    /// can reuse the connection (a body dropped before its end closes it). Nothing may follow
    /// that message; whatever does (bytes, an error, silence) only costs the connection.
    pub(crate) async fn read_to_body_end(&mut self) {
        // Empty chunks are skipped a bounded number of times.
        for _ in 0..4 {
            match tokio::time::timeout(self.idle, self.body.next()).await {
                Ok(Some(Ok(chunk))) if chunk.is_empty() => {}
                _ => return,
            }
        }
    }
}

/// Reads an end-of-stream message: `Ok` for a clean end, else the error it carries.
pub(crate) fn end_of_stream(ctx: &Ctx, payload: &[u8]) -> Result<(), Error> {
    let end: EndStream = serde_json::from_slice(payload)
        .map_err(|error| ctx.protocol(format!("invalid end-of-stream message: {error}")))?;
    match end.error {
        Some(error) => Err(ctx.stream_error(error.code, error.message)),
        None => Ok(()),
    }
}

/// The error for a stream that broke off or ended short (`broken`): when `probe` (taken,
/// so it runs once per stream) finds the sandbox gone, that, else `broken` itself.
pub(crate) async fn lost(ctx: &Ctx, probe: &mut Option<GoneProbe>, broken: Error) -> Error {
    let Some(probe) = probe.take() else {
        return broken;
    };
    if probe().await {
        ctx.sandbox_ended(&broken)
    } else {
        broken
    }
}

/// Checks the decoder on arbitrary bytes, for the fuzz target and its corpus replay: the
/// stream is split into chunks whose sizes come from the input itself, and the frames (or
/// the error) must be exactly those of the same bytes pushed in one piece; no payload passes
/// the cap, and every byte pushed is either in a frame, still buffered, or behind the error.
/// Panics on a violation.
pub(crate) fn check_envelope_stream(data: &[u8]) {
    let Some((&shape, rest)) = data.split_first() else {
        return;
    };
    // A small cap so that the too-large path is reached; chunk sizes 1..=16.
    let limit = usize::from(shape & 0x3f);
    let step = usize::from(shape >> 6) * 5 + 1;
    let whole = decode_all(limit, &[rest]);
    let chunks: Vec<&[u8]> = rest.chunks(step).collect();
    let split = decode_all(limit, &chunks);
    assert_eq!(whole, split, "chunking changed the decoded frames");
    let (frames, outcome) = whole;
    let framed: usize = frames.iter().map(|f| HEADER_LEN + f.payload.len()).sum();
    assert!(framed <= rest.len(), "frames hold more bytes than arrived");
    for frame in &frames {
        assert!(frame.payload.len() <= limit, "a payload passed the cap");
        assert_eq!(frame.flags & !FLAG_END_STREAM, 0, "unknown flags accepted");
        if frame.is_end_stream() {
            // Whatever the payload is, decoding the end message must not panic.
            let _ = serde_json::from_slice::<EndStream>(&frame.payload);
        }
    }
    if let Ok(()) = outcome {
        assert_eq!(framed, rest.len(), "finish accepted unframed bytes");
    }
}

/// Decodes `chunks` in order: the frames and the first error (or `finish`'s verdict).
fn decode_all(limit: usize, chunks: &[&[u8]]) -> (Vec<Frame>, Result<(), FrameError>) {
    let mut decoder = EnvelopeDecoder::new(limit);
    let mut frames = Vec::new();
    for chunk in chunks {
        decoder.push(chunk);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(error) => return (frames, Err(error)),
            }
        }
    }
    let outcome = decoder.finish();
    (frames, outcome)
}

/// The end-of-stream message: `{}`, `{"metadata": …}` or `{"error": {"code", "message"}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct EndStream {
    /// The error, if the stream failed.
    #[serde(default)]
    pub(crate) error: Option<EndStreamError>,
}

/// A Connect error inside the end-of-stream frame.
#[derive(Debug, Deserialize)]
pub(crate) struct EndStreamError {
    /// The Connect code (`deadline_exceeded`, `not_found`, …).
    #[serde(default)]
    pub(crate) code: Option<String>,
    /// The message.
    #[serde(default)]
    pub(crate) message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![flags];
        out.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn encode_then_decode_round_trips() {
        let encoded = encode_envelope(br#"{"process":{}}"#);
        assert_eq!(&encoded[..5], &[0, 0, 0, 0, 14]);
        let mut decoder = EnvelopeDecoder::new(1024);
        decoder.push(&encoded);
        let got = decoder.next_frame().expect("valid").expect("complete");
        assert_eq!(got.flags, 0);
        assert_eq!(&got.payload[..], br#"{"process":{}}"#);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.finish(), Ok(()));
    }

    #[test]
    fn frames_split_at_every_byte_boundary() {
        let mut wire = frame(0, b"first message");
        wire.extend(frame(0, b""));
        wire.extend(frame(FLAG_END_STREAM, b"{}"));
        for split in 0..=wire.len() {
            let mut decoder = EnvelopeDecoder::new(1024);
            let mut frames = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                decoder.push(part);
                while let Some(frame) = decoder.next_frame().expect("valid") {
                    frames.push(frame);
                }
            }
            assert_eq!(frames.len(), 3, "split at {split}");
            assert_eq!(&frames[0].payload[..], b"first message");
            assert!(frames[1].payload.is_empty());
            assert!(frames[2].is_end_stream());
            assert_eq!(decoder.finish(), Ok(()));
        }
    }

    #[test]
    fn one_byte_at_a_time() {
        let wire = frame(0, b"abc");
        let mut decoder = EnvelopeDecoder::new(16);
        for (i, byte) in wire.iter().enumerate() {
            decoder.push(&[*byte]);
            let got = decoder.next_frame().expect("valid");
            assert_eq!(got.is_some(), i == wire.len() - 1);
        }
    }

    #[test]
    fn many_frames_in_one_chunk() {
        let mut wire = Vec::new();
        for i in 0..50u8 {
            wire.extend(frame(0, &[i; 3]));
        }
        let mut decoder = EnvelopeDecoder::new(16);
        decoder.push(&wire);
        for i in 0..50u8 {
            let got = decoder.next_frame().expect("valid").expect("complete");
            assert_eq!(&got.payload[..], &[i; 3]);
        }
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn oversized_length_is_refused_before_buffering() {
        let mut decoder = EnvelopeDecoder::new(1 << 20);
        // Claims 4 GiB - 1 and sends only the header.
        decoder.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::TooLarge {
                declared: u32::MAX,
                limit: 1 << 20
            })
        );
        assert!(decoder.buffered() <= 5);
        // The cap itself is allowed.
        let mut decoder = EnvelopeDecoder::new(4);
        decoder.push(&frame(0, b"abcd"));
        assert!(decoder.next_frame().expect("at the cap").is_some());
        decoder.push(&frame(0, b"abcde"));
        assert!(matches!(
            decoder.next_frame(),
            Err(FrameError::TooLarge { declared: 5, .. })
        ));
    }

    #[test]
    fn lengths_near_4_gib_are_refused_under_the_default_cap() {
        // contract: O1
        // The cap a real client runs with, not a small test cap: a hostile length prefix must
        // fail at the header, before anything is reserved for the payload.
        let limit = crate::Limits::standard().max_frame_bytes;
        for declared in [0xFFFF_FFF0_u32, u32::MAX] {
            let mut decoder = EnvelopeDecoder::new(limit);
            let mut header = vec![0];
            header.extend_from_slice(&declared.to_be_bytes());
            decoder.push(&header);
            let error = decoder.next_frame().expect_err("refused at the header");
            assert_eq!(error, FrameError::TooLarge { declared, limit });
            assert_eq!(
                error.to_string(),
                format!("frame of {declared} bytes exceeds the 4194304-byte frame cap")
            );
            assert_eq!(decoder.buffered(), 5);
            assert!(
                decoder.buf.capacity() < 64 << 10,
                "{} bytes reserved for a refused frame",
                decoder.buf.capacity()
            );
        }
    }

    #[test]
    fn a_frame_split_over_chunks_reserves_its_size_once() {
        // contract: O1 — room for exactly the frame, reserved when its header is seen: enough
        // that the rest of it is never copied again while it grows, and no more than the frame.
        let payload = vec![7_u8; 1 << 20];
        let whole = frame(0, &payload);
        for first in [HEADER_LEN + 1000, HEADER_LEN + (512 << 10)] {
            let mut decoder = EnvelopeDecoder::new(4 << 20);
            decoder.push(&whole[..first]);
            assert_eq!(decoder.next_frame(), Ok(None));
            let capacity = decoder.buf.capacity();
            assert!(capacity >= whole.len(), "{capacity} < {}", whole.len());
            assert!(capacity < whole.len() + (64 << 10), "{capacity} reserved");
            let before = decoder.buf.as_ptr();
            decoder.push(&whole[first..]);
            assert_eq!(
                decoder.buf.as_ptr(),
                before,
                "the buffer moved as the frame grew"
            );
            let got = decoder.next_frame().expect("frame").expect("complete");
            assert_eq!(got.payload.len(), payload.len());
        }
    }

    #[test]
    fn bad_flags_are_refused() {
        let mut decoder = EnvelopeDecoder::new(16);
        decoder.push(&frame(1, b"x"));
        assert_eq!(decoder.next_frame(), Err(FrameError::Compressed));
        let mut decoder = EnvelopeDecoder::new(16);
        decoder.push(&frame(0x80, b"x"));
        assert_eq!(decoder.next_frame(), Err(FrameError::UnknownFlags(0x80)));
    }

    #[test]
    fn truncated_body_is_reported() {
        let wire = frame(0, b"abcdef");
        let mut decoder = EnvelopeDecoder::new(16);
        decoder.push(&wire[..7]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.finish(), Err(FrameError::Truncated { buffered: 7 }));
    }

    #[test]
    fn saved_fuzz_corpus_replays_cleanly() {
        // Every input the fuzzer kept (fuzz/corpus/envelope_decoder) stays a regression test.
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/envelope_decoder");
        let mut replayed = 0;
        for entry in std::fs::read_dir(&dir).expect("the corpus is committed") {
            let input = std::fs::read(entry.expect("corpus entry").path()).expect("readable");
            check_envelope_stream(&input);
            replayed += 1;
        }
        assert!(replayed > 0, "empty corpus at {}", dir.display());
    }

    #[test]
    fn end_stream_error_payload_decodes() {
        let end: EndStream = serde_json::from_slice(
            br#"{"error":{"code":"deadline_exceeded","message":"context deadline exceeded"},"metadata":{"k":["v"]}}"#,
        )
        .expect("valid end frame");
        let error = end.error.expect("an error");
        assert_eq!(error.code.as_deref(), Some("deadline_exceeded"));
        assert_eq!(error.message.as_deref(), Some("context deadline exceeded"));
        let ok: EndStream = serde_json::from_slice(b"{}").expect("empty end frame");
        assert!(ok.error.is_none());
    }
}
