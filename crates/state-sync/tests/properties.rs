//! Property tests over generated archives: the member rules hold whatever the sandbox sends,
//! clean archives pass through whole, and no truncation is ever a success.

mod support;

use std::collections::BTreeMap;
use std::io::Cursor;

use proptest::prelude::*;
use state_sync::{DEFAULT_MAX_BYTES, ReadConfig, UnsafeMembers, read_archive};
use support::TarMaker;
use support::harness::{Recorder, check_archive};

fn skip() -> ReadConfig {
    ReadConfig {
        max_bytes: DEFAULT_MAX_BYTES,
        unsafe_members: UnsafeMembers::Skip,
    }
}

fn hostile_member() -> impl Strategy<Value = (Vec<u8>, u8, Vec<u8>)> {
    let component = prop::sample::select(vec!["a", "b", "skills", "..", ".", "", "x y", "\u{e9}"]);
    let name =
        (any::<bool>(), prop::collection::vec(component, 1..5)).prop_map(|(absolute, parts)| {
            let joined = parts.join("/");
            if absolute {
                format!("/{joined}").into_bytes()
            } else {
                joined.into_bytes()
            }
        });
    let kind = prop::sample::select(vec![b'0', b'0', b'0', b'5', b'2', b'1', b'3', b'6', b'S']);
    (name, kind, prop::collection::vec(any::<u8>(), 0..700))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    // contract: X5
    #[test]
    fn member_rules_hold_for_any_archive(members in prop::collection::vec(hostile_member(), 0..12)) {
        let mut archive = TarMaker::new();
        for (name, kind, data) in &members {
            let data: &[u8] = if *kind == b'0' { data } else { b"" };
            archive.raw(name, *kind, data, b"target");
        }
        check_archive(&archive.finish());
    }

    #[test]
    fn clean_archives_pass_through_whole(files in prop::collection::btree_map("[a-c]{1,3}(/[a-c]{1,3}){0,2}", prop::collection::vec(any::<u8>(), 0..2000), 0..20)) {
        // Keep only names that are not an ancestor of another name (a file cannot be a directory).
        let names: Vec<&String> = files.keys().collect();
        let clean: BTreeMap<&String, &Vec<u8>> = files
            .iter()
            .filter(|(name, _)| !names.iter().any(|other| other.starts_with(&format!("{name}/"))))
            .collect();
        let mut archive = TarMaker::new();
        for (name, data) in &clean {
            archive.file(&format!("skills/{name}"), data);
        }
        let mut recorder = Recorder::default();
        let summary = read_archive(&mut Cursor::new(archive.finish()), &skip(), &mut recorder).expect("clean archive");
        prop_assert!(summary.rejected.is_empty());
        let got: BTreeMap<String, Vec<u8>> = recorder.members.into_iter().filter_map(|(n, d)| d.map(|d| (n, d))).collect();
        let want: BTreeMap<String, Vec<u8>> = clean.iter().map(|(n, d)| (format!("skills/{n}"), (*d).clone())).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn no_truncation_is_a_success(sizes in prop::collection::vec(0usize..1500, 1..6), cut_seed in any::<u64>()) {
        let mut archive = TarMaker::new();
        for (i, size) in sizes.iter().enumerate() {
            archive.file(&format!("m/{i}"), &vec![i as u8; *size]);
        }
        let members = archive.unterminated().len();
        let full = archive.finish();
        let cut = (cut_seed % (members as u64 + 512)) as usize;
        let result = read_archive(&mut Cursor::new(&full[..cut]), &skip(), &mut Recorder::default());
        prop_assert!(result.expect_err("partial").is_truncated());
    }
}
