//! The checks the fuzz target runs on every input; the test suite replays the saved corpus
//! through the same function.

use std::io::{Cursor, Read};

use capped_tar::{Error, Member, MemberKind, RejectReason, Visitor};

/// A visitor that keeps what it was given.
#[derive(Default)]
pub struct Recorder {
    /// Accepted members in order: name, and content for files.
    pub members: Vec<(String, Option<Vec<u8>>)>,
    /// Rejected members in order.
    pub rejected: Vec<(String, RejectReason)>,
}

impl Visitor for Recorder {
    type Error = Error;

    fn archive_failed(&self, error: Error) -> Error {
        error
    }

    fn directory(&mut self, member: &Member) -> Result<(), Error> {
        self.members.push((member.path.as_str().to_owned(), None));
        Ok(())
    }

    fn file(&mut self, member: &Member, content: &mut dyn Read) -> Result<(), Error> {
        let mut data = Vec::new();
        content
            .read_to_end(&mut data)
            .map_err(|source| Error::Source { source })?;
        assert!(matches!(member.kind, MemberKind::File { size, .. } if size >= data.len() as u64));
        self.members
            .push((member.path.as_str().to_owned(), Some(data)));
        Ok(())
    }

    fn rejected(&mut self, name: &str, reason: RejectReason) -> Result<(), Error> {
        self.rejected.push((name.to_owned(), reason));
        Ok(())
    }
}

/// Why [`Refuser`] stopped a read.
#[derive(Debug)]
pub enum Refused {
    /// The archive itself failed.
    Archive(Error),
    /// A member broke a rule.
    Member(String, RejectReason),
}

/// A visitor that refuses the whole archive at its first rejected member.
pub struct Refuser;

impl Visitor for Refuser {
    type Error = Refused;

    fn archive_failed(&self, error: Error) -> Refused {
        Refused::Archive(error)
    }

    fn directory(&mut self, _member: &Member) -> Result<(), Refused> {
        Ok(())
    }

    fn file(&mut self, _member: &Member, _content: &mut dyn Read) -> Result<(), Refused> {
        Ok(())
    }

    fn rejected(&mut self, name: &str, reason: RejectReason) -> Result<(), Refused> {
        Err(Refused::Member(name.to_owned(), reason))
    }
}

/// Reads `data` as a sandbox archive and checks every invariant the reader promises.
pub fn check_archive(data: &[u8]) {
    const CAP: u64 = 1 << 20;
    let mut recorder = Recorder::default();
    let result = capped_tar::read(&mut Cursor::new(data), CAP, &mut recorder);
    let Ok(summary) = result else {
        return;
    };
    assert!(summary.stream_bytes <= CAP);
    let mut seen = std::collections::HashSet::new();
    for (path, _) in &recorder.members {
        assert!(!path.is_empty() && !path.starts_with('/'), "{path:?}");
        assert!(
            path.split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."),
            "{path:?}"
        );
        assert!(seen.insert(path.clone()), "duplicate accepted: {path:?}");
    }
    for (path, content) in &recorder.members {
        if content.is_some() {
            let below = format!("{path}/");
            assert!(
                !recorder.members.iter().any(|(p, _)| p.starts_with(&below)),
                "member below file {path:?}"
            );
        }
    }
    assert_eq!(
        summary.files + summary.directories,
        recorder.members.len() as u64
    );
    assert_eq!(summary.rejected, recorder.rejected.len() as u64);

    // Refusing at the first rejected member agrees: it succeeds exactly when nothing was
    // rejected.
    let strict = capped_tar::read(&mut Cursor::new(data), CAP, &mut Refuser);
    assert_eq!(strict.is_ok(), summary.rejected == 0);
}
