//! Property tests over generated archives: whatever the sandbox sends, the unsafe-member policy
//! and the teardown archive keep their promises.

use proptest::prelude::*;

use crate::support::harness::check_archive;
use crate::support::hostile_archive;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    // contract: X5
    #[test]
    fn member_rules_hold_for_any_archive(archive in hostile_archive()) {
        check_archive(&archive);
    }
}
