//! The scope note: what this host remembers about a scope for people (which task it is,
//! the last writer's pid, the last pull and recovery outcome). Diagnostics only: no gate
//! reads it, so a lost update between two processes costs a stale line, never safety.

use std::collections::BTreeMap;

use crate::error::Error;
use crate::key::ScopeFile;
use crate::scope::ScopeFiles;

const HEADER: &str = "hermes-e2b note v1";

/// The longest value kept; longer ones are cut (a note must stay one small record).
pub const MAX_NOTE_VALUE: usize = 512;

/// A scope's note: named one-line values. Names are lowercase ASCII letters and `-`; values
/// are single lines (line breaks become spaces) of at most [`MAX_NOTE_VALUE`] bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeNote {
    entries: BTreeMap<String, String>,
}

impl ScopeNote {
    /// The value under `name`, if recorded.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries.get(name).map(String::as_str)
    }

    /// Records `value` under `name` (a name outside the allowed alphabet is ignored).
    pub fn set(&mut self, name: &str, value: &str) {
        if !valid_name(name) {
            return;
        }
        let mut line: String = value
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if line.len() > MAX_NOTE_VALUE {
            let mut cut = MAX_NOTE_VALUE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        self.entries.insert(name.to_owned(), line);
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = format!("{HEADER}\n");
        for (name, value) in &self.entries {
            out.push_str(&format!("{name}: {value}\n"));
        }
        out.into_bytes()
    }

    /// Lenient: a line it cannot read is skipped, a wrong header reads as no note.
    fn parse(bytes: &[u8]) -> Option<ScopeNote> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let mut note = ScopeNote::default();
        for line in lines {
            if let Some((name, value)) = line.split_once(": ") {
                note.set(name, value);
            }
        }
        Some(note)
    }
}

fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
}

impl ScopeFiles {
    /// The scope's note, if this host ever wrote one (an unreadable note reads as none).
    pub fn note(&self) -> Result<Option<ScopeNote>, Error> {
        let path = self.path(ScopeFile::Note);
        match self.host().read(&path) {
            Ok(bytes) => Ok(ScopeNote::parse(&bytes)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(Error::io("read scope note", &path, error)),
        }
    }

    /// Reads the note, lets `change` edit it, and writes it back atomically (0600).
    pub fn update_note(&self, change: impl FnOnce(&mut ScopeNote)) -> Result<(), Error> {
        let mut note = self.note()?.unwrap_or_default();
        change(&mut note);
        self.host()
            .ensure_private_dir(self.dir())
            .map_err(|source| Error::io("create coordination directory", self.dir(), source))?;
        let path = self.path(ScopeFile::Note);
        self.host()
            .write_atomic(&path, &note.encode())
            .map_err(|source| Error::io("write scope note", &path, source))
    }

    /// Whether this host has ever coordinated the scope (its writer lock file exists; lock
    /// files are never deleted). Checks existence only: no lock is taken, nothing created.
    pub fn known_on_host(&self) -> bool {
        // Through the host seam like every other effect; a lock file is empty, so the read
        // is an existence check.
        self.host().read(&self.path(ScopeFile::WriterLock)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ScopeKey;

    #[test]
    fn a_note_round_trips_and_stays_one_line_per_value() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ScopeFiles::new(dir.path().join("e2b"), ScopeKey::from_bytes([3; 32]));
        assert_eq!(files.note().expect("read"), None);
        assert!(!files.known_on_host());
        files
            .update_note(|note| {
                note.set("task", "session:a\nrecovery: forged");
                note.set("Bad Name", "x");
                note.set("pull", &"é".repeat(MAX_NOTE_VALUE));
            })
            .expect("write");
        files
            .update_note(|note| note.set("recovery", "ok"))
            .expect("update");
        let note = files.note().expect("read").expect("written");
        assert_eq!(note.get("task"), Some("session:a recovery: forged"));
        assert_eq!(note.get("recovery"), Some("ok"));
        assert_eq!(note.get("Bad Name"), None);
        assert!(note.get("pull").is_some_and(|v| v.len() <= MAX_NOTE_VALUE));
        std::fs::write(files.path(ScopeFile::Note), b"garbage").expect("corrupt");
        assert_eq!(files.note().expect("read"), None);
    }
}
