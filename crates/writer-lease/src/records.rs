//! The content of the marker files: small, versioned, line-based records.

use std::fmt;

/// A writer generation: bumped by every writer transition, so a stamp names
/// exactly one completed push.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(u64);

impl Generation {
    /// No writer has begun a transition yet.
    pub const NONE: Generation = Generation(0);

    /// Wraps a raw generation number.
    pub fn new(value: u64) -> Self {
        Generation(value)
    }

    /// The raw generation number.
    pub fn get(self) -> u64 {
        self.0
    }

    pub(crate) fn next(self) -> Generation {
        Generation(self.0.saturating_add(1))
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a scope is marked dirty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DirtyReason {
    /// A writer transition (recovery and push) is in flight, or was abandoned.
    Transition,
    /// A sync failed; the sandbox holds state the host knows to be stale.
    FailedSync,
    /// The marker exists but its content could not be read; still dirty.
    Unknown,
}

impl DirtyReason {
    fn as_str(self) -> &'static str {
        match self {
            DirtyReason::Transition => "transition",
            DirtyReason::FailedSync => "failed-sync",
            DirtyReason::Unknown => "unknown",
        }
    }
}

impl fmt::Display for DirtyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DirtyReason::Transition => "a writer transition is in flight or was abandoned",
            DirtyReason::FailedSync => "the last state sync failed",
            DirtyReason::Unknown => "the dirty marker is unreadable",
        })
    }
}

/// The dirty marker's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DirtyMarker {
    /// Why the scope is dirty.
    pub reason: DirtyReason,
    /// The writer generation that set it, when readable.
    pub generation: Option<Generation>,
    /// The process that set it, when readable (diagnostics only).
    pub pid: Option<u32>,
}

impl DirtyMarker {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let generation = self.generation.unwrap_or(Generation::NONE);
        let pid = self.pid.unwrap_or(0);
        format!(
            "hermes-e2b dirty v1\nreason: {}\ngeneration: {generation}\npid: {pid}\n",
            self.reason.as_str()
        )
        .into_bytes()
    }

    /// Parses a marker; content it cannot read still means dirty.
    pub(crate) fn parse(bytes: &[u8]) -> DirtyMarker {
        let unknown = DirtyMarker {
            reason: DirtyReason::Unknown,
            generation: None,
            pid: None,
        };
        let Some(fields) = fields(
            bytes,
            "hermes-e2b dirty v1",
            &["reason", "generation", "pid"],
        ) else {
            return unknown;
        };
        let reason = match fields[0] {
            "transition" => DirtyReason::Transition,
            "failed-sync" => DirtyReason::FailedSync,
            _ => return unknown,
        };
        DirtyMarker {
            reason,
            generation: parse_u64(fields[1]).map(Generation),
            pid: parse_u64(fields[2]).and_then(|p| u32::try_from(p).ok()),
        }
    }
}

/// The prepared stamp: generation `generation` completed a push to sandbox
/// `sandbox_id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PreparedStamp {
    /// The generation whose push completed.
    pub generation: Generation,
    /// The sandbox the push went to.
    pub sandbox_id: String,
}

impl PreparedStamp {
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "hermes-e2b prepared v1\ngeneration: {}\nsandbox: {}\n",
            self.generation, self.sandbox_id
        )
        .into_bytes()
    }

    pub(crate) fn parse(bytes: &[u8]) -> Option<PreparedStamp> {
        let fields = fields(bytes, "hermes-e2b prepared v1", &["generation", "sandbox"])?;
        let sandbox_id = fields[1];
        if !valid_sandbox_id(sandbox_id) {
            return None;
        }
        Some(PreparedStamp {
            generation: Generation(parse_u64(fields[0])?),
            sandbox_id: sandbox_id.to_owned(),
        })
    }
}

pub(crate) fn encode_generation(generation: Generation) -> Vec<u8> {
    format!("hermes-e2b generation v1\ngeneration: {generation}\n").into_bytes()
}

pub(crate) fn parse_generation(bytes: &[u8]) -> Option<Generation> {
    let fields = fields(bytes, "hermes-e2b generation v1", &["generation"])?;
    parse_u64(fields[0]).map(Generation)
}

/// Whether `id` looks like an id E2B issues; anything else is refused, so a
/// stamp's line format can never be confused.
pub(crate) fn valid_sandbox_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Splits `header\nk1: v1\nk2: v2\n` with exactly the keys given, in order.
fn fields<'a>(bytes: &'a [u8], header: &str, keys: &[&str]) -> Option<Vec<&'a str>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let body = text.strip_suffix('\n')?;
    let mut lines = body.split('\n');
    if lines.next()? != header {
        return None;
    }
    let mut values = Vec::with_capacity(keys.len());
    for key in keys {
        let (name, value) = lines.next()?.split_once(": ")?;
        if name != *key {
            return None;
        }
        values.push(value);
    }
    lines.next().is_none().then_some(values)
}

/// Canonical decimal only: no sign, no leading zeros (except "0").
fn parse_u64(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if canonical { text.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let stamp = PreparedStamp {
            generation: Generation(7),
            sandbox_id: "ikk8xw53nne4bytcdg87t".to_owned(),
        };
        assert_eq!(PreparedStamp::parse(&stamp.encode()), Some(stamp));

        let marker = DirtyMarker {
            reason: DirtyReason::FailedSync,
            generation: Some(Generation(3)),
            pid: Some(42),
        };
        assert_eq!(DirtyMarker::parse(&marker.encode()), marker);

        assert_eq!(
            parse_generation(&encode_generation(Generation(u64::MAX))),
            Some(Generation(u64::MAX))
        );
    }

    #[test]
    fn anything_unexpected_is_rejected() {
        for bad in [
            &b""[..],
            b"hermes-e2b prepared v1\ngeneration: 1\nsandbox: a\n\n",
            b"hermes-e2b prepared v1\ngeneration: 01\nsandbox: a\n",
            b"hermes-e2b prepared v1\ngeneration: 1\nsandbox: a/b\n",
            b"hermes-e2b prepared v2\ngeneration: 1\nsandbox: a\n",
            b"hermes-e2b prepared v1\nsandbox: a\ngeneration: 1\n",
            b"hermes-e2b prepared v1\ngeneration: -1\nsandbox: a\n",
            b"hermes-e2b prepared v1\ngeneration: 1\nsandbox: a",
            b"\xff\xfe",
        ] {
            assert_eq!(PreparedStamp::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_generation(b"hermes-e2b generation v1\ngeneration: x\n"),
            None
        );
    }

    #[test]
    fn an_unreadable_dirty_marker_is_still_dirty() {
        let marker = DirtyMarker::parse(b"garbage");
        assert_eq!(marker.reason, DirtyReason::Unknown);
        assert_eq!(marker.generation, None);
    }

    #[test]
    fn sandbox_ids_are_restricted() {
        assert!(valid_sandbox_id("ikk8xw53nne4bytcdg87t"));
        assert!(valid_sandbox_id("sbx-1_a.b"));
        for bad in ["", "a\nb", "a: b", "../x", "é", &"x".repeat(129)] {
            assert!(!valid_sandbox_id(bad), "{bad:?}");
        }
    }
}
