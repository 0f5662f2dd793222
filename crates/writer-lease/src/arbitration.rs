//! Writer arbitration between hosts: the interface, the compare-and-set rule a shared record
//! follows, and the host-file implementation (one host's processes).
//!
//! The host lock ([`ScopeFiles::try_acquire_writer`]) arbitrates the processes of one host.
//! Several hosts serving one profile need a record they all reach; whoever keeps it (the
//! sandbox, in agent-sandbox) applies [`decide`] to it atomically. The rule knows nothing of
//! where the record lives: it is a pure function of the record, the request and the keeper's
//! clock, so the keeper's clock alone decides expiry and host clocks never do.

use std::fmt;

use crate::error::Error;
use crate::records::Generation;
use crate::scope::ScopeFiles;
use crate::writer::{Role, WriterLease};

/// Longest host id, boot id or record line accepted, so a record is bounded.
pub const MAX_RECORD_LINE: usize = 256;

/// Who asks for the writer role: a random host id kept in the profile's host state, the
/// process id and the host's boot id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holder {
    host: String,
    pid: u32,
    boot: String,
}

fn valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 64
        && token
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase() || b == b'-')
}

impl Holder {
    /// A holder; `None` unless `host` and `boot` are 1 to 64 lowercase hex digits or dashes
    /// (what the record format can carry unambiguously).
    pub fn new(host: &str, pid: u32, boot: &str) -> Option<Holder> {
        (valid_token(host) && valid_token(boot)).then(|| Holder {
            host: host.to_owned(),
            pid,
            boot: boot.to_owned(),
        })
    }

    /// The random host id.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The boot id.
    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// Same host and same boot: the host lock this caller holds proves the previous process
    /// of that holder is gone, so its record needs no expiry wait.
    pub fn same_machine(&self, other: &Holder) -> bool {
        self.host == other.host && self.boot == other.boot
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host {} pid {} boot {}", self.host, self.pid, self.boot)
    }
}

/// The shared writer record: who holds the role, under which generation (the fencing token,
/// which only grows), until when on the keeper's clock (seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterRecord {
    /// The fencing token of the current (or last) grant.
    pub generation: Generation,
    /// Keeper-clock second at which the grant lapses unless renewed.
    pub expires_at: u64,
    /// Who holds (or last held) it.
    pub holder: Holder,
}

impl WriterRecord {
    /// The record's one line: `v1 <generation> <expires_at> <host> <pid> <boot>`.
    pub fn encode(&self) -> String {
        format!(
            "v1 {} {} {} {} {}",
            self.generation.get(),
            self.expires_at,
            self.holder.host,
            self.holder.pid,
            self.holder.boot
        )
    }

    /// Parses [`encode`](Self::encode)'s line exactly (no trailing newline); `None` for
    /// anything else.
    pub fn parse(line: &str) -> Option<WriterRecord> {
        if line.len() > MAX_RECORD_LINE {
            return None;
        }
        let mut words = line.split(' ');
        let (Some("v1"), Some(generation), Some(expires), Some(host), Some(pid), Some(boot), None) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            return None;
        };
        Some(WriterRecord {
            generation: Generation::new(parse_number(generation)?),
            expires_at: parse_number(expires)?,
            holder: Holder::new(host, u32::try_from(parse_number(pid)?).ok()?, boot)?,
        })
    }

    /// Whether the grant lapsed at keeper-clock second `now`.
    pub fn expired(&self, now: u64) -> bool {
        now >= self.expires_at
    }
}

/// A decimal number without sign, leading zeros (except `0`) or spaces.
pub(crate) fn parse_number(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.len() <= 20
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

/// What a host asks of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Take the role: granted with generation + 1 when the record is absent, expired, or
    /// held by this same machine (whose host lock the caller holds).
    Acquire,
    /// Extend the grant of `generation`; only its holder may, expired or not, as long as
    /// nobody took over.
    Renew(Generation),
    /// Commit staged writes under `generation`: the same check as [`Request::Renew`], which
    /// it also performs.
    Commit(Generation),
    /// Give the grant of `generation` up: it expires now, and the generation stays.
    Release(Generation),
}

/// The record keeper's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The caller holds the role under this record (acquire, renew, commit).
    Granted(WriterRecord),
    /// Someone else holds it until `expires_at`: stay a reader.
    Held(WriterRecord),
    /// The caller's generation is no longer current (someone took over, or there is no
    /// record at all): it must stop writing, demote itself and mark the scope dirty.
    Fenced(Option<WriterRecord>),
    /// The grant was given up.
    Released(WriterRecord),
}

/// The compare-and-set rule: the record after `request` by `holder` at keeper-clock second
/// `now`, and the answer. `term` is how long a grant or renewal lasts, in seconds.
///
/// The keeper runs this atomically (under a lock) and stores the returned record when it
/// differs. A grant always has a generation above every earlier one; a renewal, commit or
/// release succeeds only for the record's holder under the record's generation.
pub fn decide(
    current: Option<&WriterRecord>,
    holder: &Holder,
    request: Request,
    now: u64,
    term: u64,
) -> (Option<WriterRecord>, Verdict) {
    let grant = |generation: Generation| WriterRecord {
        generation,
        expires_at: now.saturating_add(term),
        holder: holder.clone(),
    };
    match (request, current) {
        (Request::Acquire, None) => {
            let record = grant(Generation::NONE.next());
            (Some(record.clone()), Verdict::Granted(record))
        }
        (Request::Acquire, Some(record)) => {
            if record.expired(now) || record.holder.same_machine(holder) {
                let next = grant(record.generation.next());
                (Some(next.clone()), Verdict::Granted(next))
            } else {
                (Some(record.clone()), Verdict::Held(record.clone()))
            }
        }
        (
            Request::Renew(generation) | Request::Commit(generation) | Request::Release(generation),
            Some(record),
        ) if record.generation == generation && record.holder == *holder => {
            if matches!(request, Request::Release(_)) {
                let released = WriterRecord {
                    expires_at: now.min(record.expires_at),
                    ..record.clone()
                };
                (Some(released.clone()), Verdict::Released(released))
            } else {
                let renewed = grant(generation);
                (Some(renewed.clone()), Verdict::Granted(renewed))
            }
        }
        (_, current) => (current.cloned(), Verdict::Fenced(current.cloned())),
    }
}

/// Writer arbitration: how a session takes, keeps and gives up the writer role of a scope,
/// and checks that its generation is still the current one.
///
/// [`HostFileArbitration`] is the one-host implementation over the host lock; agent-sandbox
/// implements it with a record inside the sandbox, reaching every host that serves the
/// profile.
pub trait Arbitration {
    /// What a failing keeper reports.
    type Error;

    /// Tries to take the role.
    fn acquire(&mut self) -> Result<Verdict, Self::Error>;
    /// Extends the grant of `generation`.
    fn renew(&mut self, generation: Generation) -> Result<Verdict, Self::Error>;
    /// Gives the grant of `generation` up.
    fn release(&mut self, generation: Generation) -> Result<Verdict, Self::Error>;
    /// Whether `generation` is still the current grant.
    fn is_current(&mut self, generation: Generation) -> Result<bool, Self::Error>;
}

/// Today's one-host arbitration: the exclusive host lock is the grant and the generation file
/// is the fencing token. The operating system releases the lock when the process dies, so a
/// grant never needs renewing and never expires ([`WriterRecord::expires_at`] is `u64::MAX`).
#[derive(Debug)]
pub struct HostFileArbitration {
    files: ScopeFiles,
    holder: Holder,
    lease: Option<WriterLease>,
}

impl HostFileArbitration {
    /// Arbitration among `holder`'s processes through `files`.
    pub fn new(files: ScopeFiles, holder: Holder) -> HostFileArbitration {
        HostFileArbitration {
            files,
            holder,
            lease: None,
        }
    }

    /// The lease taken by the last granted [`acquire`](Arbitration::acquire), for the writer
    /// protocol (markers, stamps).
    pub fn lease(&mut self) -> Option<&mut WriterLease> {
        self.lease.as_mut()
    }

    fn record(&self, generation: Generation) -> WriterRecord {
        WriterRecord {
            generation,
            expires_at: u64::MAX,
            holder: self.holder.clone(),
        }
    }

    fn current(&self, generation: Generation) -> Result<bool, Error> {
        Ok(self.lease.is_some() && self.files.generation()? == generation)
    }
}

impl Arbitration for HostFileArbitration {
    type Error = Error;

    fn acquire(&mut self) -> Result<Verdict, Error> {
        if let Some(lease) = &self.lease {
            return Ok(Verdict::Granted(self.record(lease.generation())));
        }
        match self.files.try_acquire_writer()? {
            Role::Writer(mut lease) => {
                let generation = lease.begin_transition()?;
                self.lease = Some(lease);
                Ok(Verdict::Granted(self.record(generation)))
            }
            Role::Reader => {
                // The holder is another process of this host; the lock does not say which.
                Ok(Verdict::Held(WriterRecord {
                    generation: self.files.generation()?,
                    expires_at: u64::MAX,
                    holder: self.holder.clone(),
                }))
            }
        }
    }

    fn renew(&mut self, generation: Generation) -> Result<Verdict, Error> {
        if self.current(generation)? {
            Ok(Verdict::Granted(self.record(generation)))
        } else {
            Ok(Verdict::Fenced(None))
        }
    }

    fn release(&mut self, generation: Generation) -> Result<Verdict, Error> {
        if !self.current(generation)? {
            return Ok(Verdict::Fenced(None));
        }
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
        Ok(Verdict::Released(self.record(generation)))
    }

    fn is_current(&mut self, generation: Generation) -> Result<bool, Error> {
        self.current(generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ScopeKey;

    fn holder(host: &str, pid: u32) -> Holder {
        Holder::new(host, pid, "b007").expect("valid holder")
    }

    #[test]
    fn records_round_trip_and_anything_else_is_refused() {
        let record = WriterRecord {
            generation: Generation::new(7),
            expires_at: 1_700_000_060,
            holder: holder("ab12", 42),
        };
        assert_eq!(WriterRecord::parse(&record.encode()), Some(record.clone()));
        for bad in [
            "",
            "v1 7 1700000060 ab12 42",
            "v1 7 1700000060 ab12 42 b007 extra",
            "v2 7 1700000060 ab12 42 b007",
            "v1 07 1700000060 ab12 42 b007",
            "v1 -7 1700000060 ab12 42 b007",
            "v1 7 1700000060 AB12 42 b007",
            "v1 7 1700000060 ab12 99999999999 b007",
            "v1 7 1700000060 ab12 42 b007\n",
            "v1 7  1700000060 ab12 42 b007",
        ] {
            assert_eq!(WriterRecord::parse(bad), None, "{bad:?}");
        }
        assert!(Holder::new("a b", 1, "b").is_none());
        assert!(Holder::new(&"a".repeat(65), 1, "b").is_none());
    }

    #[test]
    fn the_rule_grants_holds_fences_and_only_ever_raises_the_generation() {
        let (a, b) = (holder("aa", 1), holder("bb", 2));
        let (record, verdict) = decide(None, &a, Request::Acquire, 100, 60);
        assert!(
            matches!(&verdict, Verdict::Granted(r) if r.generation.get() == 1 && r.expires_at == 160)
        );
        let record = record.expect("stored");
        // Held until the keeper's clock passes the expiry.
        let (_, verdict) = decide(Some(&record), &b, Request::Acquire, 159, 60);
        assert!(matches!(verdict, Verdict::Held(ref r) if r.holder == a));
        // A renewal by the holder extends; by anyone else it is fenced.
        let (renewed, verdict) = decide(
            Some(&record),
            &a,
            Request::Renew(Generation::new(1)),
            150,
            60,
        );
        assert!(matches!(verdict, Verdict::Granted(ref r) if r.expires_at == 210));
        let renewed = renewed.expect("stored");
        let (_, verdict) = decide(
            Some(&renewed),
            &b,
            Request::Commit(Generation::new(1)),
            150,
            60,
        );
        assert!(matches!(verdict, Verdict::Fenced(_)));
        // Expired: b takes over with generation 2, and a's late commit is fenced.
        let (taken, verdict) = decide(Some(&renewed), &b, Request::Acquire, 210, 60);
        assert!(matches!(verdict, Verdict::Granted(ref r) if r.generation.get() == 2));
        let taken = taken.expect("stored");
        let (_, verdict) = decide(
            Some(&taken),
            &a,
            Request::Commit(Generation::new(1)),
            211,
            60,
        );
        assert!(matches!(verdict, Verdict::Fenced(Some(ref r)) if r.holder == b));
        // The same machine (another pid, same host and boot) re-acquires without waiting.
        let b2 = holder("bb", 3);
        let (_, verdict) = decide(Some(&taken), &b2, Request::Acquire, 212, 60);
        assert!(matches!(verdict, Verdict::Granted(ref r) if r.generation.get() == 3));
        // Release keeps the generation and lets anyone take over at once.
        let (released, verdict) = decide(
            Some(&taken),
            &b,
            Request::Release(Generation::new(2)),
            220,
            60,
        );
        assert!(matches!(verdict, Verdict::Released(_)));
        let (_, verdict) = decide(released.as_ref(), &a, Request::Acquire, 220, 60);
        assert!(matches!(verdict, Verdict::Granted(ref r) if r.generation.get() == 3));
        // No record: nothing to renew.
        let (stored, verdict) = decide(None, &a, Request::Renew(Generation::new(1)), 0, 60);
        assert_eq!((stored, verdict), (None, Verdict::Fenced(None)));
    }

    #[test]
    fn host_files_arbitrate_one_hosts_processes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = ScopeKey::from_bytes([3; 32]);
        let files = || ScopeFiles::new(dir.path().to_path_buf(), key);
        let mut a = HostFileArbitration::new(files(), holder("aa", 1));
        let mut b = HostFileArbitration::new(files(), holder("aa", 2));
        let Verdict::Granted(granted) = a.acquire().expect("acquire") else {
            panic!("the first process is granted");
        };
        assert!(a.lease().is_some());
        assert!(matches!(b.acquire().expect("acquire"), Verdict::Held(_)));
        assert!(a.is_current(granted.generation).expect("check"));
        assert!(matches!(
            a.renew(granted.generation).expect("renew"),
            Verdict::Granted(_)
        ));
        assert!(matches!(
            a.release(granted.generation).expect("release"),
            Verdict::Released(_)
        ));
        let Verdict::Granted(next) = b.acquire().expect("acquire") else {
            panic!("the role is free after the release");
        };
        assert!(next.generation > granted.generation);
        assert!(!a.is_current(granted.generation).expect("check"));
        assert!(matches!(
            a.renew(granted.generation).expect("renew"),
            Verdict::Fenced(_)
        ));
    }
}
