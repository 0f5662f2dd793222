//! A test world: an in-process e2b-local server on a manual clock, a profile home, and
//! helpers to build backends and inspect the server.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime};

use agent_sandbox::{
    ApiKeySource, Backend, ChannelSink, CommandExit, Config, Endpoints, HookError, ManualClock,
    NoStateHooks, PushKind, RunOptions, SandboxMode, Scope, Services, StateHooks, StateTransport,
};
use e2b_client::{ApiKey, Client, ListQuery, ListedSandbox, SandboxId};
use futures::TryStreamExt;

/// Serialises the tests of one binary. e2b-local runs sandbox commands as child processes of
/// the test process; between fork and exec a child briefly shares every open file
/// description, writer-lease's lock files included, so a concurrent test's fork can make a
/// released lock look held for an instant. One test at a time keeps lock assertions exact.
static SERIAL: Mutex<()> = Mutex::new(());

pub struct World {
    pub runtime: tokio::runtime::Runtime,
    pub server: Option<e2b_local::Server>,
    pub home: tempfile::TempDir,
    pub clock: Arc<ManualClock>,
    /// The backends of this world share one fleet, as a process's do (L14).
    pub fleet: agent_sandbox::Fleet,
    pub url: String,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = self.runtime.block_on(server.shutdown());
        }
    }
}

impl World {
    pub fn new() -> World {
        let serial = SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut config = e2b_local::ServerConfig::loopback();
        config.clock =
            e2b_local::Clock::manual(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        let server = runtime
            .block_on(e2b_local::Server::start(config))
            .expect("e2b-local starts");
        let url = server.url();
        World {
            runtime,
            server: Some(server),
            home: tempfile::tempdir().expect("temp home"),
            clock: Arc::new(ManualClock::new()),
            fleet: agent_sandbox::Fleet::new(),
            url,
            _serial: serial,
        }
    }

    pub fn server(&self) -> &e2b_local::Server {
        self.server.as_ref().expect("server running")
    }

    pub fn config(&self, mode: SandboxMode) -> Config {
        let mut config = Config::new(ApiKeySource::Key(ApiKey::new("test-local-key".to_owned())));
        config.endpoints = Endpoints::single(self.url.clone());
        config.mode = mode;
        config
    }

    pub fn scope(&self, task_id: &str) -> Scope {
        Scope {
            profile_home: self.home.path().to_path_buf(),
            task_id: task_id.to_owned(),
        }
    }

    pub fn services(&self) -> Services {
        Services {
            runtime: self.runtime.handle().clone(),
            clock: self.clock.clone(),
            progress: None,
            fleet: self.fleet.clone(),
            random: Arc::new(agent_sandbox::SystemRandom),
        }
    }

    pub fn backend(&self, mode: SandboxMode, task: &str, hooks: Arc<dyn StateHooks>) -> Backend {
        Backend::new(self.config(mode), self.scope(task), self.services(), hooks).expect("backend")
    }

    pub fn persistent(&self) -> Backend {
        self.persistent_task("default")
    }

    pub fn persistent_task(&self, task: &str) -> Backend {
        self.backend(SandboxMode::Persistent, task, Arc::new(NoStateHooks))
    }

    pub fn client(&self) -> Client {
        let mut config = e2b_client::Config::new(ApiKey::new("test-local-key".to_owned()));
        config.api_url = Some(self.url.clone());
        config.sandbox_url = Some(self.url.clone());
        Client::new(config).expect("client")
    }

    pub fn list(&self) -> Vec<ListedSandbox> {
        let client = self.client();
        self.runtime
            .block_on(client.list(ListQuery::all()).try_collect())
            .expect("list")
    }

    pub fn detail(&self, id: &str) -> Result<e2b_client::SandboxDetail, e2b_client::Error> {
        let client = self.client();
        let id = SandboxId::parse(id.to_owned()).expect("id");
        self.runtime.block_on(client.get(&id))
    }

    /// The raw JSON body of `GET /sandboxes/{id}`: what the server stored, including the
    /// fields e2b-client does not parse (such as `pauseMode`).
    pub fn raw_detail(&self, id: &str) -> String {
        use std::io::{Read, Write};
        let address = self.url.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(address).expect("connect to e2b-local");
        write!(
            stream,
            "GET /sandboxes/{id} HTTP/1.1\r\nHost: {address}\r\nX-API-Key: test-local-key\r\n\
             Connection: close\r\n\r\n"
        )
        .expect("send request");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read response");
        let (head, body) = response.split_once("\r\n\r\n").expect("a response body");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body.to_owned()
    }

    /// Moves both clocks: the server's (lease expiry) and the backend's (lease tracking).
    pub fn advance(&self, by: Duration) {
        self.server().clock().advance(by);
        self.clock.advance(by);
    }

    pub fn coordination_dir(&self) -> PathBuf {
        self.home.path().join("cache").join("e2b")
    }

    pub fn scope_files(&self, backend: &Backend) -> writer_lease::ScopeFiles {
        let key: writer_lease::ScopeKey = backend.scope_digest().parse().expect("scope key");
        writer_lease::ScopeFiles::new(self.coordination_dir(), key)
    }
}

/// Runs a command to completion, returning its exit and its merged output.
pub fn run(
    backend: &Backend,
    command: &str,
) -> Result<(CommandExit, String), agent_sandbox::Error> {
    let (tx, rx) = mpsc::channel();
    let handle = backend.run(
        command,
        RunOptions::new(Duration::from_secs(60)),
        Box::new(ChannelSink::unbounded(tx)),
    )?;
    let exit = handle
        .wait()
        .map_err(|error| agent_sandbox::Error::InvalidConfig {
            reason: error.to_string(),
        })?;
    let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
    Ok((exit, String::from_utf8_lossy(&output).into_owned()))
}

/// Runs a command that must succeed and returns its output.
/// Runs `command` in the sandbox directly (no backend, no role); it must succeed.
pub fn sandbox_shell(world: &World, id: &str, command: &str) {
    let sandbox = direct_sandbox(world, id);
    let output = world
        .runtime
        .block_on(sandbox.run(e2b_client::StartOptions::shell(command.to_owned()), 4096))
        .expect("run");
    assert_eq!(output.end.exit_code, 0, "{command}");
}

/// A file in the sandbox, read directly (no backend, no role); `None` when it cannot be read.
pub fn sandbox_file(world: &World, id: &str, path: &str) -> Option<Vec<u8>> {
    let sandbox = direct_sandbox(world, id);
    world
        .runtime
        .block_on(sandbox.read_file(path, 1 << 20))
        .ok()
        .map(|bytes| bytes.to_vec())
}

/// The sandbox `id` reached directly through the client (an extend-only connect, which also
/// resumes it), bypassing any backend.
fn direct_sandbox(world: &World, id: &str) -> e2b_client::Sandbox {
    let client = world.client();
    let id = e2b_client::SandboxId::parse(id.to_owned()).expect("id");
    world.runtime.block_on(async {
        let connected = client
            .connect(&id, Duration::from_secs(300))
            .await
            .expect("connect");
        client
            .sandbox(connected.sandbox.envd_access())
            .expect("sandbox")
    })
}

/// Starts a command that runs until `release` exists in its sandbox; its output comes on
/// the returned channel once it ends.
pub fn hold_until(
    backend: &Backend,
    release: &str,
) -> (
    agent_sandbox::RunningCommand,
    mpsc::Receiver<agent_sandbox::Chunk>,
) {
    let (tx, rx) = mpsc::channel();
    let command = backend
        .run(
            &format!("while [ ! -e {release} ]; do sleep 0.05; done; echo released"),
            RunOptions::new(Duration::from_secs(120)),
            Box::new(ChannelSink::unbounded(tx)),
        )
        .expect("held command starts");
    (command, rx)
}

/// What a command sent on a channel sink, as text.
pub fn output(rx: &mpsc::Receiver<agent_sandbox::Chunk>) -> String {
    let bytes: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub fn ok(backend: &Backend, command: &str) -> String {
    let (exit, output) = run(backend, command).expect("command runs");
    assert_eq!(exit.exit_code, 0, "{command}: {output}");
    output
}

/// Hooks that push the host's skills/ tree and pull the teardown archive into memory,
/// recording every call; failures can be switched on.
#[derive(Default)]
pub struct RecordingHooks {
    pub calls: Mutex<Vec<String>>,
    pub fail_initial: AtomicBool,
    pub fail_sync: AtomicBool,
    pub pulls: AtomicUsize,
    pub pulled: Mutex<Vec<u8>>,
    /// Host files (relative to the home) that existed when the initial push ran.
    pub seen_at_push: Mutex<Vec<String>>,
    pub home: Mutex<Option<PathBuf>>,
}

impl RecordingHooks {
    pub fn new(home: &Path) -> Arc<RecordingHooks> {
        let hooks = RecordingHooks::default();
        *hooks.home.lock().unwrap() = Some(home.to_path_buf());
        Arc::new(hooks)
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// The host's skills, named under the sandbox's state root (the transport's, which
    /// follows the sandbox's real home).
    fn host_files(&self, remote_hermes_home: &str) -> Vec<(PathBuf, String)> {
        let home = self.home.lock().unwrap().clone().expect("home");
        let mut files = Vec::new();
        let skills = home.join("skills");
        collect(&skills, &skills, &mut files);
        files
            .into_iter()
            .map(|(path, rel)| (path, format!("{remote_hermes_home}/skills/{rel}")))
            .collect()
    }
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, out);
        } else {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((path, rel));
        }
    }
}

impl StateHooks for RecordingHooks {
    fn push(&self, transport: &StateTransport, kind: PushKind) -> Result<(), HookError> {
        self.calls.lock().unwrap().push(format!("push:{kind:?}"));
        let failing = match kind {
            PushKind::Initial => self.fail_initial.load(Ordering::SeqCst),
            PushKind::Incremental => self.fail_sync.load(Ordering::SeqCst),
        };
        if failing {
            // Like Hermes' FileSyncManager: the failure is swallowed by the sync engine, and
            // only the transport's record tells the backend. Upload to a path the plan
            // refuses to make the transport fail.
            let _ = transport.upload_many(vec![(
                PathBuf::from("/nonexistent/file"),
                "relative/path".to_owned(),
            )]);
            return Ok(());
        }
        if kind == PushKind::Initial {
            let files = self.host_files(transport.remote_hermes_home()?);
            *self.seen_at_push.lock().unwrap() =
                files.iter().map(|(_, remote)| remote.clone()).collect();
            transport.upload_many(files)?;
        }
        Ok(())
    }

    fn pull(&self, transport: &StateTransport) -> Result<(), HookError> {
        self.calls.lock().unwrap().push("pull".to_owned());
        self.pulls.fetch_add(1, Ordering::SeqCst);
        let mut archive = Vec::new();
        // Like Hermes' sync_back: the error is logged and swallowed; the record reports it.
        if transport.download_state(&mut archive).is_ok() {
            *self.pulled.lock().unwrap() = archive;
        }
        Ok(())
    }
}

/// Member names of a tar archive.
pub fn tar_names(archive: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    let mut reader = tar::Archive::new(io::Cursor::new(archive));
    for entry in reader.entries().expect("tar") {
        let entry = entry.expect("entry");
        names.push(entry.path().expect("path").display().to_string());
    }
    names
}

pub fn metadata_of(listed: &ListedSandbox) -> &BTreeMap<String, String> {
    &listed.metadata
}

/// A `tracing` subscriber that keeps every WARN (and worse) event's message, for asserting
/// what the backend warned about. Installed for the calling thread only (the backend logs on
/// the caller's thread), so tests in other threads neither see nor disturb it.
#[derive(Clone, Default)]
pub struct WarningLog {
    events: Arc<Mutex<Vec<String>>>,
}

impl WarningLog {
    /// Runs `f` with this log as the thread's subscriber.
    pub fn capture<R>(&self, f: impl FnOnce() -> R) -> R {
        tracing::subscriber::with_default(self.clone(), f)
    }

    /// The warnings so far, each as its message.
    pub fn warnings(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    /// How many warnings contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.warnings()
            .iter()
            .filter(|w| w.contains(needle))
            .count()
    }
}

struct MessageVisitor(String);

impl tracing::field::Visit for MessageVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for WarningLog {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }

    fn new_span(&self, _span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut visitor = MessageVisitor(String::new());
        event.record(&mut visitor);
        self.events.lock().unwrap().push(visitor.0);
    }

    fn enter(&self, _span: &tracing::span::Id) {}

    fn exit(&self, _span: &tracing::span::Id) {}
}
