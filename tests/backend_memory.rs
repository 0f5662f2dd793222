//! 1 GiB of command output through `Backend::run` (the path every agent framework, Hermes
//! included, takes) with bounded host memory, measured as the whole process's peak resident
//! set: the backend's runtime threads, its pump and e2b-local all count.
//!
//! A test binary of its own, outside `tests/it/`: the peak it resets and reads is the
//! process's.
#![allow(clippy::print_stdout)]

use std::io;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_examples::agent_sandbox::{
    ApiKeySource, Backend, Config, Endpoints, FnSink, NoStateHooks, OutputStream, RunOptions,
    SandboxMode, Scope, Services,
};
use agent_sandbox_examples::e2b_client::ApiKey;
use agent_sandbox_examples::e2b_local::Server;

const OUTPUT: u64 = 1 << 30;
/// What the process may grow by while 1 GiB streams through it: the client's frames and
/// buffers, the pump's chunks in flight, e2b-local's 32 KiB reads. 64 MiB is 16x less than
/// the output; a copy of the output anywhere would need all of it.
const BOUND: u64 = 64 << 20;

/// The process's peak resident set since the last reset, in bytes (`VmHWM`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("number");
    kib * 1024
}

/// Resets the peak to the current resident set (Linux: `5` to `clear_refs`).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak resident set");
}

#[test]
fn a_gib_of_output_through_backend_run_keeps_host_memory_bounded() {
    // contract: O1
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = runtime
        .block_on(Server::start_loopback())
        .expect("e2b-local");
    let home = tempfile::tempdir().expect("home");
    let mut config = Config::new(ApiKeySource::Key(ApiKey::new("memory-test-key".to_owned())));
    config.endpoints = Endpoints::single(server.url());
    config.mode = SandboxMode::Ephemeral {
        lifetime: Duration::from_secs(600),
    };
    let backend = Backend::new(
        config,
        Scope {
            profile_home: home.path().to_path_buf(),
            task_id: "memory".to_owned(),
        },
        Services::new(runtime.handle().clone()),
        Arc::new(NoStateHooks),
    )
    .expect("backend");
    // Attach and warm every path first, so the peak measures streaming, not bring-up.
    let warm = backend
        .run(
            "head -c 1048576 /dev/zero",
            RunOptions::new(Duration::from_secs(60)),
            Box::new(FnSink(|_: OutputStream, _: &[u8]| Ok(()))),
        )
        .expect("warm-up")
        .wait()
        .expect("warm-up ends");
    assert_eq!(warm.exit_code, 0);

    reset_peak();
    let baseline = peak_rss();
    let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sink_count = counted.clone();
    let exit = backend
        .run(
            &format!("head -c {OUTPUT} /dev/zero"),
            RunOptions::new(Duration::from_secs(600)),
            Box::new(FnSink(move |stream: OutputStream, bytes: &[u8]| {
                if stream == OutputStream::Stdout {
                    sink_count.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
                io::Result::Ok(())
            })),
        )
        .expect("start")
        .wait()
        .expect("the command ends");
    let grown = peak_rss().saturating_sub(baseline);
    let total = counted.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "Backend::run streamed {total} bytes; peak resident set grew by {} KiB (bound {} KiB)",
        grown / 1024,
        BOUND / 1024
    );
    backend.cleanup();
    runtime.block_on(server.shutdown()).expect("shutdown");

    assert_eq!(exit.exit_code, 0);
    assert_eq!(total, OUTPUT);
    assert!(grown < BOUND, "peak grew by {grown} bytes");
}
