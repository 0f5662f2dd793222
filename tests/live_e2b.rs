//! Live tests against the real E2B service: billable, so compiled only with the `live`
//! feature, which `scripts/test` turns on only when `E2B_API_KEY` and the explicit opt-in
//! `HERMES_E2B_LIVE=1` are both set:
//!
//! ```text
//! E2B_API_KEY=e2b_... HERMES_E2B_LIVE=1 scripts/test
//! E2B_API_KEY=e2b_... cargo test -p agent-sandbox-examples --features live --test live_e2b
//! ```
//!
//! They create two sandboxes of the `base` template, one per test.
//!
//! A test binary of its own, outside `tests/it/`, so that `--test live_e2b` runs exactly the
//! billable tests and nothing else.
//!
//! Every sandbox they create has on-timeout kill and a short lease, so a crashed run
//! cleans up after itself within two minutes.
#![cfg(feature = "live")]

use std::sync::{Arc, mpsc};
use std::time::Duration;

use agent_sandbox_examples::agent_sandbox::{
    ApiKeySource, Backend, ChannelSink, Config as BackendConfig, Endpoints, NoStateHooks,
    RunOptions, SandboxMode, Scope, Services,
};
use agent_sandbox_examples::e2b_client::{
    ApiKey, Client, Config, CreateOptions, KillOutcome, ListQuery, OnTimeout, StartOptions,
    UploadFile,
};
use bytes::Bytes;

fn key() -> ApiKey {
    // The feature is an opt-in already; the variable makes a stray `--all-features` build
    // fail loudly instead of spending money.
    assert_eq!(
        std::env::var("HERMES_E2B_LIVE").as_deref(),
        Ok("1"),
        "live tests create billable sandboxes: set HERMES_E2B_LIVE=1 beside E2B_API_KEY"
    );
    ApiKey::from_env().expect("the live feature needs E2B_API_KEY")
}

#[tokio::test]
async fn the_client_drives_a_real_sandbox_end_to_end() {
    use futures::StreamExt as _;

    let client = Client::new(Config::from_env(key())).expect("client");
    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(120));
    options.on_timeout = OnTimeout::Kill;
    options
        .metadata
        .insert("hermes-e2b-test".to_owned(), "live".to_owned());
    let info = client.create(options).await.expect("create");
    let id = info.sandbox_id.clone();

    let mut query = ListQuery::all();
    query
        .metadata
        .insert("hermes-e2b-test".to_owned(), "live".to_owned());
    let listed: Vec<_> = client.list(query).collect().await;
    assert!(
        listed
            .iter()
            .any(|item| item.as_ref().is_ok_and(|s| s.sandbox_id == id)),
        "the new sandbox is listed by its metadata"
    );

    let sandbox = client.sandbox(info.envd_access()).expect("envd");
    let output = sandbox
        .start(StartOptions::shell("echo live; whoami".to_owned()))
        .await
        .expect("start")
        .collect_output(1 << 20)
        .await
        .expect("output");
    assert_eq!(output.end.exit_code, 0);
    assert_eq!(&output.stdout[..], b"live\nuser\n");

    sandbox
        .write_files(vec![UploadFile::bytes(
            "/home/user/live/a/b.txt".to_owned(),
            Bytes::from_static(b"round trip"),
        )])
        .await
        .expect("upload");
    let read = sandbox
        .read_file("/home/user/live/a/b.txt", 1024)
        .await
        .expect("download");
    assert_eq!(&read[..], b"round trip");

    assert_eq!(client.kill(&id).await.expect("kill"), KillOutcome::Killed);
    assert_eq!(
        client.kill(&id).await.expect("kill again"),
        KillOutcome::NotFound
    );
}

#[test]
fn an_ephemeral_backend_runs_a_command_and_kills_its_sandbox() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut config = BackendConfig::new(ApiKeySource::Key(key()));
    let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    config.endpoints = Endpoints {
        domain: var("E2B_DOMAIN"),
        api_url: var("E2B_API_URL"),
        sandbox_url: var("E2B_SANDBOX_URL"),
    };
    config.mode = SandboxMode::Ephemeral {
        lifetime: Duration::from_secs(60),
    };
    let home = tempfile::tempdir().expect("home");
    let scope = Scope {
        profile_home: home.path().to_path_buf(),
        task_id: "live".to_owned(),
    };
    let backend = Backend::new(
        config,
        scope,
        Services::new(runtime.handle().clone()),
        Arc::new(NoStateHooks),
    )
    .expect("backend");
    let (tx, rx) = mpsc::sync_channel(64);
    let exit = backend
        .run(
            "echo from-backend",
            RunOptions::new(Duration::from_secs(60)),
            Box::new(ChannelSink::bounded(tx)),
        )
        .expect("run")
        .wait()
        .expect("wait");
    assert_eq!(exit.exit_code, 0);
    let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
    assert_eq!(output, b"from-backend\n");
    let report = backend.cleanup();
    assert!(!report.repeated);
}
