//! Property tests: digest injectivity, adoption safety, lease monotonicity.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use sandbox_identity::{
    Adoption, Candidate, Clock, IDENTITY_VERSION_KEY, IdentityMetadata, InternetAccess, LeaseKind,
    LeasePlan, LeasePolicy, LeaseTracker, MODE_KEY, ManualClock, Mode, SCOPE_KEY, SandboxState,
    ScopeIdentity, Security, choose,
};

/// Short strings over an alphabet dense in separators and multi-byte
/// characters, so generated pairs often collide or differ by one separator.
fn tricky_string() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just('a'),
            Just(':'),
            Just('/'),
            Just('\0'),
            Just('|'),
            Just('\u{e9}'),
            Just('\u{65e5}'),
            Just('\u{1f600}'),
            any::<char>(),
        ],
        0..6,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Persistent), Just(Mode::Ephemeral)]
}

fn internet() -> impl Strategy<Value = InternetAccess> {
    prop_oneof![Just(InternetAccess::Allowed), Just(InternetAccess::Denied)]
}

fn security() -> impl Strategy<Value = Security> {
    prop_oneof![Just(Security::Secure), Just(Security::Insecure)]
}

fn identity() -> impl Strategy<Value = ScopeIdentity> {
    (
        tricky_string(),
        tricky_string(),
        tricky_string(),
        mode(),
        internet(),
        security(),
    )
        .prop_map(
            |(profile_home, task_id, template, mode, internet, security)| ScopeIdentity {
                profile_home,
                task_id,
                template,
                mode,
                internet,
                security,
            },
        )
}

/// An independent parser of the documented encoding: if it recovers every
/// field, the encoding is injective.
fn decode(mut bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut fields = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes.split_at_checked(8)?;
        let len = usize::try_from(u64::from_be_bytes(len.try_into().ok()?)).ok()?;
        let (field, rest) = rest.split_at_checked(len)?;
        fields.push(field.to_vec());
        bytes = rest;
    }
    Some(fields)
}

fn tag_of_mode(mode: Mode) -> Vec<u8> {
    vec![if mode == Mode::Persistent { b'p' } else { b'e' }]
}

proptest! {
    // contract: I1
    #[test]
    fn encoding_decodes_back_to_exactly_the_inputs(scope in identity()) {
        let fields = decode(&scope.encode()).expect("well-formed encoding");
        prop_assert_eq!(fields.len(), 8);
        prop_assert_eq!(&fields[0], b"hermes-e2b/scope");
        prop_assert_eq!(&fields[1], &1u32.to_be_bytes());
        prop_assert_eq!(&fields[2], scope.profile_home.as_bytes());
        prop_assert_eq!(&fields[3], scope.task_id.as_bytes());
        prop_assert_eq!(&fields[4], scope.template.as_bytes());
        prop_assert_eq!(&fields[5], &tag_of_mode(scope.mode));
        let internet_tag = if scope.internet == InternetAccess::Allowed { b'a' } else { b'd' };
        prop_assert_eq!(&fields[6], &[internet_tag]);
        let security_tag = if scope.security == Security::Secure { b's' } else { b'i' };
        prop_assert_eq!(&fields[7], &[security_tag]);
    }

    // contract: I1
    #[test]
    fn digests_are_equal_exactly_when_identities_are(a in identity(), b in identity()) {
        prop_assert_eq!(a == b, a.digest() == b.digest(), "{:?} vs {:?}", a, b);
        prop_assert_eq!(a.digest(), a.clone().digest());
    }

    // contract: I1
    #[test]
    fn splitting_a_task_id_differently_changes_the_digest(
        home in tricky_string(),
        task in tricky_string(),
        cut in 0usize..8,
    ) {
        // Move a prefix of the task id onto the end of the profile home: the
        // concatenation is the same, the digest must not be.
        let split = task.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(task.len());
        prop_assume!(split > 0);
        let base = ScopeIdentity {
            profile_home: home.clone(),
            task_id: task.clone(),
            template: "base".to_owned(),
            mode: Mode::Persistent,
            internet: InternetAccess::Allowed,
            security: Security::Secure,
        };
        let shifted = ScopeIdentity {
            profile_home: format!("{home}{}", &task[..split]),
            task_id: task[split..].to_owned(),
            ..base.clone()
        };
        prop_assert_ne!(base.digest(), shifted.digest());
    }
}

/// How a generated candidate deviates from the wanted scope.
#[derive(Debug, Clone)]
enum Variation {
    Exact,
    OtherScope(ScopeIdentity),
    OtherMode,
    OtherTemplate,
    NoMetadata,
    WrongVersion,
    Dying,
}

fn variation() -> impl Strategy<Value = Variation> {
    prop_oneof![
        3 => Just(Variation::Exact),
        1 => identity().prop_map(Variation::OtherScope),
        1 => Just(Variation::OtherMode),
        1 => Just(Variation::OtherTemplate),
        1 => Just(Variation::NoMetadata),
        1 => Just(Variation::WrongVersion),
        1 => Just(Variation::Dying),
    ]
}

fn build(wanted: &ScopeIdentity, index: usize, started: u64, how: &Variation) -> Candidate {
    let mut candidate = Candidate {
        sandbox_id: format!("sbx{index}"),
        template_id: "tpl-id".to_owned(),
        template_alias: Some(wanted.template.clone()),
        metadata: IdentityMetadata::for_scope(wanted).to_map(),
        started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(started),
        state: if started.is_multiple_of(2) {
            SandboxState::Running
        } else {
            SandboxState::Paused
        },
    };
    candidate
        .metadata
        .insert("team".to_owned(), "infra".to_owned());
    match how {
        Variation::Exact => {}
        Variation::OtherScope(other) => {
            candidate
                .metadata
                .extend(IdentityMetadata::for_scope(other).to_map());
        }
        Variation::OtherMode => {
            let flipped = if wanted.mode == Mode::Persistent {
                "ephemeral"
            } else {
                "persistent"
            };
            candidate
                .metadata
                .insert(MODE_KEY.to_owned(), flipped.to_owned());
        }
        Variation::OtherTemplate => {
            candidate.template_alias = Some(format!("{}-other", wanted.template));
        }
        Variation::NoMetadata => candidate.metadata.clear(),
        Variation::WrongVersion => {
            candidate
                .metadata
                .insert(IDENTITY_VERSION_KEY.to_owned(), "0".to_owned());
        }
        Variation::Dying => candidate.state = SandboxState::Other,
    }
    candidate
}

/// The adoption rule, written independently of the crate.
fn acceptable(wanted: &ScopeIdentity, candidate: &Candidate) -> bool {
    let meta = &candidate.metadata;
    meta.get(SCOPE_KEY) == Some(&wanted.digest().to_hex())
        && meta.get(IDENTITY_VERSION_KEY).map(String::as_str) == Some("1")
        && meta.get(MODE_KEY).map(String::as_str) == Some(wanted.mode.as_str())
        && (candidate.template_id == wanted.template
            || candidate.template_alias.as_ref() == Some(&wanted.template))
        && matches!(
            candidate.state,
            SandboxState::Running | SandboxState::Paused
        )
}

proptest! {
    // contract: I3, I5, L4
    #[test]
    fn adoption_never_picks_a_mismatch(
        wanted in identity(),
        list in proptest::collection::vec((variation(), 0u64..6), 0..8),
    ) {
        let candidates: Vec<Candidate> = list
            .iter()
            .enumerate()
            .map(|(i, (how, started))| build(&wanted, i, *started, how))
            .collect();
        let good: Vec<&Candidate> =
            candidates.iter().filter(|c| acceptable(&wanted, c)).collect();
        let rejected = candidates.len() - good.len();
        match choose(&wanted, &candidates) {
            Adoption::NeverAdopt => prop_assert_eq!(wanted.mode, Mode::Ephemeral),
            Adoption::Create { rejected: r } => {
                prop_assert_eq!(wanted.mode, Mode::Persistent);
                prop_assert!(good.is_empty());
                prop_assert_eq!(r, rejected);
            }
            Adoption::Adopt { candidate, duplicates, rejected: r } => {
                prop_assert_eq!(wanted.mode, Mode::Persistent);
                prop_assert!(acceptable(&wanted, candidate), "adopted a mismatch: {:?}", candidate);
                let newest = good.iter().map(|c| c.started_at).max();
                prop_assert_eq!(Some(candidate.started_at), newest);
                prop_assert_eq!(duplicates, good.len() - 1);
                prop_assert_eq!(r, rejected);
            }
        }
    }
}

#[derive(Debug, Clone)]
enum LeaseStep {
    Advance(u64),
    Command {
        timeout: u64,
        grace: u64,
        lease: u64,
    },
    LateShortConfirm(u64),
}

fn lease_step() -> impl Strategy<Value = LeaseStep> {
    prop_oneof![
        (0u64..400).prop_map(LeaseStep::Advance),
        (0u64..900, 0u64..60, 60u64..600).prop_map(|(timeout, grace, lease)| LeaseStep::Command {
            timeout,
            grace,
            lease
        }),
        (0u64..100).prop_map(LeaseStep::LateShortConfirm),
    ]
}

proptest! {
    // contract: L5
    #[test]
    fn lease_extension_is_monotonic_and_covers_every_admitted_command(
        steps in proptest::collection::vec(lease_step(), 1..40),
    ) {
        let clock = ManualClock::new();
        let mut tracker = LeaseTracker::new();
        let mut stale: Vec<sandbox_identity::ExtensionRequest> = Vec::new();
        for step in steps {
            let before = tracker.covered_until();
            match step {
                LeaseStep::Advance(secs) => clock.advance(Duration::from_secs(secs)),
                LeaseStep::Command { timeout, grace, lease } => {
                    let policy = LeasePolicy {
                        lease: Duration::from_secs(lease),
                        command_grace: Duration::from_secs(grace),
                        kind: LeaseKind::Persistent,
                    };
                    let needed = policy.command_lease(Duration::from_secs(timeout));
                    prop_assert!(needed >= policy.lease);
                    prop_assert!(needed >= Duration::from_secs(timeout + grace));
                    match tracker.plan(&clock, needed) {
                        LeasePlan::Covered => {}
                        LeasePlan::Extend(request) => {
                            prop_assert!(request.timeout_secs() >= needed.as_secs());
                            tracker.confirm(&request);
                            stale.push(request);
                        }
                    }
                    // Whatever happened, the command is now covered.
                    prop_assert!(tracker.covers(clock.now(), needed));
                }
                LeaseStep::LateShortConfirm(index) => {
                    // A confirmation of an older request arriving late.
                    if !stale.is_empty() {
                        let old = stale[usize::try_from(index).unwrap_or(0) % stale.len()];
                        tracker.confirm(&old);
                    }
                }
            }
            if let Some(before) = before {
                prop_assert!(tracker.covered_until().is_some_and(|after| after >= before));
            }
        }
    }
}

#[test]
fn generated_strings_cover_separators_and_unicode() {
    // Guards the generator itself: the injectivity properties above are only
    // meaningful if the alphabet really contains these characters.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen = BTreeMap::new();
    for _ in 0..500 {
        let value = tricky_string()
            .new_tree(&mut runner)
            .expect("tree")
            .current();
        for c in value.chars() {
            *seen.entry(c).or_insert(0u32) += 1;
        }
    }
    for c in ['\0', ':', '/', '\u{e9}', '\u{1f600}'] {
        assert!(seen.contains_key(&c), "generator never produced {c:?}");
    }
}
