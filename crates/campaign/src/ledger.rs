//! The version ledger: every skills/memories version the user wrote, by its full bytes, and
//! which of them may legitimately be gone.

use std::collections::{BTreeMap, HashSet};

/// Where the user wrote a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    /// On the host, under the Hermes home.
    Host,
    /// In the sandbox, under its Hermes home.
    Sandbox,
}

/// How the user changes a file. Besides fresh contents, the kinds that make the old and the
/// new version differ only at the end: those are where a comparison that stops early would
/// call two versions the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EditKind {
    /// Fresh contents replace the file's.
    Rewrite,
    /// The old contents and a fresh line after them (an agent adding to MEMORY.md): the old
    /// version is a prefix of the new one.
    Append,
    /// A strict prefix of the old contents, down to empty.
    Truncate,
    /// The old contents with the last byte changed: same length, different last byte.
    LastByte,
}

/// Every edit kind, in the order the summary prints them.
pub const EDIT_KINDS: [EditKind; 4] = [
    EditKind::Rewrite,
    EditKind::Append,
    EditKind::Truncate,
    EditKind::LastByte,
];

impl EditKind {
    /// The kind as the summary names it.
    pub fn name(self) -> &'static str {
        match self {
            EditKind::Rewrite => "edit: fresh rewrite",
            EditKind::Append => "edit: append (the old version a prefix of the new)",
            EditKind::Truncate => "edit: truncation to a strict prefix (or empty)",
            EditKind::LastByte => "edit: same length, last byte changed",
        }
    }
}

/// What became of a version the user wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// It must be found on the host, in a sandbox or in quarantine.
    Kept,
    /// The user overwrote this very version: it may be gone.
    Overwritten,
    /// It lived only in a sandbox the campaign made vanish: it may be gone.
    Vanished,
    /// It was reported lost once already.
    Reported,
}

/// Every skills/memories version the campaign wrote, keyed by its full contents: a version
/// is found only where a file holds exactly those bytes (a prefix or a longer file is
/// another version). An edit may recreate earlier contents (a truncation back to what an
/// append extended); that is the user writing that version again, so it must be kept again.
#[derive(Debug, Default)]
pub struct Ledger {
    versions: BTreeMap<Vec<u8>, Fate>,
    next: u64,
}

impl Ledger {
    /// The contents of a new version of `rel` made from fresh text, recorded as one that must
    /// be kept (the file's old contents are not read).
    pub fn write(&mut self, side: Side, cycle: u64, rel: &str) -> Vec<u8> {
        self.edit(EditKind::Rewrite, None, side, cycle, rel, 0).1
    }

    /// The user changes `rel`, whose contents on that side are `old` (`None`: no file), by
    /// `kind`: the new contents, recorded as a version that must be kept, and the kind
    /// applied. `old` is marked overwritten. A kind that needs old contents (truncation and
    /// last byte need at least one byte, append a file) falls back to a fresh rewrite.
    /// `cut` picks the truncation's length (`cut % old length`).
    pub fn edit(
        &mut self,
        kind: EditKind,
        old: Option<&[u8]>,
        side: Side,
        cycle: u64,
        rel: &str,
        cut: usize,
    ) -> (EditKind, Vec<u8>) {
        self.next += 1;
        let (kind, content) = match (kind, old) {
            (EditKind::Append, Some(old)) => {
                let mut content = old.to_vec();
                content.extend(self.fresh("appended", side, cycle, rel));
                (kind, content)
            }
            (EditKind::Truncate, Some(old)) if !old.is_empty() => {
                (kind, old[..cut % old.len()].to_vec())
            }
            (EditKind::LastByte, Some(old)) if !old.is_empty() => {
                let mut content = old.to_vec();
                let last = content.len() - 1;
                // Varied by version, so flipping back and forth rarely recreates old text.
                let mut byte = b'a' + (self.next % 26) as u8;
                if byte == content[last] {
                    byte = b'A' + (self.next % 26) as u8;
                }
                content[last] = byte;
                (kind, content)
            }
            _ => (EditKind::Rewrite, self.fresh("written", side, cycle, rel)),
        };
        if let Some(old) = old {
            self.overwrite(old);
        }
        self.versions.insert(content.clone(), Fate::Kept);
        (kind, content)
    }

    /// A line of fresh text, unique by the version number.
    fn fresh(&self, how: &str, side: Side, cycle: u64, rel: &str) -> Vec<u8> {
        let side = match side {
            Side::Host => "host",
            Side::Sandbox => "sandbox",
        };
        format!(
            "campaign version {} of {rel}, {how} on the {side} in cycle {cycle}\n",
            self.next
        )
        .into_bytes()
    }

    /// The user is about to overwrite a file holding `old`: that version may go.
    pub fn overwrite(&mut self, old: &[u8]) {
        if let Some(fate) = self.versions.get_mut(old) {
            *fate = Fate::Overwritten;
        }
    }

    /// `content` was in a sandbox the campaign made vanish: it may go.
    pub fn vanished(&mut self, content: &[u8]) {
        if let Some(fate) = self.versions.get_mut(content)
            && *fate == Fate::Kept
        {
            *fate = Fate::Vanished;
        }
    }

    /// Versions that must be kept and are not among `found` (the full contents of every file
    /// on the host, in every sandbox and in quarantine).
    pub fn lost<'a>(&'a self, found: &HashSet<Vec<u8>>) -> Vec<&'a [u8]> {
        self.versions
            .iter()
            .filter(|(content, fate)| **fate == Fate::Kept && !found.contains(*content))
            .map(|(content, _)| content.as_slice())
            .collect()
    }

    /// `content` was reported lost: it is not reported again.
    pub fn reported(&mut self, content: &[u8]) {
        if let Some(fate) = self.versions.get_mut(content) {
            *fate = Fate::Reported;
        }
    }

    /// How many versions were written.
    pub fn written(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(contents: &[&[u8]]) -> HashSet<Vec<u8>> {
        contents.iter().map(|c| c.to_vec()).collect()
    }

    #[test]
    fn a_kept_version_must_be_found() {
        let mut ledger = Ledger::default();
        let a = ledger.write(Side::Host, 1, "skills/a/SKILL.md");
        let b = ledger.write(Side::Sandbox, 1, "skills/a/SKILL.md");
        assert_eq!(ledger.lost(&found(&[&a])), vec![b.as_slice()]);
        assert!(a.ends_with(b"host in cycle 1\n") && b.ends_with(b"sandbox in cycle 1\n"));
    }

    #[test]
    fn overwritten_and_vanished_versions_may_go() {
        let mut ledger = Ledger::default();
        let a = ledger.write(Side::Host, 1, "memories/MEMORY.md");
        let b = ledger.write(Side::Sandbox, 2, "memories/MEMORY.md");
        ledger.overwrite(&a);
        ledger.vanished(&b);
        assert!(ledger.lost(&HashSet::new()).is_empty());
        // Overwriting text that is no version (a file from elsewhere) changes nothing.
        let c = ledger.write(Side::Host, 3, "memories/USER.md");
        ledger.overwrite(b"unrelated text");
        assert_eq!(ledger.lost(&HashSet::new()), vec![c.as_slice()]);
        // A loss is reported once.
        ledger.reported(&c);
        assert!(ledger.lost(&HashSet::new()).is_empty());
        assert_eq!(ledger.written(), 3);
    }

    #[test]
    fn edits_that_differ_at_the_end_are_versions_of_their_own() {
        let mut ledger = Ledger::default();
        let rel = "memories/MEMORY.md";
        let a = ledger.write(Side::Host, 1, rel);
        let (kind, b) = ledger.edit(EditKind::Append, Some(&a), Side::Sandbox, 2, rel, 0);
        assert_eq!(kind, EditKind::Append);
        assert!(b.starts_with(&a) && b.len() > a.len());
        // The old version was overwritten; the new one is not found in its prefix.
        assert_eq!(ledger.lost(&found(&[&a])), vec![b.as_slice()]);
        let (kind, c) = ledger.edit(EditKind::Truncate, Some(&b), Side::Host, 3, rel, 5);
        assert_eq!((kind, c.as_slice()), (EditKind::Truncate, &b[..5]));
        // A file holding more than a version is not that version either.
        assert_eq!(ledger.lost(&found(&[&b])), vec![c.as_slice()]);
        let (kind, d) = ledger.edit(EditKind::LastByte, Some(&b), Side::Host, 3, rel, 0);
        assert_eq!(kind, EditKind::LastByte);
        assert_eq!(d.len(), b.len());
        assert_eq!(d[..d.len() - 1], b[..b.len() - 1]);
        assert_ne!(d.last(), b.last());
        assert!(ledger.lost(&found(&[&b, &c])).contains(&d.as_slice()));
        // Truncation to empty; a truncation of one byte is always to empty.
        let (kind, e) = ledger.edit(EditKind::Truncate, Some(b"x"), Side::Host, 4, rel, 7);
        assert_eq!((kind, e.as_slice()), (EditKind::Truncate, &b""[..]));
    }

    #[test]
    fn an_edit_without_old_contents_is_a_fresh_rewrite() {
        let mut ledger = Ledger::default();
        let rel = "skills/a/SKILL.md";
        for kind in EDIT_KINDS {
            let (applied, content) = ledger.edit(kind, None, Side::Host, 1, rel, 3);
            assert_eq!(applied, EditKind::Rewrite, "{kind:?}");
            assert!(content.starts_with(b"campaign version"));
        }
        for kind in [EditKind::Truncate, EditKind::LastByte] {
            let (applied, _) = ledger.edit(kind, Some(b""), Side::Host, 1, rel, 3);
            assert_eq!(applied, EditKind::Rewrite, "{kind:?}");
        }
        // Appending to an empty file is an append all the same.
        let (applied, content) = ledger.edit(EditKind::Append, Some(b""), Side::Host, 1, rel, 3);
        assert_eq!(applied, EditKind::Append);
        assert!(content.starts_with(b"campaign version"));
    }

    #[test]
    fn writing_earlier_contents_again_keeps_them_again() {
        let mut ledger = Ledger::default();
        let rel = "memories/USER.md";
        let a = ledger.write(Side::Host, 1, rel);
        let (_, b) = ledger.edit(EditKind::Append, Some(&a), Side::Host, 2, rel, 0);
        let (_, again) = ledger.edit(EditKind::Truncate, Some(&b), Side::Host, 3, rel, a.len());
        assert_eq!(again, a);
        assert_eq!(ledger.lost(&HashSet::new()), vec![a.as_slice()]);
    }
}
