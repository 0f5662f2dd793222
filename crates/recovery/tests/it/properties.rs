//! Property tests over generated host and sandbox trees: no file on either side is lost, host
//! files are never modified, nothing is written outside the home.

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use proptest::prelude::*;
use recovery::{Outcome, QuarantineReason, SkipReason};
use support::TarMaker;
use support::world::World;

const PATHS: &[&str] = &[
    "skills/x.md",
    "skills/a",
    "skills/a/x.md",
    "skills/a/y.md",
    "skills/a/b/x.md",
    "skills/b/x.md",
    "memories/MEMORY.md",
    "memories/a",
    "memories/a/x.md",
];

/// A consistent tree: no file below another file.
fn tree() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop::sample::select(PATHS),
        prop::sample::select(vec!["1", "2", "3"]),
        0..PATHS.len(),
    )
    .prop_map(|files| {
        let mut out: BTreeMap<String, String> = BTreeMap::new();
        for (path, body) in files {
            let clash = out
                .keys()
                .any(|p| path.starts_with(&format!("{p}/")) || p.starts_with(&format!("{path}/")));
            if !clash {
                out.insert(path.to_owned(), body.to_owned());
            }
        }
        out
    })
}

#[derive(Debug, Clone, Copy)]
enum Layout {
    Plain,
    SymlinkedSkills,
    SymlinkedSubdir,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    // contract: S5, S6, S7, S9, S10
    #[test]
    fn no_file_on_either_side_is_lost(
        host in tree(),
        sandbox in tree(),
        host_only in prop::collection::btree_set(prop::sample::select(PATHS), 0..3),
        layout in prop::sample::select(vec![Layout::Plain, Layout::SymlinkedSkills, Layout::SymlinkedSubdir]),
    ) {
        let mut world = World::new();
        world.host_only = host_only.iter().map(PathBuf::from).collect();
        for (path, body) in &host {
            match layout {
                Layout::SymlinkedSkills if path.starts_with("skills/") => {
                    world.host(&format!("real-skills/{}", &path["skills/".len()..]), body);
                }
                _ => {
                    world.host(path, body);
                }
            }
        }
        match layout {
            Layout::Plain => {}
            Layout::SymlinkedSkills => world.symlink("skills", &world.home().join("real-skills")),
            Layout::SymlinkedSubdir => {
                if !world.home().join("skills/b").exists() {
                    world.symlink("skills/b", &world.outside());
                }
            }
        }
        let mut archive = TarMaker::new();
        for (path, body) in &sandbox {
            archive.file(path, body.as_bytes());
        }
        let report = world.recover(&archive.finish()).expect("generated worlds always recover");

        prop_assert_eq!(report.files.len(), sandbox.len());
        for (path, body) in &sandbox {
            let outcome = report.outcome_of(path).expect("every sandbox file is reported");
            let covered = host_only.iter().any(|h| path == h || path.starts_with(&format!("{h}/")));
            match outcome {
                Outcome::Restored => {
                    prop_assert!(!host.contains_key(path));
                    prop_assert!(!covered, "host-only {} restored", path);
                    prop_assert_eq!(&world.read(path), body);
                }
                Outcome::Unchanged => prop_assert_eq!(host.get(path), Some(body)),
                // No push base here: nothing may give way to the host (S15 needs one).
                Outcome::Superseded => prop_assert!(false, "{} superseded without a base", path),
                Outcome::Quarantined { at, reason } => {
                    prop_assert_eq!(&world.read(at), body);
                    if *reason == QuarantineReason::Conflict {
                        prop_assert!(host.get(path).is_some_and(|h| h != body));
                    }
                }
                Outcome::Skipped { reason } => {
                    prop_assert!(matches!(reason, SkipReason::AncestorIsFile { .. }), "{:?}", reason);
                }
            }
        }
    }
}

/// How a host copy relates to its sandbox copy. The cases sit where a content comparison can
/// stop early: one side running out first, or the very last byte.
#[derive(Debug, Clone, Copy)]
enum Pair {
    Equal,
    HostIsPrefix,
    SandboxIsPrefix,
    LastByteDiffers,
    HostEmpty,
    SandboxEmpty,
}

/// Some bytes: short ones, and ones around the 64 KiB chunk the comparison reads at a time.
fn content() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..48),
        (65_530usize..65_543, any::<u8>()).prop_map(|(len, byte)| vec![byte; len]),
    ]
}

/// (host bytes, sandbox bytes, equal?) for one pair.
fn pair() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, bool)> {
    let relation = prop::sample::select(vec![
        Pair::Equal,
        Pair::HostIsPrefix,
        Pair::SandboxIsPrefix,
        Pair::LastByteDiffers,
        Pair::HostEmpty,
        Pair::SandboxEmpty,
    ]);
    let extra = prop::collection::vec(any::<u8>(), 1..8);
    (relation, content(), extra, 1u8..=255).prop_map(|(relation, common, extra, flip)| {
        // A side that must be non-empty falls back to `extra` when `common` is empty.
        let nonempty = if common.is_empty() {
            extra.clone()
        } else {
            common.clone()
        };
        let longer = [common.as_slice(), &extra].concat();
        match relation {
            Pair::Equal => (common.clone(), common, true),
            Pair::HostIsPrefix => (common, longer, false),
            Pair::SandboxIsPrefix => (longer, common, false),
            Pair::LastByteDiffers => {
                let mut other = nonempty.clone();
                *other.last_mut().expect("non-empty") ^= flip;
                (nonempty, other, false)
            }
            Pair::HostEmpty => (Vec::new(), nonempty, false),
            Pair::SandboxEmpty => (nonempty, Vec::new(), false),
        }
    })
}

const PAIR_PATHS: &[&str] = &["skills/a/SKILL.md", "skills/x.md", "memories/MEMORY.md"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    // contract: S6
    #[test]
    fn a_copy_that_differs_only_at_an_edge_is_a_conflict_and_neither_copy_is_lost(
        pairs in prop::collection::vec(pair(), 1..=PAIR_PATHS.len()),
    ) {
        let world = World::new();
        let mut archive = TarMaker::new();
        for (path, (host, sandbox, _)) in PAIR_PATHS.iter().zip(&pairs) {
            let at = world.home().join(path);
            std::fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
            std::fs::write(&at, host).expect("host copy");
            archive.file(path, sandbox);
        }
        let report = world.recover(&archive.finish()).expect("recovers");

        prop_assert_eq!(report.files.len(), pairs.len());
        for (path, (host, sandbox, equal)) in PAIR_PATHS.iter().zip(&pairs) {
            let outcome = report.outcome_of(path).expect("every sandbox file is reported");
            prop_assert_eq!(&std::fs::read(world.home().join(path)).expect("host copy"), host);
            let kept = PathBuf::from(format!("cache/e2b-recovered/{}/{path}", support::world::ID));
            if *equal {
                prop_assert_eq!(outcome, &Outcome::Unchanged, "{}", path);
                prop_assert!(!world.home().join(&kept).exists());
            } else {
                prop_assert_eq!(
                    outcome,
                    &Outcome::Quarantined { at: kept.clone(), reason: QuarantineReason::Conflict },
                    "{} host {} bytes, sandbox {} bytes", path, host.len(), sandbox.len()
                );
                prop_assert_eq!(&std::fs::read(world.home().join(&kept)).expect("quarantined"), sandbox);
            }
        }
    }
}
