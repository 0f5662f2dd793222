//! `campaign [--cycles N] [--seed S] [--dir D] [--hosts 1|2]`: the crash/fault campaign
//! (run it through `scripts/campaign`, which builds the binaries first).
//!
//! Randomized, seeded cycles of real `campaign-host` processes (each a persistent-mode
//! `Backend`) on one scope against an `e2b-local serve --state-dir` process. Each cycle
//! edits skills and memories on the host and in the sandbox, starts one or two host
//! processes that attach, run commands and clean up, and injects faults drawn from the
//! seed: SIGKILL of a host process (at a random moment, or as a push or pull starts),
//! injected 5xx answers, dropped connections, streams cut mid-transfer, the sandbox
//! vanishing or paused, its lease expiring (the server's clock jumps), and e2b-local
//! killed and restarted on its state directory (refusing connections meanwhile). After
//! every cycle it checks: no version of a skills/memories file the user wrote is lost (each
//! is on the host, in a sandbox or in quarantine), nothing was written outside the Hermes
//! home, two processes never pushed at once, and no command ran without this cycle's state;
//! and after each kill of e2b-local, that no process of the killed server outlived it.
//! The seed fixes every draw (the schedule); the timing of real processes is not fixed, so
//! a replay repeats the schedule, not every interleaving.
//!
//! With `--hosts 2` the processes stand in for two machines sharing the profile: each
//! process belongs to host 0 or 1 (its own coordination directory, hence host lock and host
//! id) with `writer_arbitration: sandbox` and a grant of [`TWO_HOST_TERM`]; faults then also
//! include SIGSTOP of a process past its term and SIGCONT after. "Never two writers" becomes:
//! processes of one host never push at once, the sandbox's writer record never goes back a
//! generation, and no write of an older generation lands after a newer one's (each push
//! uploads a marker naming its process; see `campaign::GenerationWatch`).
//!
//! Exits 1 with the seed on any violation.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use campaign::{GenerationWatch, Ledger, Side, overlapping_pushes, stateless_command};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The API key the host processes use; it must appear in no answer or error.
const API_KEY: &str = "campaign-local-key";
/// Longest wait for one answer of a host process (every operation has its own deadline).
const ANSWER_BOUND: Duration = Duration::from_secs(90);
/// Longest wait for e2b-local to announce its URL.
const SERVER_START_BOUND: Duration = Duration::from_secs(30);
/// The files the user edits, relative to the Hermes home.
const FILES: [&str; 8] = [
    "skills/alpha/SKILL.md",
    "skills/beta/SKILL.md",
    "skills/beta/references/notes.md",
    "skills/gamma/SKILL.md",
    "memories/MEMORY.md",
    "memories/USER.md",
    "memories/projects/one.md",
    "memories/projects/two.md",
];
/// The writer grant in the two-host mode: short, so a stopped writer is taken over within a
/// cycle.
const TWO_HOST_TERM: Duration = Duration::from_secs(2);
/// How long sandbox-side edits wait for requests a killed host left running at e2b-local.
const QUIESCE_WAIT: Duration = Duration::from_secs(10);
/// The marker each push uploads in the two-host mode (see `campaign-host`).
const MARKER: &str = "skills/campaign/writer";
/// The file whose content names the cycle; every command prints it.
const EPOCH_FILE: &str = "skills/campaign/epoch";

type Error = Box<dyn std::error::Error>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillHostTimed,
    KillHostAtPush,
    KillHostAtPull,
    ServerError,
    DropConnections,
    DropStream,
    Vanish,
    Pause,
    LeaseExpiry,
    ServerRestart,
    /// Two-host mode only.
    StopWriter,
}

const FAULTS: [Fault; 10] = [
    Fault::KillHostTimed,
    Fault::KillHostAtPush,
    Fault::KillHostAtPull,
    Fault::ServerError,
    Fault::DropConnections,
    Fault::DropStream,
    Fault::Vanish,
    Fault::Pause,
    Fault::LeaseExpiry,
    Fault::ServerRestart,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::KillHostTimed => "SIGKILL host at a random moment",
            Fault::KillHostAtPush => "SIGKILL host mid-push",
            Fault::KillHostAtPull => "SIGKILL host mid-pull",
            Fault::ServerError => "injected 5xx",
            Fault::DropConnections => "dropped connections",
            Fault::DropStream => "stream cut mid-transfer",
            Fault::Vanish => "sandbox vanished",
            Fault::Pause => "sandbox paused",
            Fault::LeaseExpiry => "lease expired (clock jump)",
            Fault::ServerRestart => "e2b-local killed and restarted (refusing meanwhile)",
            Fault::StopWriter => "SIGSTOP host past its term, then SIGCONT",
        }
    }
}

struct Args {
    cycles: u64,
    seed: u64,
    dir: Option<PathBuf>,
    hosts: usize,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        cycles: 50,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
        dir: None,
        hosts: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--cycles" => args.cycles = value()?.parse()?,
            "--seed" => args.seed = value()?.parse()?,
            "--dir" => args.dir = Some(PathBuf::from(value()?)),
            "--hosts" => {
                args.hosts = value()?.parse()?;
                if !(1..=2).contains(&args.hosts) {
                    return Err("--hosts takes 1 or 2".into());
                }
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: campaign [--cycles N] [--seed S] [--dir D] \
                     [--hosts 1|2]"
                )
                .into());
            }
        }
    }
    Ok(args)
}

/// The e2b-local process.
struct LocalServer {
    bin: PathBuf,
    state: PathBuf,
    log: PathBuf,
    port: u16,
    child: Child,
    _stdin: ChildStdin,
}

impl LocalServer {
    fn start(bin: &Path, state: &Path, log: &Path, port: u16) -> Result<LocalServer, Error> {
        let deadline = Instant::now() + SERVER_START_BOUND;
        loop {
            match LocalServer::spawn(bin, state, log, port) {
                Ok(server) => return Ok(server),
                // The port of a killed server may take a moment to be free again.
                Err(error) if Instant::now() < deadline && port != 0 => {
                    eprintln!("campaign: e2b-local restart: {error}; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn spawn(bin: &Path, state: &Path, log: &Path, port: u16) -> Result<LocalServer, Error> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut child = Command::new(bin)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--state-dir")
            .arg(state)
            .arg("--exit-on-stdin-eof")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(SERVER_START_BOUND) {
            Ok(line) if line.starts_with("E2B_API_URL=") => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("e2b-local did not announce its URL: {other:?}").into());
            }
        };
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("bad URL line {line:?}"))?;
        Ok(LocalServer {
            bin: bin.to_path_buf(),
            state: state.to_path_buf(),
            log: log.to_path_buf(),
            port,
            child,
            _stdin: stdin,
        })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, a gap during which connections are refused, then a start on the same port
    /// and state directory. Returns a violation when a process of the killed server (a
    /// sandbox's namespace init, a command) outlived it.
    fn restart(&mut self, gap: Duration) -> Result<Option<String>, Error> {
        let before = descendants(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + SURVIVOR_BOUND;
        let mut left = before.clone();
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            left.retain(|&(pid, start)| ppid_and_start(pid).is_some_and(|(_, s)| s == start));
        }
        let violation = (!left.is_empty()).then(|| {
            for &(pid, _) in &left {
                // Leftovers would only pile up over the run.
                let _ = signal(pid, "KILL");
            }
            format!(
                "processes of the SIGKILLed e2b-local survived it for {SURVIVOR_BOUND:?}: {left:?}"
            )
        });
        std::thread::sleep(gap);
        *self = LocalServer::start(&self.bin, &self.state, &self.log, self.port)?;
        Ok(violation)
    }

    /// One admin request (`/_e2b_local/...`); the status.
    fn admin(&self, path: &str, body: &str) -> Result<u16, Error> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "POST /_e2b_local/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {API_KEY}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad admin answer {answer:?}").into())
    }

    /// Waits until no counted request is in flight and no process runs at e2b-local: a host
    /// killed mid-request may leave one running there (an upload, a commit script that goes on
    /// after its client is gone), and the campaign's sandbox-side edits stand for writes that
    /// come after it, as a command's would.
    fn quiesce(&self, within: Duration) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            write!(
                stream,
                "GET /_e2b_local/requests HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {API_KEY}\r\n\
                 Connection: close\r\n\r\n"
            )?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            let field = |name: &str| {
                answer
                    .split(&format!("\"{name}\":"))
                    .nth(1)
                    .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|digits| digits.parse::<u64>().ok())
                    .ok_or_else(|| format!("no {name} in e2b-local's answer {answer:?}"))
            };
            let (in_flight, running) = (field("inFlight")?, field("runningProcesses")?);
            if in_flight == 0 && running == 0 {
                return Ok(());
            }
            if start.elapsed() > within {
                return Err(format!(
                    "{in_flight} requests in flight and {running} processes running at e2b-local after {within:?}"
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Admin requests may meet the faults they set up (a dropped connection): retry a few
    /// times; the caller decides whether a failure matters.
    fn admin_retrying(&self, path: &str, body: &str) -> Result<u16, Error> {
        let mut last = None;
        for _ in 0..5 {
            match self.admin(path, body) {
                Ok(status) if status < 500 => return Ok(status),
                Ok(status) => last = Some(format!("status {status}").into()),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| "no attempt".into()))
    }

    fn sandbox_hermes_home(&self, sandbox_id: &str) -> PathBuf {
        self.state
            .join("sandboxes")
            .join(sandbox_id)
            .join("home")
            .join(".hermes")
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Msg {
    Line(usize, String),
    Eof(usize),
}

/// One host process and where its script stands.
struct Host {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    script: Vec<String>,
    next: usize,
    waiting_since: Option<Instant>,
    killed: bool,
    done: bool,
}

impl Host {
    fn send_next(&mut self) {
        if let Some(op) = self.script.get(self.next) {
            self.next += 1;
            let sent = self
                .stdin
                .as_mut()
                .is_some_and(|stdin| writeln!(stdin, "{op}").and_then(|()| stdin.flush()).is_ok());
            self.waiting_since = sent.then(Instant::now);
            if op == "quit" {
                self.waiting_since = None;
                self.stdin = None;
            }
        }
    }
}

/// A fault scheduled in this cycle.
struct Planned {
    fault: Fault,
    at: Instant,
    armed: bool,
}

struct Campaign {
    rng: StdRng,
    root: PathBuf,
    home: PathBuf,
    push_log: PathBuf,
    host_bin: PathBuf,
    server: LocalServer,
    ledger: Ledger,
    sandbox: Option<String>,
    injected: BTreeMap<Fault, u64>,
    violations: Vec<String>,
    outside_baseline: BTreeSet<PathBuf>,
    host_edits: u64,
    sandbox_edits: u64,
    commands_ok: u64,
    commands_failed: u64,
    /// What happened in the current cycle, printed with its violations.
    trace: Vec<String>,
    previous_trace: Vec<String>,
    cycle_start: Instant,
    /// 1, or 2 for the two-host mode.
    hosts: usize,
    /// Stopped processes (by index in the cycle) and when they get SIGCONT.
    stopped: Vec<(Instant, usize)>,
    /// Per sandbox: the writer record and the landed markers (two-host mode).
    generations: BTreeMap<String, GenerationWatch>,
    /// Commands refused because another host's grant fenced their writer (`Error::Fenced`).
    fenced: u64,
    /// This cycle's processes: pid and machine.
    machine_pids: Vec<(String, usize)>,
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(0) => std::process::ExitCode::SUCCESS,
        Ok(_) => std::process::ExitCode::FAILURE,
        Err(error) => {
            eprintln!("campaign: {error}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> Result<usize, Error> {
    let args = parse_args()?;
    let bin_dir = std::env::current_exe()?
        .parent()
        .ok_or("no binary directory")?
        .to_path_buf();
    let temp;
    let root = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => {
            temp =
                std::env::temp_dir().join(format!("campaign-{}-{}", std::process::id(), args.seed));
            std::fs::create_dir_all(&temp)?;
            temp.clone()
        }
    };
    let home = root.join("hermes-home");
    for dir in [
        "coordination-0",
        "coordination-1",
        "hermes-home/skills",
        "hermes-home/memories",
        "state",
        "logs",
        "host-home",
        "host-tmp",
        "host-cwd",
    ] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    let server = LocalServer::start(
        &bin_dir.join("e2b-local"),
        &root.join("state"),
        &root.join("logs").join("e2b-local.log"),
        0,
    )?;
    println!(
        "campaign: seed {}, {} cycles, {} host(s), e2b-local at {}, directory {}",
        args.seed,
        args.cycles,
        args.hosts,
        server.url(),
        root.display()
    );
    let mut campaign = Campaign {
        rng: StdRng::seed_from_u64(args.seed),
        push_log: root.join("logs").join("push.log"),
        host_bin: bin_dir.join("campaign-host"),
        home,
        server,
        ledger: Ledger::default(),
        sandbox: None,
        injected: BTreeMap::new(),
        violations: Vec::new(),
        outside_baseline: BTreeSet::new(),
        host_edits: 0,
        sandbox_edits: 0,
        commands_ok: 0,
        commands_failed: 0,
        trace: Vec::new(),
        previous_trace: Vec::new(),
        cycle_start: Instant::now(),
        root: root.clone(),
        hosts: args.hosts,
        stopped: Vec::new(),
        generations: BTreeMap::new(),
        fenced: 0,
        machine_pids: Vec::new(),
    };
    campaign.outside_baseline = campaign.outside_home();
    let started = Instant::now();
    for cycle in 1..=args.cycles {
        let before = campaign.violations.len();
        campaign.cycle(cycle)?;
        for violation in &campaign.violations[before..] {
            println!("VIOLATION in cycle {cycle}: {violation}");
        }
        let violated = campaign.violations.len() > before;
        // CAMPAIGN_TRACE=1 prints every cycle's trace (for reading a mode's behaviour).
        if violated || std::env::var_os("CAMPAIGN_TRACE").is_some() {
            if violated {
                println!("  trace of the cycle before:");
                for line in &campaign.previous_trace {
                    println!("    {line}");
                }
            }
            println!("  trace of cycle {cycle}:");
            for line in &campaign.trace {
                println!("    {line}");
            }
        }
        if cycle % 50 == 0 {
            println!(
                "campaign: {cycle} cycles, {} violations, {:.0?}",
                campaign.violations.len(),
                started.elapsed()
            );
        }
    }
    println!(
        "campaign: {} cycles in {:.1?}, seed {}",
        args.cycles,
        started.elapsed(),
        args.seed
    );
    let stop = (args.hosts == 2).then_some(Fault::StopWriter);
    for fault in FAULTS.into_iter().chain(stop) {
        println!(
            "  {:<55} {}",
            fault.name(),
            campaign.injected.get(&fault).copied().unwrap_or(0)
        );
    }
    println!(
        "  versions written: {} ({} host edits, {} sandbox edits); commands: {} completed, {} refused or failed",
        campaign.ledger.written(),
        campaign.host_edits,
        campaign.sandbox_edits,
        campaign.commands_ok,
        campaign.commands_failed
    );
    if args.hosts == 2 {
        let watches = campaign.generations.values();
        let (takeovers, unattributed) =
            watches.fold((0, 0), |(t, u), w| (t + w.takeovers, u + w.unattributed));
        println!(
            "  two hosts: {takeovers} hand-overs between hosts seen in the writer record, {} \
             commands fenced, \
             {unattributed} landed pushes not attributed to a generation",
            campaign.fenced
        );
    }
    // A campaign in which nothing works proves nothing: most cycles must get commands through
    // (each cycle runs at least one; faults refuse some).
    if args.cycles >= 10 && campaign.commands_ok < args.cycles / 4 {
        campaign.violations.push(format!(
            "only {} commands completed in {} cycles: the backend hardly worked",
            campaign.commands_ok, args.cycles
        ));
        println!(
            "VIOLATION: {}",
            campaign.violations[campaign.violations.len() - 1]
        );
    }
    let violations = campaign.violations.len();
    println!("  violations: {violations}");
    if violations > 0 {
        println!(
            "campaign: FAILED; replay the schedule with: scripts/campaign --seed {} --cycles {} \
             --hosts {}",
            args.seed, args.cycles, args.hosts
        );
    } else if args.dir.is_none() {
        drop(campaign);
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(violations)
}

/// Writes `content` to `path` atomically (a temp file beside it, then rename).
fn write_atomic(path: &Path, content: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("campaign-tmp");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

/// Gives each component of `rel` below `root` the owner of `root`.
fn owned_like(root: &Path, rel: &str) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(root)?;
    let mut path = root.to_path_buf();
    for part in Path::new(rel).components() {
        path.push(part);
        std::os::unix::fs::chown(&path, Some(meta.uid()), Some(meta.gid()))?;
    }
    Ok(())
}

/// Every file below `dir`, with its content (unreadable files are skipped).
fn contents(dir: &Path, out: &mut HashSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => contents(&path, out),
            Ok(t) if t.is_file() => {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    out.insert(text);
                }
            }
            _ => {}
        }
    }
}

fn walk(dir: &Path, skip: &[PathBuf], out: &mut BTreeSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if skip.iter().any(|s| path.starts_with(s)) {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&path, skip, out);
        }
        out.insert(path);
    }
}

impl Campaign {
    /// Everything under the campaign directory but the Hermes home, e2b-local's state and
    /// the campaign's own logs.
    fn outside_home(&self) -> BTreeSet<PathBuf> {
        let mut out = BTreeSet::new();
        let skip = [
            self.home.clone(),
            self.root.join("state"),
            self.root.join("logs"),
            // The two-host mode's coordination directories (the hosts' cache/e2b).
            self.root.join("coordination-0"),
            self.root.join("coordination-1"),
        ];
        walk(&self.root, &skip, &mut out);
        out
    }

    fn note(&mut self, what: String) {
        let ms = self.cycle_start.elapsed().as_millis();
        self.trace.push(format!("{ms:>6} ms {what}"));
    }

    fn count(&mut self, fault: Fault) {
        self.note(format!("fault: {}", fault.name()));
        *self.injected.entry(fault).or_default() += 1;
    }

    fn edit(&mut self, cycle: u64) -> Result<(), Error> {
        write_atomic(&self.home.join(EPOCH_FILE), &format!("epoch {cycle}\n"))?;
        for _ in 0..self.rng.random_range(0..=2) {
            let rel = FILES[self.rng.random_range(0..FILES.len())];
            let path = self.home.join(rel);
            if let Ok(old) = std::fs::read_to_string(&path) {
                self.ledger.overwrite(&old);
            }
            let content = self.ledger.write(Side::Host, cycle, rel);
            write_atomic(&path, &content)?;
            self.host_edits += 1;
            self.note(format!("host edit: {}", content.trim_end()));
        }
        let edits = self.rng.random_range(0..=2);
        if edits > 0 && self.sandbox.is_some() {
            self.server.quiesce(QUIESCE_WAIT)?;
        }
        if let Some(id) = self.sandbox.clone() {
            let remote = self.server.sandbox_hermes_home(&id);
            if remote.is_dir() {
                for _ in 0..edits {
                    let rel = FILES[self.rng.random_range(0..FILES.len())];
                    let path = remote.join(rel);
                    if let Ok(old) = std::fs::read_to_string(&path) {
                        self.ledger.overwrite(&old);
                    }
                    let content = self.ledger.write(Side::Sandbox, cycle, rel);
                    write_atomic(&path, &content)?;
                    // As if the sandbox's user had written it: the fenced commit runs as
                    // that user and must be able to replace it.
                    owned_like(&remote, rel)?;
                    self.sandbox_edits += 1;
                    self.note(format!("sandbox edit in {id}: {}", content.trim_end()));
                }
            }
        }
        Ok(())
    }

    fn spawn_host(
        &self,
        index: usize,
        machine: usize,
        script: Vec<String>,
        tx: Sender<Msg>,
    ) -> Result<Host, Error> {
        let stderr =
            std::fs::File::create(self.root.join("logs").join(format!("host-{index}.err")))?;
        let mut command = Command::new(&self.host_bin);
        command
            .arg(self.server.url())
            .arg(&self.home)
            .arg("campaign-task")
            .arg(&self.push_log);
        if self.hosts == 2 {
            command
                .arg(self.root.join(format!("coordination-{machine}")))
                .arg(TWO_HOST_TERM.as_secs().to_string());
        }
        let mut child = command
            .env("HOME", self.root.join("host-home"))
            .env("TMPDIR", self.root.join("host-tmp"))
            .env_remove("E2B_API_KEY")
            .current_dir(self.root.join("host-cwd"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(Msg::Line(index, line)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Msg::Eof(index));
        });
        Ok(Host {
            pid: child.id(),
            stdin: child.stdin.take(),
            child,
            script,
            next: 0,
            waiting_since: None,
            killed: false,
            done: false,
        })
    }

    fn kill(&self, host: &mut Host) -> Result<(), Error> {
        if host.done || host.killed {
            return Ok(());
        }
        // SIGKILL ends a stopped process too.
        let _ = host.child.kill();
        let _ = host.child.wait();
        host.killed = true;
        host.stdin = None;
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.push_log)?;
        writeln!(log, "K {}", host.pid)?;
        Ok(())
    }

    fn inject(&mut self, fault: Fault, hosts: &mut [Host]) -> Result<(), Error> {
        match fault {
            Fault::KillHostTimed | Fault::KillHostAtPush | Fault::KillHostAtPull => {
                let live: Vec<usize> = (0..hosts.len())
                    .filter(|&i| !hosts[i].done && !hosts[i].killed)
                    .collect();
                if live.is_empty() {
                    return Ok(());
                }
                let i = live[self.rng.random_range(0..live.len())];
                self.kill(&mut hosts[i])?;
            }
            Fault::ServerError => {
                let status = [500, 502, 503, 504][self.rng.random_range(0..4)];
                let count = self.rng.random_range(1..=4);
                self.server.admin_retrying(
                    "faults/fail",
                    &format!(r#"{{"count":{count},"status":{status}}}"#),
                )?;
            }
            Fault::DropConnections => {
                let count = self.rng.random_range(1..=3);
                self.server.admin_retrying(
                    "faults/drop-connections",
                    &format!(r#"{{"count":{count}}}"#),
                )?;
            }
            Fault::DropStream => {
                let count = self.rng.random_range(1..=2);
                let after = self.rng.random_range(0..4096);
                self.server.admin_retrying(
                    "faults/drop-stream",
                    &format!(r#"{{"count":{count},"afterBytes":{after},"scope":"envd"}}"#),
                )?;
            }
            Fault::Vanish | Fault::Pause => {
                let Some(id) = self.sandbox.clone() else {
                    return Ok(());
                };
                if fault == Fault::Vanish {
                    // What lived only in this sandbox may be lost with it.
                    let mut inside = HashSet::new();
                    let remote = self.server.sandbox_hermes_home(&id);
                    contents(&remote.join("skills"), &mut inside);
                    contents(&remote.join("memories"), &mut inside);
                    for content in &inside {
                        self.ledger.vanished(content);
                    }
                }
                let action = if fault == Fault::Vanish {
                    "vanish"
                } else {
                    "pause"
                };
                // 404 when it is already gone: nothing was injected.
                if self
                    .server
                    .admin_retrying(&format!("sandboxes/{id}/{action}"), "{}")?
                    != 204
                {
                    return Ok(());
                }
            }
            Fault::LeaseExpiry => {
                self.server
                    .admin_retrying("clock/advance", r#"{"seconds":200000}"#)?;
            }
            Fault::ServerRestart => {
                let gap = Duration::from_millis(self.rng.random_range(0..300));
                if let Some(violation) = self.server.restart(gap)? {
                    self.note(format!("violation: {violation}"));
                    self.violations.push(violation);
                }
            }
            Fault::StopWriter => {
                let live: Vec<usize> = (0..hosts.len())
                    .filter(|&i| {
                        !hosts[i].done
                            && !hosts[i].killed
                            && !self.stopped.iter().any(|(_, s)| *s == i)
                    })
                    .collect();
                if live.is_empty() {
                    return Ok(());
                }
                let i = live[self.rng.random_range(0..live.len())];
                signal(hosts[i].pid, "STOP")?;
                // Past the term on the sandbox's clock, so another host may take over.
                let hold = TWO_HOST_TERM + Duration::from_millis(self.rng.random_range(300..1500));
                self.stopped.push((Instant::now() + hold, i));
                self.note(format!("host {i} stopped for {hold:?}"));
            }
        }
        self.count(fault);
        Ok(())
    }

    fn cycle(&mut self, cycle: u64) -> Result<(), Error> {
        self.previous_trace = std::mem::take(&mut self.trace);
        self.cycle_start = Instant::now();
        self.edit(cycle)?;
        let epoch = format!("epoch {cycle}");
        let _ = std::fs::remove_file(&self.push_log);
        let processes = if self.rng.random_bool(0.4) { 2 } else { 1 };
        // The faults are drawn before the scripts in the two-host mode, so a cycle with a
        // stopped writer gives the other host commands past the term.
        let faults = match self.rng.random_range(0..10) {
            0..=1 => 0,
            2..=6 => 1,
            _ => 2,
        };
        let mut drawn = Vec::new();
        for _ in 0..faults {
            let fault = if self.hosts == 2 && self.rng.random_bool(0.3) {
                Fault::StopWriter
            } else {
                FAULTS[self.rng.random_range(0..FAULTS.len())]
            };
            drawn.push((fault, Duration::from_millis(self.rng.random_range(0..600))));
        }
        let stops = drawn.iter().any(|(f, _)| *f == Fault::StopWriter);
        let processes = if stops { 2 } else { processes };
        let (tx, rx): (Sender<Msg>, Receiver<Msg>) = channel();
        let mut hosts = Vec::new();
        self.machine_pids.clear();
        for index in 0..processes {
            let mut script = vec!["attach".to_owned()];
            for _ in 0..self.rng.random_range(1..=3) {
                let pause = self.rng.random_range(0..30);
                script.push(format!(
                    "run cat ~/.hermes/{EPOCH_FILE} 2>/dev/null || echo NOSTATE; sleep 0.{pause:02}"
                ));
            }
            if stops {
                // Commands spaced past the term: the host that is not stopped asks again.
                let span = TWO_HOST_TERM.as_millis() as u64 + 2000;
                for _ in 0..(span / 500) {
                    script.push("pause 500".to_owned());
                    script.push(format!(
                        "run cat ~/.hermes/{EPOCH_FILE} 2>/dev/null || echo NOSTATE"
                    ));
                }
            }
            script.push("cleanup".to_owned());
            script.push("quit".to_owned());
            // Two processes in the two-host mode: one per machine when a stop is drawn,
            // else either machine (the same one exercises its host lock).
            let machine = match (self.hosts, stops) {
                (1, _) => 0,
                (_, true) => index,
                (_, false) => self.rng.random_range(0..2),
            };
            let host = self.spawn_host(index, machine, script, tx.clone())?;
            self.machine_pids.push((host.pid.to_string(), machine));
            self.note(format!(
                "host {index} is pid {} on machine {machine}",
                host.pid
            ));
            hosts.push(host);
        }
        drop(tx);
        let start = Instant::now();
        let mut planned = Vec::new();
        for (fault, delay) in drawn {
            let armed = !matches!(fault, Fault::KillHostAtPush | Fault::KillHostAtPull);
            planned.push(Planned {
                fault,
                at: start + delay,
                armed,
            });
        }
        for host in &mut hosts {
            host.send_next();
        }
        let mut open = hosts.len();
        while open > 0 {
            let now = Instant::now();
            self.resume_due(&hosts, now)?;
            self.observe_generations();
            // Due faults first.
            let mut i = 0;
            while i < planned.len() {
                if planned[i].armed && planned[i].at <= now {
                    let fault = planned.remove(i).fault;
                    self.inject(fault, &mut hosts)?;
                } else {
                    i += 1;
                }
            }
            for (index, host) in hosts.iter_mut().enumerate() {
                if let Some(since) = host.waiting_since
                    && since.elapsed() > ANSWER_BOUND
                {
                    self.violations.push(format!(
                        "host process {index} gave no answer to {:?} within {ANSWER_BOUND:?}",
                        host.script[host.next - 1]
                    ));
                    self.kill(host)?;
                }
            }
            let wait = planned
                .iter()
                .filter(|p| p.armed)
                .map(|p| p.at)
                .chain(self.stopped.iter().map(|(at, _)| *at))
                .map(|at| at.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_secs(1))
                .max(Duration::from_millis(1));
            match rx.recv_timeout(wait) {
                Ok(Msg::Line(index, line)) => {
                    self.note(format!("host {index} (pid {}): {line}", hosts[index].pid));
                    if line.contains(API_KEY) {
                        self.violations
                            .push(format!("the API key appeared in a host answer: {line:?}"));
                    }
                    if let Some(phase) = line.strip_prefix("phase ") {
                        let wanted = if phase == "push" {
                            Fault::KillHostAtPush
                        } else {
                            Fault::KillHostAtPull
                        };
                        if let Some(at) = planned.iter().position(|p| p.fault == wanted && !p.armed)
                        {
                            // Kill the host that announced the transfer, a moment into it.
                            planned.remove(at);
                            std::thread::sleep(Duration::from_millis(self.rng.random_range(0..8)));
                            if !hosts[index].killed && !hosts[index].done {
                                self.kill(&mut hosts[index])?;
                                self.count(wanted);
                            }
                        }
                        continue;
                    }
                    self.answer(&line, &epoch);
                    let host = &mut hosts[index];
                    if !host.killed {
                        host.send_next();
                    }
                }
                Ok(Msg::Eof(index)) => {
                    let host = &mut hosts[index];
                    if !host.killed {
                        let status = host.child.wait()?;
                        if !status.success() || host.next < host.script.len() {
                            let log = std::fs::read_to_string(
                                self.root.join("logs").join(format!("host-{index}.err")),
                            )
                            .unwrap_or_default();
                            self.violations.push(format!(
                                "host process {index} exited on its own ({status}) after {:?}: {}",
                                host.script.get(host.next.saturating_sub(1)),
                                log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                            ));
                        }
                    }
                    host.done = true;
                    host.waiting_since = None;
                    open -= 1;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        // Phase kills that never met their phase are not counted.
        self.stopped.clear();
        self.server.admin_retrying("faults/clear", "{}")?;
        self.check()?;
        Ok(())
    }

    fn answer(&mut self, line: &str, epoch: &str) {
        if let Some(rest) = line.strip_prefix("attached ") {
            if let Some(id) = rest.split(' ').next() {
                self.sandbox = Some(id.to_owned());
            }
        } else if let Some(rest) = line.strip_prefix("exit ") {
            self.commands_ok += 1;
            let output = rest
                .split_once(' ')
                .map_or("", |(_, out)| out)
                .replace("\\n", "\n");
            if let Some(problem) = stateless_command(&output, epoch) {
                self.violations.push(problem);
            }
        } else if line.starts_with("error ") {
            self.commands_failed += 1;
            if line.contains("no longer the writer") {
                self.fenced += 1;
            }
        }
    }

    /// SIGCONT to stopped processes whose time has come.
    fn resume_due(&mut self, hosts: &[Host], now: Instant) -> Result<(), Error> {
        let (due, later): (Vec<_>, Vec<_>) = self.stopped.drain(..).partition(|(at, _)| *at <= now);
        self.stopped = later;
        for (_, i) in due {
            if !hosts[i].killed && !hosts[i].done {
                signal(hosts[i].pid, "CONT")?;
                self.note(format!("host {i} continued"));
            }
        }
        Ok(())
    }

    /// Two-host mode: reads the current sandbox's writer record and committed marker.
    fn observe_generations(&mut self) {
        if self.hosts != 2 {
            return;
        }
        let Some(id) = self.sandbox.clone() else {
            return;
        };
        let home = self.server.sandbox_hermes_home(&id);
        let record = home.with_file_name(".hermes.writer").join("record");
        let watch = self.generations.entry(id).or_default();
        let mut found = Vec::new();
        // The script replaces the record by a rename: a reading is whole.
        if let Ok(line) = std::fs::read_to_string(&record) {
            found.extend(watch.record(line.trim_end()));
        }
        // A marker still being written (no newline yet) is read again next time.
        if let Ok(text) = std::fs::read_to_string(home.join(MARKER))
            && text.ends_with('\n')
        {
            found.extend(watch.marker(text.trim_end()));
        }
        for violation in found {
            self.note(format!("violation: {violation}"));
            self.violations.push(violation);
        }
    }

    fn check(&mut self) -> Result<(), Error> {
        self.observe_generations();
        let log = std::fs::read_to_string(&self.push_log).unwrap_or_default();
        if self.hosts == 2 {
            // One host's processes never push at once (C1); across hosts the record fences.
            for machine in 0..2 {
                let pids: HashSet<&str> = self
                    .machine_pids
                    .iter()
                    .filter(|(_, m)| *m == machine)
                    .map(|(pid, _)| pid.as_str())
                    .collect();
                let own: String = log
                    .lines()
                    .filter(|line| line.split(' ').nth(1).is_some_and(|pid| pids.contains(pid)))
                    .map(|line| format!("{line}\n"))
                    .collect();
                self.violations.extend(overlapping_pushes(&own));
            }
        } else {
            self.violations.extend(overlapping_pushes(&log));
        }
        let outside = self.outside_home();
        for path in outside.difference(&self.outside_baseline) {
            self.violations.push(format!(
                "written outside the Hermes home: {}",
                path.display()
            ));
        }
        self.outside_baseline = outside;
        if let Ok(entries) = std::fs::read_dir(&self.home) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if !["skills", "memories", "cache"].iter().any(|n| name == *n) {
                    self.violations.push(format!(
                        "unexpected entry in the Hermes home: {}",
                        name.to_string_lossy()
                    ));
                }
            }
        }
        let mut found = HashSet::new();
        contents(&self.home.join("skills"), &mut found);
        contents(&self.home.join("memories"), &mut found);
        contents(&self.home.join("cache").join("e2b-recovered"), &mut found);
        if let Ok(sandboxes) = std::fs::read_dir(self.root.join("state").join("sandboxes")) {
            for sandbox in sandboxes.flatten() {
                let remote = sandbox.path().join("home").join(".hermes");
                contents(&remote.join("skills"), &mut found);
                contents(&remote.join("memories"), &mut found);
            }
        }
        let lost: Vec<String> = self
            .ledger
            .lost(&found)
            .into_iter()
            .map(str::to_owned)
            .collect();
        for content in lost {
            self.violations
                .push(format!("lost: {}", content.trim_end()));
            self.ledger.reported(&content);
        }
        Ok(())
    }
}

/// Sends `kill -<name>` to `pid` (SIGSTOP / SIGCONT of a host process the campaign started).
/// How long the processes of a SIGKILLed e2b-local may take to die with it.
const SURVIVOR_BOUND: Duration = Duration::from_secs(5);

/// `(ppid, start time)` of a live process; `None` once it is gone or a zombie.
fn ppid_and_start(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// Every live descendant of `root` as `(pid, start time)`, so a recycled pid is not taken
/// for a survivor.
fn descendants(root: u32) -> Vec<(u32, u64)> {
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| ppid_and_start(pid).map(|(ppid, start)| (pid, ppid, start)))
        .collect();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for &(pid, ppid, start) in &all {
            if ppid == parent {
                found.push((pid, start));
                parents.push(pid);
            }
        }
    }
    found
}

fn signal(pid: u32, name: &str) -> Result<(), Error> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{name} {pid}: {status}").into())
    }
}
