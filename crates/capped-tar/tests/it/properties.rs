//! Property tests over generated archives: the member rules hold whatever the sandbox sends,
//! clean archives pass through whole, and no truncation is ever a success.

use std::collections::BTreeMap;
use std::io::Cursor;

use proptest::prelude::*;

use crate::support::harness::{Recorder, check_archive};
use crate::support::{TarMaker, hostile_archive};

/// The cap the clean-archive properties read under: 2 GiB, far above anything they build.
const CAP: u64 = 2 * 1024 * 1024 * 1024;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    // contract: X5
    #[test]
    fn member_rules_hold_for_any_archive(archive in hostile_archive()) {
        check_archive(&archive);
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
        let summary = capped_tar::read(&mut Cursor::new(archive.finish()), CAP, &mut recorder).expect("clean archive");
        prop_assert_eq!(summary.rejected, 0);
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
        let result = capped_tar::read(&mut Cursor::new(&full[..cut]), CAP, &mut Recorder::default());
        prop_assert!(result.expect_err("partial").is_truncated());
    }
}
