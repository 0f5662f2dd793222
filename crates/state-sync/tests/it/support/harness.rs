//! The checks the corpus replay and the property test run on every input.

use std::io::Cursor;

use state_sync::{MemberKind, ReadConfig, UnsafeMembers, pull_teardown, read_archive};

/// A sink that keeps what it was given.
#[derive(Default)]
pub struct Recorder {
    pub members: Vec<(String, Option<Vec<u8>>)>,
}

impl state_sync::MemberSink for Recorder {
    fn directory(&mut self, member: &state_sync::Member) -> std::io::Result<()> {
        self.members.push((member.path.as_str().to_owned(), None));
        Ok(())
    }

    fn file(
        &mut self,
        member: &state_sync::Member,
        content: &mut dyn std::io::Read,
    ) -> std::io::Result<()> {
        let mut data = Vec::new();
        content.read_to_end(&mut data)?;
        assert!(matches!(member.kind, MemberKind::File { size, .. } if size >= data.len() as u64));
        self.members
            .push((member.path.as_str().to_owned(), Some(data)));
        Ok(())
    }
}

/// Reads `data` as a sandbox archive and checks what state-sync promises on top of capped-tar's
/// reader (whose own invariants capped-tar's fuzz harness checks on the same corpus): the
/// summary accounts for what the sink got, the refusing policy agrees with the skipping one,
/// and the teardown archive round-trips.
pub fn check_archive(data: &[u8]) {
    const CAP: u64 = 1 << 20;
    let skip = ReadConfig {
        max_bytes: CAP,
        unsafe_members: UnsafeMembers::Skip,
    };
    let mut recorder = Recorder::default();
    let result = read_archive(&mut Cursor::new(data), &skip, &mut recorder);
    let Ok(summary) = result else {
        return;
    };
    assert!(summary.stream_bytes <= CAP);
    assert_eq!(
        summary.files + summary.directories,
        recorder.members.len() as u64
    );

    // Refusing mode agrees: it succeeds exactly when nothing was rejected.
    let refuse = ReadConfig {
        max_bytes: CAP,
        unsafe_members: UnsafeMembers::Refuse,
    };
    let strict = read_archive(&mut Cursor::new(data), &refuse, &mut Recorder::default());
    assert_eq!(strict.is_ok(), summary.rejected.is_empty());

    // The teardown archive round-trips: same members, named below the remote root.
    let (again, out) = pull_teardown(
        &mut Cursor::new(data),
        &skip,
        "/home/user/.hermes",
        Vec::new(),
    )
    .expect("a readable archive also converts");
    assert_eq!(again, summary);
    let mut reread = Recorder::default();
    let relaxed = ReadConfig {
        max_bytes: u64::MAX,
        unsafe_members: UnsafeMembers::Refuse,
    };
    read_archive(&mut Cursor::new(out), &relaxed, &mut reread).expect("our own output is clean");
    assert_eq!(reread.members.len(), recorder.members.len());
    for ((ours, a), (theirs, b)) in reread.members.iter().zip(&recorder.members) {
        assert_eq!(ours, &format!("home/user/.hermes/{theirs}"));
        assert_eq!(a, b);
    }
}
