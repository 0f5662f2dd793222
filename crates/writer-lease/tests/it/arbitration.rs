//! A model-based property test of writer arbitration between hosts ([`decide`]).
//!
//! Random interleavings of hosts acquiring, renewing, pushing (stage, then commit under the
//! generation check), releasing, pausing past their expiry, and of the keeper's clock moving.
//! The keeper applies the real rule to one record; each host keeps only what it was told
//! (its generation).
//!
//! Invariants: generations only grow; at most one host holds an unexpired grant; a commit
//! is applied only under the record's current generation, so after a takeover the old
//! holder's writes are all refused and change nothing; a fenced host demotes and writes
//! nothing more until it acquires again.

use proptest::prelude::*;
use writer_lease::{Generation, Holder, Request, Verdict, WriterRecord, decide};

const HOSTS: usize = 3;
const TERM: u64 = 60;

#[derive(Debug, Clone, Copy)]
enum Step {
    Acquire(usize),
    Renew(usize),
    /// Commit a staged write under the host's generation.
    Push(usize),
    Release(usize),
    /// The keeper's clock moves on (a paused host does nothing meanwhile).
    Tick(u64),
}

fn step() -> impl Strategy<Value = Step> {
    let host = 0..HOSTS;
    prop_oneof![
        host.clone().prop_map(Step::Acquire),
        host.clone().prop_map(Step::Renew),
        host.clone().prop_map(Step::Push),
        host.prop_map(Step::Release),
        (0..2 * TERM).prop_map(Step::Tick),
    ]
}

struct Keeper {
    record: Option<WriterRecord>,
    now: u64,
}

impl Keeper {
    fn ask(&mut self, holder: &Holder, request: Request) -> Verdict {
        let before = self.record.as_ref().map(|r| r.generation);
        let (record, verdict) = decide(self.record.as_ref(), holder, request, self.now, TERM);
        let after = record.as_ref().map(|r| r.generation);
        assert!(
            after >= before,
            "generations only grow: {before:?} -> {after:?}"
        );
        assert!(
            record.is_some() || before.is_none(),
            "a record is never deleted"
        );
        self.record = record;
        verdict
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn one_current_writer_and_every_stale_write_is_fenced(
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        // contract: C8, C10
        let holders: Vec<Holder> = (0..HOSTS)
            .map(|i| Holder::new(&format!("{i:02x}"), 100 + i as u32, "b007").expect("holder"))
            .collect();
        let mut keeper = Keeper { record: None, now: 1_000 };
        // Each host's belief: the generation it was granted, if it thinks it is the writer.
        let mut believed: [Option<Generation>; HOSTS] = [None; HOSTS];
        let mut highest = Generation::NONE;
        for step in steps {
            match step {
                Step::Tick(by) => keeper.now += by,
                Step::Acquire(h) => {
                    if believed[h].is_some() {
                        continue;
                    }
                    match keeper.ask(&holders[h], Request::Acquire) {
                        Verdict::Granted(record) => {
                            prop_assert!(record.generation > highest, "a grant raises the generation");
                            highest = record.generation;
                            prop_assert_eq!(&record.holder, &holders[h]);
                            believed[h] = Some(record.generation);
                        }
                        Verdict::Held(record) => {
                            prop_assert!(!record.expired(keeper.now), "only an unexpired grant holds");
                            prop_assert!(record.holder != holders[h]);
                        }
                        other => prop_assert!(false, "acquire answered {:?}", other),
                    }
                }
                Step::Renew(h) | Step::Push(h) | Step::Release(h) => {
                    let Some(generation) = believed[h] else { continue };
                    let request = match step {
                        Step::Renew(_) => Request::Renew(generation),
                        Step::Push(_) => Request::Commit(generation),
                        _ => Request::Release(generation),
                    };
                    let current = keeper.record.as_ref().map(|r| r.generation);
                    match keeper.ask(&holders[h], request) {
                        Verdict::Granted(record) => {
                            prop_assert_eq!(Some(generation), current, "granted only under the current generation");
                            prop_assert_eq!(record.expires_at, keeper.now + TERM);
                        }
                        Verdict::Released(record) => {
                            prop_assert_eq!(record.generation, generation);
                            prop_assert!(record.expired(keeper.now));
                            believed[h] = None;
                        }
                        Verdict::Fenced(record) => {
                            // Someone took over since: the host demotes; its staged write is
                            // never committed.
                            prop_assert!(current != Some(generation));
                            prop_assert!(record.is_some_and(|r| r.generation > generation));
                            believed[h] = None;
                        }
                        Verdict::Held(_) => prop_assert!(false, "only acquire is held"),
                    }
                }
            }
            // At most one host holds an unexpired grant, and it is the record's holder.
            let live: Vec<usize> = (0..HOSTS)
                .filter(|&h| {
                    keeper.record.as_ref().is_some_and(|r| {
                        believed[h] == Some(r.generation) && !r.expired(keeper.now)
                    })
                })
                .collect();
            prop_assert!(live.len() <= 1, "two live writers: {:?}", live);
        }
    }
}

#[test]
fn a_paused_writer_is_fenced_after_a_takeover_and_never_gets_a_last_push() {
    // contract: C10
    let a = Holder::new("aa", 1, "b007").expect("holder");
    let b = Holder::new("bb", 2, "b007").expect("holder");
    let mut keeper = Keeper {
        record: None,
        now: 0,
    };
    let Verdict::Granted(granted) = keeper.ask(&a, Request::Acquire) else {
        panic!("first acquire is granted");
    };
    // a pauses (laptop lid closed) past its expiry; b takes over and pushes.
    keeper.now += TERM;
    let Verdict::Granted(taken) = keeper.ask(&b, Request::Acquire) else {
        panic!("an expired grant is taken over");
    };
    assert!(matches!(
        keeper.ask(&b, Request::Commit(taken.generation)),
        Verdict::Granted(_)
    ));
    // a comes back: its renewal and its push are both refused, naming b.
    for request in [
        Request::Renew(granted.generation),
        Request::Commit(granted.generation),
    ] {
        match keeper.ask(&a, request) {
            Verdict::Fenced(Some(record)) => assert_eq!(record.holder, b),
            other => panic!("{request:?} answered {other:?}"),
        }
    }
}
