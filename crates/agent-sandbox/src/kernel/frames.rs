//! The kernel's wire: host messages (length-prefixed, authenticated) and the frames the
//! kernel writes among its cells' own output, found and checked as the output streams.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The longest frame header (`<length> <mac>`) read before the line is taken for output.
const MAX_HEADER: usize = 100;

/// The key both sides authenticate with (32 random bytes, sent to the kernel once, on its
/// stdin).
#[derive(Clone)]
pub(crate) struct Key([u8; 32]);

impl Key {
    pub(crate) fn new(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    pub(crate) fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// HMAC-SHA256 of `prefix` + `body`, lowercase hex.
    fn mac(&self, prefix: &[u8], body: &[u8]) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("any key length");
        mac.update(prefix);
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    fn verify(&self, prefix: &[u8], body: &[u8], claimed: &[u8]) -> bool {
        let Ok(claimed) = hex::decode(claimed) else {
            return false;
        };
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("any key length");
        mac.update(prefix);
        mac.update(body);
        mac.verify_slice(&claimed).is_ok()
    }

    /// A message for the kernel: `<length> <mac>\n<body>`.
    pub(crate) fn message(&self, body: &[u8]) -> Vec<u8> {
        let mut message = format!("{} {}\n", body.len(), self.mac(b"h", body)).into_bytes();
        message.extend_from_slice(body);
        message
    }

    #[cfg(test)]
    pub(crate) fn frame(&self, marker: &str, body: &[u8]) -> Vec<u8> {
        let mut frame =
            format!("\n{marker} {} {}\n", body.len(), self.mac(b"k", body)).into_bytes();
        frame.extend_from_slice(body);
        frame
    }
}

/// What a stretch of the kernel's output is.
#[derive(Debug, PartialEq)]
pub(crate) enum Piece {
    /// The cells' own output (anything that is not a valid next frame).
    Output(Vec<u8>),
    /// A frame that passed its check and came in sequence.
    Frame(serde_json::Value),
}

/// Splits the kernel's output into output and frames as it arrives. Memory is bounded by one
/// frame (at most `max_frame` bytes) plus a marker's length.
pub(crate) struct Decoder {
    key: Key,
    /// `\n<marker> `: what starts a frame.
    opener: Vec<u8>,
    buffer: Vec<u8>,
    next_seq: u64,
    max_frame: usize,
}

impl Decoder {
    pub(crate) fn new(key: Key, marker: &str, max_frame: usize) -> Decoder {
        Decoder {
            key,
            opener: format!("\n{marker} ").into_bytes(),
            buffer: Vec::new(),
            next_seq: 1,
            max_frame,
        }
    }

    /// Takes the next output bytes; what they complete, in order.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<Piece> {
        self.buffer.extend_from_slice(bytes);
        let mut pieces = Vec::new();
        loop {
            let Some(start) = find(&self.buffer, &self.opener) else {
                // Keep what could be the start of an opener; the rest is output.
                let keep = partial_suffix(&self.buffer, &self.opener);
                let output: Vec<u8> = self.buffer.drain(..self.buffer.len() - keep).collect();
                push_output(&mut pieces, output);
                break;
            };
            if start > 0 {
                let output: Vec<u8> = self.buffer.drain(..start).collect();
                push_output(&mut pieces, output);
            }
            match self.frame_at_start() {
                Parse::Incomplete => break,
                Parse::Frame(value, length) => {
                    self.buffer.drain(..length);
                    pieces.push(Piece::Frame(value));
                }
                Parse::NotAFrame => {
                    // Output that looks like an opener: give its first byte up as output and
                    // look again after it.
                    let output: Vec<u8> = self.buffer.drain(..1).collect();
                    push_output(&mut pieces, output);
                }
            }
        }
        pieces
    }

    /// A frame at the start of the buffer (which starts with the opener).
    fn frame_at_start(&mut self) -> Parse {
        let rest = &self.buffer[self.opener.len()..];
        let Some(newline) = rest.iter().position(|b| *b == b'\n') else {
            return if rest.len() > MAX_HEADER {
                Parse::NotAFrame
            } else {
                Parse::Incomplete
            };
        };
        let header = &rest[..newline];
        let Some((length, mac)) = std::str::from_utf8(header)
            .ok()
            .and_then(|text| text.split_once(' '))
            .and_then(|(length, mac)| Some((length.parse::<usize>().ok()?, mac.as_bytes())))
        else {
            return Parse::NotAFrame;
        };
        if length > self.max_frame {
            return Parse::NotAFrame;
        }
        let body_start = self.opener.len() + newline + 1;
        if self.buffer.len() < body_start + length {
            return Parse::Incomplete;
        }
        let body = &self.buffer[body_start..body_start + length];
        if !self.key.verify(b"k", body, mac) {
            return Parse::NotAFrame;
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
            return Parse::NotAFrame;
        };
        // An authentic frame out of sequence is one replayed from the log (a cell that printed
        // it): output, not a message.
        if value.get("seq").and_then(serde_json::Value::as_u64) != Some(self.next_seq) {
            return Parse::NotAFrame;
        }
        self.next_seq += 1;
        Parse::Frame(value, body_start + length)
    }
}

enum Parse {
    Incomplete,
    Frame(serde_json::Value, usize),
    NotAFrame,
}

fn push_output(pieces: &mut Vec<Piece>, output: Vec<u8>) {
    if output.is_empty() {
        return;
    }
    if let Some(Piece::Output(last)) = pieces.last_mut() {
        last.extend_from_slice(&output);
    } else {
        pieces.push(Piece::Output(output));
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// The length of the longest suffix of `buffer` that is a proper prefix of `needle`.
fn partial_suffix(buffer: &[u8], needle: &[u8]) -> usize {
    (1..needle.len().min(buffer.len() + 1))
        .rev()
        .find(|&n| buffer.ends_with(&needle[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new([7; 32])
    }

    fn decoder() -> Decoder {
        Decoder::new(key(), "@@K@@", 1 << 20)
    }

    fn body(seq: u64, rest: &str) -> Vec<u8> {
        format!(r#"{{"seq":{seq}{rest}}}"#).into_bytes()
    }

    #[test]
    fn output_and_frames_are_told_apart_whatever_the_chunking() {
        // contract: O8
        let mut stream = b"before".to_vec();
        stream.extend(key().frame("@@K@@", &body(1, r#","ready":true"#)));
        stream.extend_from_slice(b"between\n");
        stream.extend(key().frame("@@K@@", &body(2, r#","result":1"#)));
        stream.extend_from_slice(b"after");
        for chunk in [1, 2, 3, 7, 64, stream.len()] {
            let mut decoder = decoder();
            let mut output = Vec::new();
            let mut frames = Vec::new();
            for piece in stream.chunks(chunk).flat_map(|c| decoder.push(c)) {
                match piece {
                    Piece::Output(bytes) => output.extend(bytes),
                    Piece::Frame(value) => frames.push(value["seq"].as_u64().unwrap()),
                }
            }
            // The tail that could start an opener waits for more; here it cannot.
            output.extend(decoder.push(b"").into_iter().flat_map(|p| match p {
                Piece::Output(b) => b,
                Piece::Frame(_) => Vec::new(),
            }));
            assert_eq!(frames, vec![1, 2], "chunk {chunk}");
            assert_eq!(
                String::from_utf8_lossy(&output),
                "beforebetween\nafter",
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn a_forged_or_replayed_frame_is_only_output() {
        // contract: O8
        let genuine = key().frame("@@K@@", &body(1, r#","call":1"#));
        let forged = Key::new([8; 32]).frame("@@K@@", &body(1, r#","call":1"#));
        let mut decoder = decoder();
        let pieces = decoder.push(&forged);
        assert!(
            pieces.iter().all(|p| matches!(p, Piece::Output(_))),
            "{pieces:?}"
        );
        assert!(matches!(decoder.push(&genuine)[..], [Piece::Frame(_)]));
        // The same frame again (a cell printing the log) is out of sequence.
        let pieces = decoder.push(&genuine);
        assert!(
            pieces.iter().all(|p| matches!(p, Piece::Output(_))),
            "{pieces:?}"
        );
        // A tampered body fails its check.
        let mut tampered = key().frame("@@K@@", &body(2, r#","call":1"#));
        let last = tampered.len() - 2;
        tampered[last] = b'2';
        let pieces = decoder.push(&tampered);
        assert!(
            pieces.iter().all(|p| matches!(p, Piece::Output(_))),
            "{pieces:?}"
        );
    }

    #[test]
    fn an_oversized_frame_is_output_and_memory_stays_bounded() {
        let mut decoder = Decoder::new(key(), "@@K@@", 64);
        let big = key().frame("@@K@@", &body(1, &format!(r#","x":"{}""#, "a".repeat(100))));
        let pieces = decoder.push(&big);
        assert!(
            pieces.iter().all(|p| matches!(p, Piece::Output(_))),
            "{pieces:?}"
        );
        assert!(decoder.buffer.len() < 16, "{}", decoder.buffer.len());
    }

    #[test]
    fn host_messages_carry_their_length_and_mac() {
        let message = key().message(br#"{"cell":1}"#);
        let text = String::from_utf8(message).unwrap();
        let (header, body) = text.split_once('\n').unwrap();
        let (length, mac) = header.split_once(' ').unwrap();
        assert_eq!(length, "10");
        assert_eq!(body, r#"{"cell":1}"#);
        assert!(key().verify(b"h", body.as_bytes(), mac.as_bytes()));
        assert!(!key().verify(b"k", body.as_bytes(), mac.as_bytes()));
    }
}
