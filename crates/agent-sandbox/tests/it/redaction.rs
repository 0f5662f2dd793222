//! Contract X4 end to end: credentials planted in every source of text the backend quotes
//! (a sandbox command's stderr, file names the sandbox chose and recovery warns about, hook
//! error messages, a server's error body) appear in no error (`Display`, [`ErrorChain`]) and
//! in no `tracing` record the backend emits.

#![allow(clippy::print_stdout)] // Prints the property's case count as a figure.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use agent_sandbox::{
    ApiKeySource, Backend, Config, Endpoints, ErrorChain, HookError, NoStateHooks, PushKind,
    SandboxMode, StateHooks, StateTransport,
};
use e2b_client::ApiKey;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};

use crate::support::{World, ok};

/// One set of planted secrets.
#[derive(Debug, Clone)]
struct Secrets {
    /// The 40 hex digits after `e2b_`.
    key: String,
    /// The token after `Bearer `.
    token: String,
    /// The user and password of `https://user:pass@host/...`.
    user: String,
    pass: String,
}

impl Secrets {
    fn strategy() -> impl Strategy<Value = Secrets> {
        (
            "[0-9a-f]{40}",
            "[A-Za-z0-9]{16,28}",
            "[a-z][a-z0-9]{9,14}",
            "[A-Za-z0-9]{12,20}",
        )
            .prop_map(|(key, token, user, pass)| Secrets {
                key,
                token: format!("Tk{token}"),
                user: format!("u{user}"),
                pass: format!("P{pass}"),
            })
    }

    /// All three shapes in one text.
    fn text(&self) -> String {
        format!(
            "key e2b_{} auth Bearer {} url https://{}:{}@files.example.com/a/b",
            self.key, self.token, self.user, self.pass
        )
    }

    /// A file name carrying what a name can carry (no `/`, so no URL).
    fn file_name(&self) -> String {
        format!("e2b_{} Bearer {}.md", self.key, self.token)
    }

    fn values(&self) -> [&str; 4] {
        [&self.key, &self.token, &self.user, &self.pass]
    }

    /// Fails the case if any planted value appears in `text`, which was rendered from `source`.
    fn absent_from(&self, source: &str, text: &str) -> Result<(), TestCaseError> {
        for value in self.values() {
            prop_assert!(!text.contains(value), "{source} leaks {value:?}: {text:?}");
        }
        Ok(())
    }
}

/// Checks an error's own `Display` and its whole chain, and that the planted text reached it.
fn check_error(
    secrets: &Secrets,
    source: &str,
    error: &agent_sandbox::Error,
) -> Result<(), TestCaseError> {
    let display = error.to_string();
    let chain = ErrorChain(error).to_string();
    secrets.absent_from(source, &display)?;
    secrets.absent_from(source, &chain)?;
    prop_assert!(
        chain.contains(e2b_client::REDACTED),
        "{source}: the planted text never reached the error, so nothing was tested: {chain:?}"
    );
    Ok(())
}

/// Every `tracing` record of the process (all levels, message and fields), captured by a
/// global subscriber: the backend also logs from its runtime's threads.
fn records() -> &'static Mutex<Vec<String>> {
    static RECORDS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let records = RECORDS.get_or_init(|| Mutex::new(Vec::new()));
    INSTALLED.get_or_init(|| {
        // Another test binary's subscriber cannot be here; this one is the first and only.
        let _ = tracing::subscriber::set_global_default(Capture);
    });
    records
}

struct Capture;

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _metadata: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        records().lock().unwrap().push(fields.0);
    }
    fn enter(&self, _span: &tracing::span::Id) {}
    fn exit(&self, _span: &tracing::span::Id) {}
}

/// Hooks whose initial push fails with the planted text.
struct FailingHooks(String);

impl StateHooks for FailingHooks {
    fn push(&self, _transport: &StateTransport, kind: PushKind) -> Result<(), HookError> {
        match kind {
            PushKind::Initial => Err(self.0.clone().into()),
            PushKind::Incremental => Ok(()),
        }
    }

    fn pull(&self, _transport: &StateTransport) -> Result<(), HookError> {
        Ok(())
    }
}

/// A server that answers every request with HTTP 500 and the current body.
fn error_server(body: Arc<Mutex<String>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0_u8; 8192];
            let _ = stream.read(&mut request);
            let text = body.lock().unwrap().clone();
            let json = format!(r#"{{"code":500,"message":"{text}"}}"#);
            let _ = write!(
                stream,
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{json}",
                json.len()
            );
        }
    });
    url
}

/// The cases the property runs; `PROPTEST_CASES` overrides it.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256)
}

#[test]
fn planted_secrets_reach_no_error_and_no_log_record() {
    // contract: X4
    let records = records();
    let world = World::new();
    let body = Arc::new(Mutex::new(String::new()));
    let server_url = error_server(body.clone());
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(RunnerConfig {
        cases: cases(),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let result = runner.run(&Secrets::strategy(), |secrets| {
        let n = case.fetch_add(1, Ordering::SeqCst);
        records.lock().unwrap().clear();

        // 1. A hook's error message.
        let hooked = world.backend(
            SandboxMode::Persistent,
            &format!("hook-{n}"),
            Arc::new(FailingHooks(secrets.text())),
        );
        let error = hooked.attach().expect_err("the initial push fails");
        check_error(&secrets, "hook error", &error)?;
        hooked.cleanup();
        hooked.finalize();

        // 2. A sandbox command's stderr: `rm -f` of a directory the sandbox named.
        let task = format!("files-{n}");
        let name = secrets.file_name();
        let first = world.persistent_task(&task);
        let dir = format!("/home/user/.hermes/skills/{name}");
        ok(&first, &format!("mkdir -p '{dir}'"));
        let error = first
            .transport()
            .expect("transport")
            .delete_many(vec![dir])
            .expect_err("rm -f refuses a directory");
        check_error(&secrets, "sandbox stderr", &error)?;

        // 3. A file name recovery warns about: the sandbox and the host disagree on it.
        let conflict = format!("conflict {name}");
        std::fs::create_dir_all(world.home.path().join("skills")).unwrap();
        std::fs::write(world.home.path().join("skills").join(&conflict), "host").unwrap();
        ok(
            &first,
            &format!("echo sandbox > '/home/user/.hermes/skills/{conflict}'"),
        );
        first.cleanup();
        first.finalize();
        let second = world.persistent_task(&task);
        second
            .attach()
            .expect("the second session adopts and recovers");
        second.cleanup();
        second.finalize();

        // 4. A server's error body.
        *body.lock().unwrap() = secrets.text();
        let mut config = Config::new(ApiKeySource::Key(ApiKey::new("test-local-key".to_owned())));
        config.endpoints = Endpoints::single(server_url.clone());
        config.mode = SandboxMode::Persistent;
        let failing = Backend::new(
            config,
            world.scope(&format!("server-{n}")),
            world.services(),
            Arc::new(NoStateHooks),
        )
        .expect("backend");
        let error = failing.attach().expect_err("the server answers 500");
        check_error(&secrets, "server error body", &error)?;
        failing.finalize();

        let logged = std::mem::take(&mut *records.lock().unwrap());
        for record in &logged {
            secrets.absent_from("a tracing record", record)?;
        }
        prop_assert!(
            logged
                .iter()
                .any(|r| r.contains("not restored in place") && r.contains(e2b_client::REDACTED)),
            "recovery's warning about the planted name was not logged: {logged:?}"
        );
        Ok(())
    });
    let ran = case.load(Ordering::SeqCst);
    // The case count, for the record (cargo test shows it with --nocapture).
    println!("X4 redaction property: {ran} cases, every source planted in each");
    if let Err(failure) = result {
        panic!("{failure}");
    }
    assert!(ran >= cases() as usize);
}

/// A server that answers every request with HTTP 500 and an error body quoting the API key
/// the request carried, as a careless self-hosted deployment might.
fn key_echoing_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0_u8; 8192];
            let n = stream.read(&mut request).unwrap_or(0);
            let head = String::from_utf8_lossy(&request[..n]).into_owned();
            let key = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("x-api-key")
                        .then(|| value.trim().to_owned())
                })
                .unwrap_or_default();
            let json = format!(r#"{{"code":500,"message":"key {key} is not valid here"}}"#);
            let _ = write!(
                stream,
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{json}",
                json.len()
            );
        }
    });
    url
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if let Ok(bytes) = std::fs::read(&path)
            && bytes.windows(needle.len()).any(|w| w == needle)
        {
            found.push(path);
        }
    }
    found
}

#[test]
fn keys_of_any_shape_reach_no_sandbox_error_log_or_host_file() {
    // contract: X1 — self-hosted deployments accept any key, so nothing here looks like an
    // E2B key, a bearer token or a URL credential: only the known-value redaction of the
    // configured key can hide it (shape patterns, X4, would not).
    let records = records();
    let world = World::new();
    let echo_url = key_echoing_server();
    let keys = [
        "sk-selfhosted-Zq8wPL2mXv",
        "hunter2hunter2",
        "3f0c1a9e-5b7d-4e21-9c3a-7d2b8e6f4a10",
        "Ab9+/xYz0=",
        "plain key with spaces",
    ];
    for (n, key) in keys.into_iter().enumerate() {
        records.lock().unwrap().clear();
        // A working session on e2b-local: the key is in no sandbox process's environment or
        // command line, and in no file the backend wrote on the host.
        let mut config = world.config(SandboxMode::Persistent);
        config.api_key = ApiKeySource::Key(ApiKey::new(key.to_owned()));
        let backend = Backend::new(
            config,
            world.scope(&format!("shape-{n}")),
            world.services(),
            Arc::new(NoStateHooks),
        )
        .expect("backend");
        let inside = ok(
            &backend,
            "env; for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do tr '\\0' ' ' < \"$f\" 2>/dev/null; echo; done",
        );
        assert!(inside.contains("PATH="), "the listing ran: {inside}");
        assert!(
            !inside.contains(key),
            "{key:?} inside the sandbox: {inside}"
        );
        backend.cleanup();
        backend.finalize();
        let written = files_containing(world.home.path(), key.as_bytes());
        assert!(written.is_empty(), "{key:?} in host files {written:?}");

        // A server that quotes the key back in its error: the error and the log hide it.
        let mut config = Config::new(ApiKeySource::Key(ApiKey::new(key.to_owned())));
        config.endpoints = Endpoints::single(echo_url.clone());
        config.mode = SandboxMode::Persistent;
        let failing = Backend::new(
            config,
            world.scope(&format!("echo-{n}")),
            world.services(),
            Arc::new(NoStateHooks),
        )
        .expect("backend");
        let error = failing.attach().expect_err("the server answers 500");
        failing.finalize();
        let chain = ErrorChain(&error).to_string();
        for text in [error.to_string(), chain.clone(), format!("{error:?}")] {
            assert!(!text.contains(key), "{key:?} in an error: {text}");
        }
        assert!(
            chain.contains("is not valid here") && chain.contains(e2b_client::REDACTED),
            "the echoed key never reached the error, so nothing was tested: {chain}"
        );
        let logged = std::mem::take(&mut *records.lock().unwrap());
        assert!(!logged.is_empty(), "the failed attach logged nothing");
        for record in &logged {
            assert!(!record.contains(key), "{key:?} in a log record: {record}");
        }
    }
}
