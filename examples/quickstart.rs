//! The main job on the embedded default: an E2B sandbox on this machine.
//!
//! Starts e2b-local in-process on a free loopback port, points the native E2B client at
//! it, and walks through what an agent backend does with a sandbox: create it, stream a
//! command's output as it is produced, write and read files, pause it, and resume it with
//! its files intact.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! The same client talks to E2B itself when `E2B_API_URL`/`E2B_SANDBOX_URL` are unset and
//! a real `E2B_API_KEY` is given; this example always uses the local server.

#![allow(clippy::print_stdout)]

use std::io::Write as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use hermes_e2b::e2b_client::{
    ApiKey, Client, Config, ConnectState, CreateOptions, OnTimeout, PauseMemory, PauseOutcome,
    ProcessEvent, StartOptions, UploadFile,
};
use hermes_e2b::e2b_local::Server;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    let server = Server::start_loopback().await?;
    println!("e2b-local listening on {}", server.url());

    // The local server accepts any non-empty key; a real one would come from E2B_API_KEY.
    let mut config = Config::new(ApiKey::new("quickstart-local-key".to_owned()));
    config.api_url = Some(server.url());
    config.sandbox_url = Some(server.url());
    let client = Client::new(config)?;

    // Persistent-style lifecycle: when the lease runs out the sandbox pauses, keeping files.
    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(300));
    options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    options
        .metadata
        .insert("example".to_owned(), "quickstart".to_owned());
    let info = client.create(options).await?;
    let id = info.sandbox_id.clone();
    println!("created sandbox {id}");

    let sandbox = client.sandbox(info.envd_access())?;

    // Output is delivered chunk by chunk while the command is still running.
    println!("\n$ for i in 1 2 3; do echo line $i; sleep 0.3; done; whoami; pwd");
    let started = Instant::now();
    let mut events = sandbox
        .start(StartOptions::new(
            "for i in 1 2 3; do echo line $i; sleep 0.3; done; whoami; pwd".to_owned(),
        ))
        .await?;
    while let Some(event) = events.next().await {
        match event? {
            ProcessEvent::Start { pid } => println!("  [started, pid {pid}]"),
            ProcessEvent::Stdout(chunk) => {
                print!(
                    "  [+{:>4} ms] {}",
                    started.elapsed().as_millis(),
                    String::from_utf8_lossy(&chunk)
                );
                std::io::stdout().flush()?;
            }
            ProcessEvent::Stderr(chunk) => eprint!("{}", String::from_utf8_lossy(&chunk)),
            ProcessEvent::End(end) => println!("  [exit code {}]", end.exit_code),
            _ => {}
        }
    }

    // Many files in one request; parent directories are created.
    let written = sandbox
        .write_files(vec![
            UploadFile::bytes(
                "/home/user/project/notes.md".to_owned(),
                Bytes::from_static(b"# notes\nkept across pause and resume\n"),
            ),
            UploadFile::bytes(
                "/home/user/project/src/main.py".to_owned(),
                Bytes::from_static(b"print('hello from the sandbox')\n"),
            ),
        ])
        .await?;
    println!("\nwrote {} files:", written.len());
    for file in &written {
        println!("  {}", file.path);
    }
    let notes = sandbox
        .read_file("/home/user/project/notes.md", 1 << 20)
        .await?;
    println!(
        "read back notes.md:\n  {}",
        String::from_utf8_lossy(&notes)
            .trim_end()
            .replace('\n', "\n  ")
    );

    // Pause, then resume by connecting: the files are still there.
    match client.pause(&id).await? {
        PauseOutcome::Paused => println!("\npaused {id}"),
        PauseOutcome::AlreadyPaused => println!("\n{id} was already paused"),
    }
    let state = client.get(&id).await?.summary.state;
    println!("state after pause: {state:?}");

    let connected = client.connect(&id, Duration::from_secs(300)).await?;
    let how = match connected.state {
        ConnectState::Resumed => "resumed",
        ConnectState::Running => "was still running",
    };
    println!("connect: {how}");
    // A resume can hand out a new envd token or domain, so use the returned access.
    let sandbox = client.sandbox(connected.sandbox.envd_access())?;
    let output = sandbox
        .start(StartOptions::new(
            "cat /home/user/project/notes.md && python3 /home/user/project/src/main.py 2>/dev/null || true"
                .to_owned(),
        ))
        .await?
        .collect_output(1 << 20)
        .await?;
    println!(
        "after resume:\n  {}",
        String::from_utf8_lossy(&output.stdout)
            .trim_end()
            .replace('\n', "\n  ")
    );

    client.kill(&id).await?;
    println!("\nkilled {id}");
    server.shutdown().await?;
    Ok(())
}
