//! 100 MiB of command output, and 64 MiB each way through gzip-coded `/files`, through
//! e2b-client with bounded memory, measured by a counting allocator that tracks only the
//! client's thread (e2b-local runs on other threads). The tests take turns (the counters
//! are process-wide).
//!
//! A test binary of its own, outside `tests/it/`: its `#[global_allocator]` is process-wide.
#![allow(clippy::print_stdout)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use agent_sandbox_examples::e2b_client::{
    ApiKey, Client, Config, ContentCoding, CreateOptions, OnTimeout, ProcessEvent, StartOptions,
    WriteOptions,
};
use agent_sandbox_examples::e2b_local::Server;
use bytes::Bytes;
use futures::StreamExt;

/// Held by each test for its whole run: one measurement at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Counts live heap bytes allocated and freed by threads that opted in.
struct Counting;

thread_local! {
    static TRACKED: Cell<bool> = const { Cell::new(false) };
}

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn tracked() -> bool {
    // `try_with`: allocations during thread teardown must not panic.
    TRACKED.try_with(Cell::get).unwrap_or(false)
}

fn add(bytes: usize) {
    let delta = isize::try_from(bytes).unwrap_or(isize::MAX);
    let live = LIVE.fetch_add(delta, Ordering::Relaxed) + delta;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn sub(bytes: usize) {
    LIVE.fetch_sub(
        isize::try_from(bytes).unwrap_or(isize::MAX),
        Ordering::Relaxed,
    );
}

// SAFETY: every method forwards to the system allocator unchanged; the counters are plain
// atomics and thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() && tracked() {
            add(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if tracked() {
            sub(layout.size());
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() && tracked() {
            sub(layout.size());
            add(new_size);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const OUTPUT: u64 = 100 << 20;
/// What the client may hold at once: frames are ~44 KiB, hyper's read buffer is at most
/// ~400 KiB; 8 MiB leaves room for the runtime while being 12x less than the output.
const BOUND: isize = 8 << 20;

#[test]
fn hundred_mib_of_output_with_bounded_memory() {
    // contract: O1
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // e2b-local lives on its own runtime and threads, so its buffers are not counted.
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server_thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let server = Server::start_loopback().await.expect("e2b-local");
            url_tx.send(server.url()).expect("send url");
            let _ = stop_rx.await;
            server.shutdown().await.expect("shutdown");
        });
    });
    let url = url_rx.recv().expect("server url");

    // The client runs on this thread only (a current-thread runtime), so everything it
    // allocates is counted.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let (total, max_chunk, chunks, peak) = runtime.block_on(async {
        let mut config = Config::new(ApiKey::new("memory-test-key".to_owned()));
        config.api_url = Some(url.clone());
        config.sandbox_url = Some(url.clone());
        config.request_deadline = Duration::from_secs(60);
        let client = Client::new(config).expect("client");
        let mut options = CreateOptions::new("base".to_owned());
        options.on_timeout = OnTimeout::Kill;
        let info = client.create(options).await.expect("create");
        let sandbox = client.sandbox(info.envd_access()).expect("sandbox");

        TRACKED.with(|t| t.set(true));
        let baseline = LIVE.load(Ordering::Relaxed);
        PEAK.store(baseline, Ordering::Relaxed);
        let mut events = sandbox
            .start(StartOptions::shell(format!("head -c {OUTPUT} /dev/zero")))
            .await
            .expect("start");
        let mut total: u64 = 0;
        let mut max_chunk = 0usize;
        let mut chunks = 0u64;
        let mut exit_code = None;
        while let Some(event) = events.next().await {
            match event.expect("event") {
                // Each chunk is dropped here, as soon as it is counted.
                ProcessEvent::Stdout(chunk) => {
                    total += chunk.len() as u64;
                    max_chunk = max_chunk.max(chunk.len());
                    chunks += 1;
                }
                ProcessEvent::End(end) => exit_code = Some(end.exit_code),
                _ => {}
            }
        }
        drop(events);
        let peak = PEAK.load(Ordering::Relaxed) - baseline;
        TRACKED.with(|t| t.set(false));
        assert_eq!(exit_code, Some(0));
        client.kill(&info.sandbox_id).await.expect("kill");
        (total, max_chunk, chunks, peak)
    });
    println!(
        "streamed {total} bytes in {chunks} chunks (largest {max_chunk} B); \
         peak client heap above baseline: {} KiB",
        peak / 1024
    );
    stop_tx.send(()).expect("server running");
    server_thread.join().expect("server thread");

    assert_eq!(total, OUTPUT);
    assert!(max_chunk <= 64 * 1024, "{max_chunk}");
    assert!(chunks >= OUTPUT / (64 * 1024), "{chunks}");
    assert!(peak < BOUND, "peak {peak} bytes");
}

const GZIP_FILE: u64 = 64 << 20;

#[test]
fn sixty_four_mib_through_gzip_both_ways_with_bounded_memory() {
    // The e2b-client README's "Streaming, bounded memory", for gzip-coded /files.
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server_thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let server = Server::start_loopback().await.expect("e2b-local");
            url_tx.send(server.url()).expect("send url");
            let _ = stop_rx.await;
            server.shutdown().await.expect("shutdown");
        });
    });
    let url = url_rx.recv().expect("server url");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let (size, downloaded, peak) = runtime.block_on(async {
        let mut config = Config::new(ApiKey::new("memory-test-key".to_owned()));
        config.api_url = Some(url.clone());
        config.sandbox_url = Some(url.clone());
        config.request_deadline = Duration::from_secs(120);
        let client = Client::new(config).expect("client");
        let mut options = CreateOptions::new("base".to_owned());
        options.on_timeout = OnTimeout::Kill;
        let info = client.create(options).await.expect("create");
        let sandbox = client.sandbox(info.envd_access()).expect("sandbox");

        TRACKED.with(|t| t.set(true));
        let baseline = LIVE.load(Ordering::Relaxed);
        PEAK.store(baseline, Ordering::Relaxed);
        // Made as it is sent: 64 KiB chunks of varied (still compressible) text.
        let chunks = (0..GZIP_FILE / (64 << 10)).map(|i| {
            let line = format!("chunk {i} of a file that compresses well\n");
            let chunk: Vec<u8> = line.bytes().cycle().take(64 << 10).collect();
            Ok::<Bytes, std::io::Error>(Bytes::from(chunk))
        });
        sandbox
            .write_file_stream_with(
                "big.txt",
                futures::stream::iter(chunks),
                &WriteOptions::new(ContentCoding::Gzip),
            )
            .await
            .expect("gzip upload");
        let mut download = sandbox
            .read_file_stream_with("big.txt", GZIP_FILE, ContentCoding::Gzip)
            .await
            .expect("gzip download");
        let mut downloaded: u64 = 0;
        while let Some(chunk) = download.next().await {
            downloaded += chunk.expect("chunk").len() as u64;
        }
        drop(download);
        let peak = PEAK.load(Ordering::Relaxed) - baseline;
        TRACKED.with(|t| t.set(false));
        let size = sandbox.stat("big.txt").await.expect("stat").size;
        client.kill(&info.sandbox_id).await.expect("kill");
        (size, downloaded, peak)
    });
    println!(
        "gzip: uploaded and downloaded {downloaded} bytes; peak client heap above baseline: {} KiB",
        peak / 1024
    );
    stop_tx.send(()).expect("server running");
    server_thread.join().expect("server thread");
    assert_eq!(size, GZIP_FILE, "the sandbox holds the decoded file");
    assert_eq!(downloaded, GZIP_FILE);
    assert!(peak < BOUND, "peak {peak} bytes");
}
