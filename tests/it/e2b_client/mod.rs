//! e2b-client against an in-process e2b-local: every operation, E2B's lifecycle driven by the
//! server's clock, injected faults, typed outcomes and error hygiene. The helpers here are
//! shared by the submodules, one per area.

mod code;
mod control;
mod faults;
mod files;
mod git;
mod metrics;
mod processes;
mod readme;
mod snapshots;
mod templates;
mod terminal;
mod transfer;
mod volumes;
mod watch;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use agent_sandbox_examples::e2b_client::{
    ApiKey, Client, Config, ConnectState, CreateOptions, Error, FileType, Health, Jitter,
    KillOutcome, ListQuery, ListedSandbox, MakeDirOutcome, OnTimeout, PauseMemory, PauseOutcome,
    ProcessEvent, RetryPolicy, Sandbox, SandboxId, SandboxInfo, SandboxState, Signal,
    SignalOutcome, StartOptions, StateFilter, UploadFile,
};
use agent_sandbox_examples::e2b_local::{
    Clock, DropRule, FailRule, FaultScope, Server, ServerConfig,
};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

/// A server whose lease clock only moves when the test says so.
pub(super) async fn server() -> Server {
    let mut config = ServerConfig::loopback();
    config.clock = Clock::manual(SystemTime::now());
    Server::start(config).await.expect("e2b-local starts")
}

pub(super) fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
        jitter: Jitter::None,
    }
}

pub(super) fn config_for(server: &Server, key: &str) -> Config {
    let mut config = Config::new(ApiKey::new(key.to_owned()));
    config.api_url = Some(server.url());
    config.sandbox_url = Some(server.url());
    config.retry = fast_retry();
    config.request_deadline = Duration::from_secs(30);
    config
}

pub(super) fn client(server: &Server) -> Client {
    Client::new(config_for(server, "e2b_integration_key_0123456789")).expect("valid config")
}

pub(super) async fn create(
    client: &Client,
    on_timeout: OnTimeout,
    secs: u64,
) -> (SandboxInfo, Sandbox) {
    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(secs));
    options.on_timeout = on_timeout;
    let info = client.create(options).await.expect("created");
    let sandbox = client.sandbox(info.envd_access()).expect("envd handle");
    (info, sandbox)
}

pub(super) async fn lease_secs(client: &Client, id: &SandboxId) -> i64 {
    let detail = client.get(id).await.expect("get");
    (detail.summary.end_at - detail.summary.started_at).whole_seconds()
}

pub(super) async fn sh(sandbox: &Sandbox, cmd: &str) -> String {
    let output = sandbox
        .run(StartOptions::shell(cmd.to_owned()), 1 << 20)
        .await
        .expect("command ran");
    assert_eq!(output.end.exit_code, 0, "{cmd}: {output:?}");
    String::from_utf8(output.stdout.to_vec()).expect("utf-8")
}

pub(super) async fn list_all(client: &Client, query: ListQuery) -> Vec<ListedSandbox> {
    client.list(query).try_collect().await.expect("list")
}
