//! Writer arbitration held by the sandbox (`writer_arbitration: sandbox`): several hosts
//! serving one profile agree on one writer through a record inside the sandbox they share.
//!
//! The record is `<remote home>.writer/record`, beside the Hermes home and outside the synced
//! state. Only [`script`] changes it: one Process/Start that takes `flock(1)` on the record's
//! directory, reads the sandbox's clock (`date +%s`), applies writer-lease's [`decide`] rule
//! (the shell mirrors it; `script_and_rule_agree` holds them together) and prints one answer
//! line. A commit also applies the writer's staged uploads and deletes, after the generation
//! check and under the same lock, so a stale writer's state never reaches the state root.
//!
//! [`decide`]: writer_lease::decide

use std::path::Path;
use std::time::Duration;

use e2b_client::{Sandbox, StartOptions};
use state_sync::shell_quote;
use writer_lease::{Arbitration, Generation, Holder, MAX_RECORD_LINE, Verdict, WriterRecord};

use crate::error::Error;

/// The default grant: a writer that sends nothing for this long can be taken over. A grant is
/// renewed when a command finds it older than a third of this, so an active writer costs at
/// most one extra request per [`renewal_period`] and an idle one costs none.
pub const DEFAULT_WRITER_TERM: Duration = Duration::from_secs(180);

/// How much of the answer is read: one line of a few dozen bytes.
pub(crate) const ANSWER_LIMIT: u64 = 1024;

/// How long the script waits for the record's lock (another host's script holds it only while
/// it decides and commits).
const LOCK_WAIT_SECONDS: u64 = 60;

/// After how long a grant is renewed by the next command: a third of the term, so two
/// renewals can fail before the grant lapses.
pub fn renewal_period(term: Duration) -> Duration {
    term / 3
}

/// The record's directory for a Hermes home: a dot-directory beside it.
pub(crate) fn record_dir(remote_home: &str) -> String {
    format!("{}.writer", remote_home.trim_end_matches('/'))
}

/// Where a writer stages its uploads under `generation`.
pub(crate) fn staging_dir(remote_home: &str, generation: Generation) -> String {
    format!("{}/staging/{}", record_dir(remote_home), generation.get())
}

/// What the script is asked to do.
#[derive(Debug, Clone)]
pub(crate) enum Ask {
    Acquire,
    Renew(Generation),
    /// Commit under `generation`: run `deletes` (shell commands), then move the staging
    /// directory's files into the state root; also renews.
    Commit {
        generation: Generation,
        deletes: Vec<String>,
    },
    Release(Generation),
}

impl Ask {
    fn word(&self) -> &'static str {
        match self {
            Ask::Acquire => "acquire",
            Ask::Renew(_) => "renew",
            Ask::Commit { .. } => "commit",
            Ask::Release(_) => "release",
        }
    }

    fn generation(&self) -> u64 {
        match self {
            Ask::Acquire => 0,
            Ask::Renew(g) | Ask::Release(g) | Ask::Commit { generation: g, .. } => g.get(),
        }
    }

    pub(crate) fn operation(&self) -> &'static str {
        match self {
            Ask::Acquire => "acquire sandbox writer record",
            Ask::Renew(_) => "renew sandbox writer record",
            Ask::Commit { .. } => "commit staged state",
            Ask::Release(_) => "release sandbox writer record",
        }
    }
}

/// The compare-and-set script: everything between taking and dropping the lock runs in one
/// shell. Its answer is one line: `arb <verdict> <now> <record>` with the record as
/// writer-lease encodes it, `arb fenced <now> none` when there is no record, or
/// `arb error <reason>`.
pub(crate) fn script(remote_home: &str, holder: &Holder, term: Duration, ask: &Ask) -> String {
    compose(remote_home, holder, term, ask, "")
}

/// The acquire script followed, only when it granted, by `then` in the same shell with the
/// lock dropped: the bring-up's snapshot rides on the acquire's Process/Start. Its standard
/// output is the answer line, then (granted) what `then` prints; held or fenced, the line
/// alone.
pub(crate) fn acquire_then(
    remote_home: &str,
    holder: &Holder,
    term: Duration,
    then: &str,
) -> String {
    let then = format!("  exec 9>&-; set +f\n  {then}\n");
    compose(remote_home, holder, term, &Ask::Acquire, &then)
}

fn compose(remote_home: &str, holder: &Holder, term: Duration, ask: &Ask, then: &str) -> String {
    let dir = record_dir(remote_home);
    let commit = match ask {
        Ask::Commit {
            generation,
            deletes,
        } => {
            let stage = shell_quote(&staging_dir(remote_home, *generation));
            let mut body = String::new();
            for delete in deletes {
                body.push_str(delete);
                body.push_str(" || fail delete\n");
            }
            body.push_str(&format!(
                "if [ -d {stage} ]; then mkdir -p {home} && cp -a {stage}/. {home}/ && rm -rf {stage} || fail commit; fi\n\
                 set +f; for x in \"$d\"/staging/*; do [ \"$x\" = {stage} ] || rm -rf \"$x\"; done; set -f\n",
                home = shell_quote(remote_home),
            ));
            body
        }
        _ => String::new(),
    };
    format!(
        r#"set -f
fail() {{ printf 'arb error %s\n' "$1"; exit 0; }}
d={dir}
mkdir -p "$d" && exec 9>>"$d/lock" || fail lock
flock -w {wait} 9 || fail lock
now=$(date +%s)
req={req}; g={generation}; mh={host}; mp={pid}; mb={boot}; term={term}
has=0
if [ -f "$d/record" ]; then
  set -- $(head -c {max} "$d/record")
  [ "$#" -eq 6 ] && [ "$1" = v1 ] || fail corrupt
  case "$2$3$5" in ''|*[!0-9]*) fail corrupt;; esac
  cg=$2; ce=$3; ch=$4; cp=$5; cb=$6; has=1
fi
answer() {{ printf 'arb %s %s v1 %s %s %s %s %s\n' "$1" "$now" "$2" "$3" "$4" "$5" "$6"; }}
store() {{ printf 'v1 %s %s %s %s %s' "$1" "$2" "$mh" "$mp" "$mb" > "$d/record.tmp" && mv -f "$d/record.tmp" "$d/record" || fail store; }}
if [ "$req" = acquire ]; then
  if [ $has = 0 ]; then ng=1
  elif [ "$now" -ge "$ce" ] || {{ [ "$ch" = "$mh" ] && [ "$cb" = "$mb" ]; }}; then ng=$((cg + 1))
  else answer held "$cg" "$ce" "$ch" "$cp" "$cb"; exit 0; fi
  ne=$((now + term)); store "$ng" "$ne"; answer granted "$ng" "$ne" "$mh" "$mp" "$mb"
{then}  exit 0
fi
if [ $has = 1 ] && [ "$cg" = "$g" ] && [ "$ch" = "$mh" ] && [ "$cp" = "$mp" ] && [ "$cb" = "$mb" ]; then
  if [ "$req" = release ]; then
    ne=$ce; [ "$now" -lt "$ce" ] && ne=$now
    store "$cg" "$ne"; answer released "$cg" "$ne" "$mh" "$mp" "$mb"; exit 0
  fi
{commit}  ne=$((now + term)); store "$cg" "$ne"; answer granted "$cg" "$ne" "$mh" "$mp" "$mb"; exit 0
fi
if [ $has = 1 ]; then answer fenced "$cg" "$ce" "$ch" "$cp" "$cb"; else printf 'arb fenced %s none\n' "$now"; fi
"#,
        dir = shell_quote(&dir),
        wait = LOCK_WAIT_SECONDS,
        req = ask.word(),
        generation = ask.generation(),
        host = holder.host(),
        pid = holder.pid(),
        boot = holder.boot(),
        term = term.as_secs().max(1),
        max = MAX_RECORD_LINE,
    )
}

/// Parses the script's answer strictly: exactly one line in the format [`script`] prints;
/// anything else is an error naming the operation and the sandbox (the sandbox is not
/// trusted).
pub(crate) fn parse_answer(
    operation: &'static str,
    sandbox_id: &str,
    stdout: &[u8],
) -> Result<(Verdict, u64), Error> {
    let bad = |detail: &str| Error::Arbitration {
        operation,
        sandbox_id: sandbox_id.to_owned(),
        detail: detail.to_owned(),
    };
    let text = std::str::from_utf8(stdout).map_err(|_| bad("the answer is not UTF-8"))?;
    let line = text
        .strip_suffix('\n')
        .filter(|line| !line.contains('\n') && line.len() <= 2 * MAX_RECORD_LINE)
        .ok_or_else(|| bad("the answer is not exactly one line"))?;
    let rest = line
        .strip_prefix("arb ")
        .ok_or_else(|| bad("the answer does not start with `arb`"))?;
    if let Some(reason) = rest.strip_prefix("error ") {
        let reason = match reason {
            "lock" | "corrupt" | "store" | "delete" | "commit" => reason,
            _ => "an unknown reason",
        };
        return Err(bad(&format!("the sandbox script failed: {reason}")));
    }
    let (verdict, rest) = rest.split_once(' ').ok_or_else(|| bad("no verdict"))?;
    let (now, record) = rest.split_once(' ').ok_or_else(|| bad("no sandbox time"))?;
    let now = parse_seconds(now).ok_or_else(|| bad("the sandbox time is not a number"))?;
    if verdict == "fenced" && record == "none" {
        return Ok((Verdict::Fenced(None), now));
    }
    let record = WriterRecord::parse(record).ok_or_else(|| bad("the record is malformed"))?;
    let verdict = match verdict {
        "granted" => Verdict::Granted(record),
        "held" => Verdict::Held(record),
        "fenced" => Verdict::Fenced(Some(record)),
        "released" => Verdict::Released(record),
        _ => return Err(bad("unknown verdict")),
    };
    Ok((verdict, now))
}

fn parse_seconds(text: &str) -> Option<u64> {
    (!text.is_empty() && text.len() <= 20 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// This host's holder identity: a random host id kept in `state_dir/host-id` (created on
/// first use, 0600), this process's id, and the host's boot id.
pub(crate) fn load_holder(state_dir: &Path) -> Result<Holder, Error> {
    let path = state_dir.join("host-id");
    let io = |operation: &'static str, source| Error::Io {
        operation,
        path: path.clone(),
        source,
    };
    let host = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().to_owned(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 16];
            let mut random = std::fs::File::open("/dev/urandom")
                .map_err(|source| io("read random host id", source))?;
            std::io::Read::read_exact(&mut random, &mut bytes)
                .map_err(|source| io("read random host id", source))?;
            let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            write_private(&path, &id).map_err(|source| io("write host id", source))?;
            id
        }
        Err(source) => return Err(io("read host id", source)),
    };
    // Without a boot id (not Linux), every boot looks alike: a restarted process then
    // re-acquires at once, as the host lock already proves the previous one gone.
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|text| text.trim().to_owned())
        .unwrap_or_else(|_| "0".to_owned());
    Holder::new(&host, std::process::id(), &boot).ok_or_else(|| Error::InvalidConfig {
        reason: format!(
            "the host id in {} is not 1 to 64 lowercase hex digits",
            path.display()
        ),
    })
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    std::io::Write::write_all(&mut options.open(path)?, text.as_bytes())
}

/// The sandbox-held arbitration for one call site: the record of `remote_home` in `sandbox`.
pub(crate) struct SandboxArbitration<'a> {
    pub(crate) runtime: &'a tokio::runtime::Handle,
    pub(crate) sandbox: &'a Sandbox,
    pub(crate) remote_home: &'a str,
    pub(crate) holder: &'a Holder,
    pub(crate) term: Duration,
}

impl SandboxArbitration<'_> {
    /// Runs the script for `ask` in one Process/Start and parses its answer: the verdict and
    /// the sandbox's clock (seconds) when it was given.
    pub(crate) fn ask(&self, ask: &Ask) -> Result<(Verdict, u64), Error> {
        let operation = ask.operation();
        let id = self.sandbox.id().as_str().to_owned();
        let script = script(self.remote_home, self.holder, self.term, ask);
        let output = self
            .runtime
            .block_on(self.sandbox.run(StartOptions::shell(script), ANSWER_LIMIT))
            .map_err(|source| Error::e2b(operation, Some(&id), source))?;
        if output.end.exit_code != 0 {
            return Err(Error::SandboxCommand {
                operation,
                sandbox_id: id,
                exit_code: output.end.exit_code,
                stderr: String::from_utf8_lossy(&output.stderr[..output.stderr.len().min(512)])
                    .into_owned(),
            });
        }
        parse_answer(operation, &id, &output.stdout)
    }
}

impl Arbitration for SandboxArbitration<'_> {
    type Error = Error;

    fn acquire(&mut self) -> Result<Verdict, Error> {
        self.ask(&Ask::Acquire).map(|(verdict, _)| verdict)
    }

    fn renew(&mut self, generation: Generation) -> Result<Verdict, Error> {
        self.ask(&Ask::Renew(generation))
            .map(|(verdict, _)| verdict)
    }

    fn release(&mut self, generation: Generation) -> Result<Verdict, Error> {
        self.ask(&Ask::Release(generation))
            .map(|(verdict, _)| verdict)
    }

    fn is_current(&mut self, generation: Generation) -> Result<bool, Error> {
        Ok(matches!(self.renew(generation)?, Verdict::Granted(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use writer_lease::{Request, decide};

    fn holder(host: &str, pid: u32) -> Holder {
        Holder::new(host, pid, "b007").expect("holder")
    }

    /// Runs the script with a local `sh` in `home`'s parent (flock(1) and coreutils, as in
    /// the sandbox) and parses its answer.
    fn run_local(home: &str, holder: &Holder, term: u64, ask: &Ask) -> (Verdict, u64) {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script(home, holder, Duration::from_secs(term), ask))
            .output()
            .expect("sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_answer("test", "sbx", &out.stdout).expect("a well-formed answer")
    }

    /// Runs the acquire with the snapshot riding on it: the answer line, then a tar of the
    /// state only when granted.
    fn run_acquire_then_snapshot(home: &str, holder: &Holder, term: u64) -> (Verdict, u64) {
        let snapshot = recovery::snapshot_command(home).expect("snapshot command");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(acquire_then(
                home,
                holder,
                Duration::from_secs(term),
                &snapshot,
            ))
            .output()
            .expect("sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let split = out.stdout.iter().position(|&b| b == b'\n').expect("a line") + 1;
        let (line, tail) = out.stdout.split_at(split);
        let answer = parse_answer("test", "sbx", line).expect("a well-formed answer");
        if matches!(answer.0, Verdict::Granted(_)) {
            let names: Vec<String> = tar::Archive::new(tail)
                .entries()
                .expect("a tar")
                .map(|entry| {
                    let entry = entry.expect("a member");
                    entry.path().expect("a name").to_string_lossy().into_owned()
                })
                .collect();
            assert!(names.iter().any(|n| n == "skills/s.md"), "{names:?}");
        } else {
            assert!(
                tail.is_empty(),
                "refused, yet {} bytes followed",
                tail.len()
            );
        }
        answer
    }

    fn as_request(ask: &Ask) -> Request {
        match ask {
            Ask::Acquire => Request::Acquire,
            Ask::Renew(g) => Request::Renew(*g),
            Ask::Commit { generation, .. } => Request::Commit(*generation),
            Ask::Release(g) => Request::Release(*g),
        }
    }

    #[test]
    fn script_and_rule_agree() {
        // contract: C8 — the script in the sandbox implements writer-lease's rule.
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join(".hermes");
        let home = home.to_str().expect("utf-8");
        let record = Path::new(&record_dir(home)).join("record");
        let (a, b, a2) = (holder("aa", 1), holder("bb", 2), holder("aa", 3));
        let g = Generation::new;
        let steps: Vec<(&Holder, Ask, u64)> = vec![
            (&a, Ask::Acquire, 100),
            (&b, Ask::Acquire, 100),
            (&a, Ask::Renew(g(1)), 100),
            (&b, Ask::Renew(g(1)), 100),
            (
                &b,
                Ask::Commit {
                    generation: g(1),
                    deletes: vec![],
                },
                100,
            ),
            (&a2, Ask::Acquire, 100),
            (&a, Ask::Renew(g(2)), 100),
            (&a2, Ask::Release(g(2)), 100),
            (&b, Ask::Acquire, 100),
            (
                &a,
                Ask::Commit {
                    generation: g(2),
                    deletes: vec![],
                },
                100,
            ),
            (&b, Ask::Release(g(1)), 100),
            (&b, Ask::Acquire, 1),
            (&b, Ask::Renew(g(4)), 1),
        ];
        std::fs::create_dir_all(Path::new(home).join("skills")).expect("skills");
        std::fs::write(Path::new(home).join("skills/s.md"), "state\n").expect("state");
        for (who, ask, term) in steps {
            let current = std::fs::read_to_string(&record)
                .ok()
                .map(|line| WriterRecord::parse(&line).expect("the script stores valid records"));
            let (verdict, now) = match ask {
                // The bring-up's form, the snapshot riding on the acquire, follows the same rule.
                Ask::Acquire => run_acquire_then_snapshot(home, who, term),
                _ => run_local(home, who, term, &ask),
            };
            let (stored, expected) = decide(current.as_ref(), who, as_request(&ask), now, term);
            assert_eq!(verdict, expected, "{who} {ask:?} on {current:?}");
            let after = std::fs::read_to_string(&record)
                .ok()
                .map(|line| WriterRecord::parse(&line).expect("valid"));
            assert_eq!(after, stored, "{who} {ask:?}");
        }
    }

    #[test]
    fn an_expired_record_is_taken_over_on_the_sandbox_clock() {
        // contract: C9 — expiry is decided by the sandbox's clock; with a 1 s term a record
        // lapses after a second there, whatever the host believes.
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join(".hermes");
        let home = home.to_str().expect("utf-8");
        let (a, b) = (holder("aa", 1), holder("bb", 2));
        let (Verdict::Granted(first), _) = run_local(home, &a, 1, &Ask::Acquire) else {
            panic!("granted");
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let taken = loop {
            match run_local(home, &b, 1, &Ask::Acquire).0 {
                Verdict::Granted(record) => break record,
                Verdict::Held(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(taken.generation.get(), first.generation.get() + 1);
        assert!(
            matches!(run_local(home, &a, 1, &Ask::Renew(first.generation)).0, Verdict::Fenced(Some(ref r)) if r.holder == b)
        );
    }

    #[test]
    fn a_commit_moves_staged_files_only_under_the_current_generation() {
        // contract: C10 — staged writes reach the state root only after the generation check.
        let dir = tempfile::tempdir().expect("tempdir");
        let home_path = dir.path().join(".hermes");
        let home = home_path.to_str().expect("utf-8");
        let (a, b) = (holder("aa", 1), holder("bb", 2));
        run_local(home, &a, 1, &Ask::Acquire);
        let stage = |generation: u64, name: &str, text: &str| {
            let path = Path::new(&staging_dir(home, Generation::new(generation)))
                .join("skills")
                .join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        stage(1, "a.md", "from a");
        std::fs::create_dir_all(home_path.join("skills")).unwrap();
        std::fs::write(home_path.join("skills/old.md"), "old").unwrap();
        let delete = format!("rm -f -- {}", shell_quote(&format!("{home}/skills/old.md")));
        let commit = Ask::Commit {
            generation: Generation::new(1),
            deletes: vec![delete],
        };
        assert!(matches!(
            run_local(home, &a, 1, &commit).0,
            Verdict::Granted(_)
        ));
        assert_eq!(
            std::fs::read_to_string(home_path.join("skills/a.md")).unwrap(),
            "from a"
        );
        assert!(!home_path.join("skills/old.md").exists());
        assert!(!Path::new(&staging_dir(home, Generation::new(1))).exists());
        // b takes over once a's grant lapsed; a's later staged write is refused and b's
        // commit discards it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !matches!(
            run_local(home, &b, 60, &Ask::Acquire).0,
            Verdict::Granted(_)
        ) {
            assert!(
                std::time::Instant::now() < deadline,
                "a's grant never lapsed"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        stage(1, "a.md", "stale");
        assert!(matches!(
            run_local(home, &a, 60, &commit).0,
            Verdict::Fenced(Some(_))
        ));
        assert_eq!(
            std::fs::read_to_string(home_path.join("skills/a.md")).unwrap(),
            "from a"
        );
        let b_commit = Ask::Commit {
            generation: Generation::new(2),
            deletes: vec![],
        };
        assert!(matches!(
            run_local(home, &b, 60, &b_commit).0,
            Verdict::Granted(_)
        ));
        assert!(!Path::new(&staging_dir(home, Generation::new(1))).exists());
    }

    #[test]
    fn answers_are_parsed_strictly() {
        // contract: C8 — the sandbox is not trusted: anything but the one-line format is an
        // error naming the operation and the sandbox.
        let ok = b"arb granted 100 v1 1 160 aa 1 b007\n";
        assert!(matches!(
            parse_answer("op", "sbx", ok),
            Ok((Verdict::Granted(_), 100))
        ));
        assert!(matches!(
            parse_answer("op", "sbx", b"arb fenced 5 none\n"),
            Ok((Verdict::Fenced(None), 5))
        ));
        for bad in [
            &b""[..],
            b"arb granted 100 v1 1 160 aa 1 b007",
            b"arb granted 100 v1 1 160 aa 1 b007\nmore\n",
            b"arb granted x v1 1 160 aa 1 b007\n",
            b"arb won 100 v1 1 160 aa 1 b007\n",
            b"arb granted 100 v1 1 160 AA 1 b007\n",
            b"hello\n",
            b"\xff\n",
        ] {
            let error =
                parse_answer("acquire sandbox writer record", "sbx1", bad).expect_err("refused");
            let text = error.to_string();
            assert!(
                text.contains("acquire sandbox writer record") && text.contains("sbx1"),
                "{text}"
            );
        }
        let error = parse_answer("op", "sbx", b"arb error corrupt\n").expect_err("error");
        assert!(error.to_string().contains("corrupt"));
    }
}
