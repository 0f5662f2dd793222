//! `writer_arbitration: sandbox`: several "hosts" (processes with their own coordination
//! directory, hence their own host lock and host id) share one profile and one e2b-local
//! sandbox; the record inside the sandbox picks the one writer and fences stale ones.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_sandbox::{
    Backend, HookError, ManualClock, PushKind, RoleKind, SandboxMode, StateHooks, StateTransport,
    WriterArbitration, renewal_period,
};

use crate::support::{World, ok, run, sandbox_file};

/// A short grant, so takeovers happen within a test.
pub(crate) const SHORT_TERM: u64 = 3;
/// Longest wait for a takeover (the grant's term on the sandbox's clock, plus slack).
const TAKEOVER_WAIT: Duration = Duration::from_secs(30);

/// One "host": a sandbox-session process with its own coordination directory and state.
pub(crate) struct Host {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Where this host's skills/ comes from.
    pub(crate) src: PathBuf,
    _dirs: tempfile::TempDir,
}

impl Host {
    pub(crate) fn start(world: &World, term: u64) -> Host {
        let dirs = tempfile::tempdir().expect("host dirs");
        let src = dirs.path().join("src");
        std::fs::create_dir_all(src.join("skills")).expect("src");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox-session"))
            .arg(&world.url)
            .arg(world.home.path())
            .arg("default")
            .env("SANDBOX_SESSION_WRITER_TERM", term.to_string())
            .env("SANDBOX_SESSION_COORDINATION_DIR", dirs.path().join("lock"))
            .env("SANDBOX_SESSION_PUSH_FROM", &src)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("host starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Host {
            child,
            stdin,
            stdout,
            src,
            _dirs: dirs,
        }
    }

    pub(crate) fn write_skill(&self, name: &str, text: &str) {
        std::fs::write(self.src.join("skills").join(name), text).expect("write skill");
    }

    pub(crate) fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("send");
        self.stdin.flush().expect("flush");
    }

    pub(crate) fn read(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read");
        assert!(!line.is_empty(), "the host exited");
        line.trim_end().to_owned()
    }

    pub(crate) fn ask(&mut self, line: &str) -> String {
        self.send(line);
        self.read()
    }

    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal}");
    }

    /// Runs `true` until this host is admitted as the writer, within [`TAKEOVER_WAIT`].
    pub(crate) fn take_over(&mut self) {
        let start = Instant::now();
        loop {
            let answer = self.ask("run true");
            if answer.starts_with("exit 0") {
                let attached = self.ask("attach");
                assert!(attached.ends_with("Writer"), "{attached}");
                return;
            }
            assert!(
                answer.contains("another host holds the writer role"),
                "refused for another reason: {answer}"
            );
            assert!(start.elapsed() < TAKEOVER_WAIT, "no takeover: {answer}");
            // A bounded poll: the grant lapses on the sandbox's clock, which this test does
            // not control.
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn sandbox_id(attached: &str) -> String {
    let parts: Vec<&str> = attached.split(' ').collect();
    assert_eq!(parts[0], "attached", "{attached}");
    parts[1].to_owned()
}

#[test]
fn exactly_one_writer_among_racing_hosts() {
    // contract: C8 — one writer per scope across hosts.
    let world = World::new();
    // The sandbox exists (hosts only arbitrate it); its creator lets the role go.
    let mut first = Host::start(&world, 60);
    let id = sandbox_id(&first.ask("attach"));
    assert!(first.ask("cleanup").starts_with("cleanup"));
    drop(first);

    let mut hosts: Vec<Host> = (0..3).map(|_| Host::start(&world, 60)).collect();
    for host in &mut hosts {
        host.send("attach");
    }
    let answers: Vec<String> = hosts.iter_mut().map(Host::read).collect();
    let writers = answers.iter().filter(|a| a.ends_with("Writer")).count();
    assert_eq!(writers, 1, "{answers:#?}");
    for answer in answers.iter().filter(|a| !a.ends_with("Writer")) {
        assert!(
            answer.contains("another host holds the writer role"),
            "{answer}"
        );
    }
    for answer in answers.iter().filter(|a| a.ends_with("Writer")) {
        assert_eq!(sandbox_id(answer), id);
    }
}

#[test]
fn a_killed_writer_is_taken_over_after_its_term_with_recover_then_push() {
    // contract: C9 — after SIGKILL the grant lapses on the sandbox's clock; the next host
    // recovers what the dead writer committed, then pushes.
    let world = World::new();
    let mut a = Host::start(&world, SHORT_TERM);
    a.write_skill("a.md", "from a\n");
    let id = sandbox_id(&a.ask("attach"));
    assert!(a.ask("attach").ends_with("Writer"));
    a.signal("KILL");

    let mut b = Host::start(&world, SHORT_TERM);
    b.write_skill("b.md", "from b\n");
    b.take_over();
    let recovered = world.home.path().join("skills").join("a.md");
    assert_eq!(
        std::fs::read(&recovered).expect("a's committed skill was recovered into the profile"),
        b"from a\n"
    );
    for (name, text) in [("a.md", "from a\n"), ("b.md", "from b\n")] {
        let path = format!("/home/user/.hermes/skills/{name}");
        assert_eq!(
            sandbox_file(&world, &id, &path).as_deref(),
            Some(text.as_bytes()),
            "{name}"
        );
    }
}

/// Pushes `<src>/skills`, and on a per-command sync only what changed (as Hermes'
/// FileSyncManager does).
struct ChangedSkills {
    src: PathBuf,
    pushed: Mutex<BTreeMap<PathBuf, Vec<u8>>>,
}

impl ChangedSkills {
    fn new(src: &Path) -> Arc<ChangedSkills> {
        std::fs::create_dir_all(src.join("skills")).expect("skills");
        Arc::new(ChangedSkills {
            src: src.to_path_buf(),
            pushed: Mutex::new(BTreeMap::new()),
        })
    }
}

impl StateHooks for ChangedSkills {
    fn push(&self, transport: &StateTransport, _kind: PushKind) -> Result<(), HookError> {
        let mut pushed = self.pushed.lock().expect("pushed");
        let mut changed = Vec::new();
        for entry in std::fs::read_dir(self.src.join("skills"))? {
            let path = entry?.path();
            let bytes = std::fs::read(&path)?;
            if pushed.get(&path) != Some(&bytes) {
                let name = path
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned();
                changed.push((path.clone(), format!("/home/user/.hermes/skills/{name}")));
                pushed.insert(path, bytes);
            }
        }
        if !changed.is_empty() {
            transport.upload_many(changed)?;
        }
        // Pushed files the host no longer has are deleted, as Hermes' sync does.
        let gone: Vec<PathBuf> = pushed.keys().filter(|p| !p.exists()).cloned().collect();
        if !gone.is_empty() {
            let remote = gone
                .iter()
                .map(|path| {
                    let name = path.file_name().expect("name").to_string_lossy();
                    format!("/home/user/.hermes/skills/{name}")
                })
                .collect();
            transport.delete_many(remote)?;
            for path in gone {
                pushed.remove(&path);
            }
        }
        Ok(())
    }

    fn pull(&self, _transport: &StateTransport) -> Result<(), HookError> {
        Ok(())
    }
}

pub(crate) fn sandbox_backend(
    world: &World,
    term: Duration,
    clock: Arc<ManualClock>,
    src: &Path,
) -> Backend {
    let mut config = world.config(SandboxMode::Persistent);
    config.writer_arbitration = WriterArbitration::Sandbox { term };
    config.coordination_dir = Some(src.join("lock"));
    let mut services = world.services();
    services.clock = clock;
    Backend::new(
        config,
        world.scope("default"),
        services,
        ChangedSkills::new(src),
    )
    .expect("backend")
}

#[test]
fn no_extra_request_per_command_and_at_most_one_per_renewal_period() {
    // contract: C11 — request accounting with e2b-local's counter.
    let world = World::new();
    let src = tempfile::tempdir().expect("src");
    std::fs::create_dir_all(src.path().join("skills")).expect("skills");
    std::fs::write(src.path().join("skills").join("s.md"), "v1\n").expect("write");
    let term = Duration::from_secs(90);

    // The bring-ups, against the same bring-ups with host arbitration measured in this run
    // (another task, so another sandbox): first of a sandbox this process creates, then of
    // the same sandbox resumed by a new backend (which recovers from it).
    let host_bring_ups: Vec<_> = (0..2)
        .map(|_| {
            let baseline = world.backend(
                SandboxMode::Persistent,
                "baseline",
                ChangedSkills::new(src.path()),
            );
            let before = world.server().requests();
            assert_eq!(ok(&baseline, "cat ~/.hermes/skills/s.md"), "v1\n");
            let bring_up = world.server().requests().since(&before);
            baseline.cleanup();
            bring_up
        })
        .collect();
    let (host_bring_up, host_resumed) = (&host_bring_ups[0], &host_bring_ups[1]);

    // Created by this process, nothing to recover: the acquire on its own Start, and the
    // initial push's commit.

    let backend = sandbox_backend(&world, term, world.clock.clone(), src.path());
    let before = world.server().requests();
    assert_eq!(ok(&backend, "cat ~/.hermes/skills/s.md"), "v1\n");
    let bring_up = world.server().requests().since(&before);
    assert_eq!(
        bring_up.get("Process/Start"),
        host_bring_up.get("Process/Start") + 2,
        "{:?} vs {:?}",
        bring_up.routes().collect::<Vec<_>>(),
        host_bring_up.routes().collect::<Vec<_>>()
    );
    assert_eq!(bring_up.total(), host_bring_up.total() + 2);

    // Steady state: nothing to sync, grant fresh: exactly the command's own Process/Start.
    let before = world.server().requests();
    for i in 0..4 {
        world.advance(Duration::from_secs(1));
        assert_eq!(ok(&backend, &format!("echo {i}")), format!("{i}\n"));
    }
    let steady = world.server().requests().since(&before);
    assert_eq!(
        steady.total(),
        4,
        "{:?}",
        steady.routes().collect::<Vec<_>>()
    );
    assert_eq!(steady.get("Process/Start"), 4);

    // A renewal period later: one renewal rides along, once.
    world.advance(renewal_period(term));
    let before = world.server().requests();
    ok(&backend, "true");
    ok(&backend, "true");
    let renewed = world.server().requests().since(&before);
    assert_eq!(
        renewed.total(),
        3,
        "{:?}",
        renewed.routes().collect::<Vec<_>>()
    );
    assert_eq!(renewed.get("Process/Start"), 3);

    // A sync with something to push: its upload plus one commit.
    std::fs::write(src.path().join("skills").join("s.md"), "v2\n").expect("write");
    let before = world.server().requests();
    assert_eq!(ok(&backend, "cat ~/.hermes/skills/s.md"), "v2\n");
    let pushed = world.server().requests().since(&before);
    assert_eq!(
        pushed.get("Process/Start"),
        2,
        "{:?}",
        pushed.routes().collect::<Vec<_>>()
    );
    assert_eq!(
        pushed.total(),
        3,
        "{:?}",
        pushed.routes().collect::<Vec<_>>()
    );
    ok(
        &backend,
        "mkdir -p ~/.hermes/memories && echo kept > ~/.hermes/memories/kept.md",
    );
    backend.cleanup();

    // Resumed by a new backend: the acquire rides on the recovery snapshot's Start, so only
    // the commit is extra; recovery still brings back what the sandbox holds.
    let resumed = sandbox_backend(&world, term, world.clock.clone(), src.path());
    let before = world.server().requests();
    assert_eq!(ok(&resumed, "cat ~/.hermes/skills/s.md"), "v2\n");
    let bring_up = world.server().requests().since(&before);
    assert_eq!(resumed.info().expect("attached").role, RoleKind::Writer);
    assert_eq!(
        std::fs::read_to_string(world.home.path().join("memories").join("kept.md"))
            .expect("recovered from the resumed sandbox"),
        "kept\n"
    );
    assert_eq!(
        bring_up.get("Process/Start"),
        host_resumed.get("Process/Start") + 1,
        "{:?} vs {:?}",
        bring_up.routes().collect::<Vec<_>>(),
        host_resumed.routes().collect::<Vec<_>>()
    );
    assert_eq!(bring_up.total(), host_resumed.total() + 1);
    resumed.cleanup();
}

#[test]
fn host_clock_skew_decides_nothing() {
    // contract: C9 — only the sandbox's clock decides expiry: a host whose clock runs days
    // ahead can neither take over a live grant nor lose its own.
    let world = World::new();
    let (a_src, b_src) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let a_clock = Arc::new(ManualClock::new());
    let a = sandbox_backend(
        &world,
        Duration::from_secs(120),
        a_clock.clone(),
        a_src.path(),
    );
    ok(&a, "true");
    assert_eq!(a.info().expect("attached").role, RoleKind::Writer);

    let b_clock = Arc::new(ManualClock::new());
    b_clock.advance(Duration::from_secs(30 * 86_400));
    let b = sandbox_backend(&world, Duration::from_secs(120), b_clock, b_src.path());
    let refused = run(&b, "true").expect_err("a holds the role");
    assert!(refused.is_not_ready(), "{refused}");
    assert!(
        refused
            .to_string()
            .contains("another host holds the writer role"),
        "{refused}"
    );

    // a's clock jumps a month: its next command renews (due by its clock) and is granted.
    a_clock.advance(Duration::from_secs(30 * 86_400));
    ok(&a, "true");
    assert_eq!(a.info().expect("attached").role, RoleKind::Writer);
    a.cleanup();
    b.cleanup();
}

#[test]
fn a_writer_resumed_from_a_suspend_renews_before_its_next_command_and_is_fenced_if_taken_over() {
    // contract: C9, C11 — renewals are paced by a clock that counts suspend: the monotonic
    // clock stands still while a laptop sleeps, the grant lapses on the sandbox's clock.
    let world = World::new();
    let (a_src, b_src) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let a_clock = Arc::new(ManualClock::new());
    let a = sandbox_backend(
        &world,
        Duration::from_secs(1),
        a_clock.clone(),
        a_src.path(),
    );
    ok(&a, "true");
    assert_eq!(a.info().expect("attached").role, RoleKind::Writer);
    let id = a.info().expect("attached").sandbox_id;

    // Resumed with nobody else around: the first command carries one renewal, granted.
    a_clock.suspend(Duration::from_secs(3600));
    let before = world.server().requests();
    ok(&a, "true");
    let resumed = world.server().requests().since(&before);
    assert_eq!(
        resumed.get("Process/Start"),
        2,
        "{:?}",
        resumed.routes().collect::<Vec<_>>()
    );
    assert_eq!(a.info().expect("attached").role, RoleKind::Writer);

    // Another host takes over while a sleeps; a's first command after resuming is refused
    // before it runs, and a is a reader.
    let b_clock = Arc::new(ManualClock::new());
    let b = sandbox_backend(
        &world,
        Duration::from_secs(60),
        b_clock.clone(),
        b_src.path(),
    );
    admitted_within_takeover_wait(&b, &b_clock);
    assert_eq!(b.info().expect("attached").role, RoleKind::Writer);
    a_clock.suspend(Duration::from_secs(3600));
    let fenced = run(&a, "echo ran > /tmp/stale-writer-ran").expect_err("taken over");
    assert!(fenced.is_fenced(), "{fenced}");
    assert_eq!(a.info().expect("attached").role, RoleKind::Reader);
    assert_eq!(
        sandbox_file(&world, &id, "/tmp/stale-writer-ran"),
        None,
        "the stale writer's command never ran"
    );
    b.cleanup();
    a.cleanup();
}

/// Runs `true` on `backend` until it is admitted, within [`TAKEOVER_WAIT`]; `clock` is the
/// backend's, moved on with each poll so its pause after a refusal passes.
pub(crate) fn admitted_within_takeover_wait(backend: &Backend, clock: &ManualClock) {
    let start = Instant::now();
    loop {
        match run(backend, "true") {
            Ok((exit, _)) if exit.exit_code == 0 => return,
            Err(error) if error.is_not_ready() && start.elapsed() < TAKEOVER_WAIT => {
                // Bounded poll: the grant lapses on the sandbox's clock.
                std::thread::sleep(Duration::from_millis(250));
                clock.advance(Duration::from_millis(250));
            }
            other => panic!("no takeover: {other:?}"),
        }
    }
}

#[test]
fn a_refused_host_asks_the_record_again_at_most_once_per_renewal_period() {
    // contract: C11 — a host refused by another host's grant pays no request per refused
    // command: it asks again after the renewal period (or the grant's remaining seconds).
    let world = World::new();
    let (a_src, b_src) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let term = Duration::from_secs(90);
    let a = sandbox_backend(&world, term, Arc::new(ManualClock::new()), a_src.path());
    ok(&a, "true");
    let b_clock = Arc::new(ManualClock::new());
    let b = sandbox_backend(&world, term, b_clock.clone(), b_src.path());
    assert!(run(&b, "true").expect_err("held").is_not_ready());

    let before = world.server().requests();
    for _ in 0..3 {
        let refused = run(&b, "true").expect_err("still held");
        assert!(
            refused
                .to_string()
                .contains("another host holds the writer role"),
            "{refused}"
        );
    }
    assert_eq!(world.server().requests().since(&before).total(), 0);

    b_clock.advance(renewal_period(term));
    let before = world.server().requests();
    assert!(run(&b, "true").expect_err("held").is_not_ready());
    assert!(run(&b, "true").expect_err("held").is_not_ready());
    let asked = world.server().requests().since(&before);
    assert_eq!(asked.total(), 1, "{:?}", asked.routes().collect::<Vec<_>>());
    assert_eq!(asked.get("Process/Start"), 1);
    a.cleanup();
    b.cleanup();
}
