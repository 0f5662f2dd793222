//! The e2b-local process: start, restart on the same port and state directory, and its
//! admin routes (`/_e2b_local/...`) for faults and quiescence.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use crate::faults::signal;
use crate::{API_KEY, Error};

/// Longest wait for e2b-local to announce its URL.
const SERVER_START_BOUND: Duration = Duration::from_secs(30);

/// The e2b-local process.
pub(crate) struct LocalServer {
    bin: PathBuf,
    state: PathBuf,
    log: PathBuf,
    port: u16,
    child: Child,
    _stdin: ChildStdin,
    admin: Admin,
}

/// The admin routes' client: reqwest on a current-thread runtime of its own (the engine is
/// synchronous). No connection is kept between requests: e2b-local is killed and restarted
/// under it, and its injected connection drops should meet fresh connections, as before.
struct Admin {
    runtime: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl Admin {
    fn new() -> Result<Admin, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(Admin { runtime, http })
    }
}

impl LocalServer {
    pub(crate) fn start(
        bin: &Path,
        state: &Path,
        log: &Path,
        port: u16,
    ) -> Result<LocalServer, Error> {
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
            admin: Admin::new()?,
        })
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, a gap during which connections are refused, then a start on the same port
    /// and state directory. Returns a violation when a process of the killed server (a
    /// sandbox's namespace init, a command) outlived it.
    pub(crate) fn restart(&mut self, gap: Duration) -> Result<Option<String>, Error> {
        let before = descendants(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + SURVIVOR_BOUND;
        let mut left = before;
        while !left.is_empty() && Instant::now() < deadline {
            // A bounded poll: a parent-death signal is delivered asynchronously.
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
        let request = self
            .admin
            .http
            .post(format!("{}/_e2b_local/{path}", self.url()))
            .header("X-API-Key", API_KEY)
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        let status = self
            .admin
            .runtime
            // Inside the runtime: sending starts reqwest's timer.
            .block_on(async { request.send().await })?
            .status();
        Ok(status.as_u16())
    }

    /// Waits until no counted request is in flight and no process runs at e2b-local: a host
    /// killed mid-request may leave one running there (an upload, a commit script that goes on
    /// after its client is gone), and the campaign's sandbox-side edits stand for writes that
    /// come after it, as a command's would.
    pub(crate) fn quiesce(&self, within: Duration) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            let request = self
                .admin
                .http
                .get(format!("{}/_e2b_local/requests", self.url()))
                .header("X-API-Key", API_KEY);
            let answer: serde_json::Value = self.admin.runtime.block_on(async {
                let body = request.send().await?.error_for_status()?.bytes().await?;
                Ok::<_, Error>(serde_json::from_slice(&body)?)
            })?;
            let field = |name: &str| {
                answer[name]
                    .as_u64()
                    .ok_or_else(|| format!("no {name} in e2b-local's answer {answer}"))
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

    /// One admin GET (`/_e2b_local/...`); its JSON answer.
    pub(crate) fn admin_get(&self, path: &str) -> Result<serde_json::Value, Error> {
        let request = self
            .admin
            .http
            .get(format!("{}/_e2b_local/{path}", self.url()))
            .header("X-API-Key", API_KEY);
        self.admin.runtime.block_on(async {
            let body = request.send().await?.error_for_status()?.bytes().await?;
            Ok::<_, Error>(serde_json::from_slice(&body)?)
        })
    }

    /// Every running or paused sandbox, as the adoption rule sees a list answer (through
    /// e2b-client, as the hosts list).
    pub(crate) fn live_sandboxes(&self) -> Result<Vec<sandbox_identity::Candidate>, Error> {
        use futures::TryStreamExt as _;
        let mut config = e2b_client::Config::new(e2b_client::ApiKey::new(API_KEY.to_owned()));
        config.api_url = Some(self.url());
        config.sandbox_url = Some(self.url());
        let client = e2b_client::Client::new(config)?;
        let listed: Vec<e2b_client::ListedSandbox> = self.admin.runtime.block_on(
            client
                .list(e2b_client::ListQuery::all())
                .try_collect::<Vec<_>>(),
        )?;
        Ok(listed
            .into_iter()
            .map(|listed| sandbox_identity::Candidate {
                sandbox_id: listed.sandbox_id.as_str().to_owned(),
                template_id: listed.template_id,
                template_alias: listed.alias,
                metadata: listed.metadata,
                started_at: std::time::SystemTime::from(listed.started_at),
                state: match listed.state {
                    e2b_client::SandboxState::Running => sandbox_identity::SandboxState::Running,
                    e2b_client::SandboxState::Paused => sandbox_identity::SandboxState::Paused,
                    _ => sandbox_identity::SandboxState::Other,
                },
            })
            .collect())
    }

    /// Admin requests may meet the faults they set up (a dropped connection): retry a few
    /// times; the caller decides whether a failure matters.
    pub(crate) fn admin_retrying(&self, path: &str, body: &str) -> Result<u16, Error> {
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

    pub(crate) fn sandbox_hermes_home(&self, sandbox_id: &str) -> PathBuf {
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
