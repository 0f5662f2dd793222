//! `e2b-local serve`: the E2B-compatible local server as a process.
#![allow(clippy::print_stdout)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use e2b_local::{
    ApiKeyPolicy, Clock, DropRule, FailRule, FaultScope, IsolationMode, Server, ServerConfig,
};

#[derive(Debug, Parser)]
#[command(
    name = "e2b-local",
    version,
    about = "An E2B-compatible server for development and tests (not a security boundary)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the E2B control plane and envd on one port.
    Serve(ServeArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum IsolationArg {
    Auto,
    Namespace,
    PathMapping,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ScopeArg {
    Any,
    Rest,
    Envd,
}

impl From<ScopeArg> for FaultScope {
    fn from(scope: ScopeArg) -> FaultScope {
        match scope {
            ScopeArg::Any => FaultScope::Any,
            ScopeArg::Rest => FaultScope::Rest,
            ScopeArg::Envd => FaultScope::Envd,
        }
    }
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Accept only this API key (default: any non-empty key).
    #[arg(long)]
    api_key: Option<String>,
    /// Keep sandboxes here (survives restarts); default: a temporary directory.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Extra template names (`base` always exists).
    #[arg(long = "template")]
    templates: Vec<String>,
    /// How commands are isolated.
    #[arg(long, value_enum, default_value = "auto")]
    isolation: IsolationArg,
    /// Latency added to every request, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// At most N sandboxes running at once (E2B's account limit); creates and resumes
    /// past it get E2B's 429. Default: no limit.
    #[arg(long, value_name = "N")]
    max_running: Option<u32>,
    /// Fail the next N requests with --fail-status.
    #[arg(long, default_value_t = 0)]
    fail_next: u32,
    /// HTTP status of injected failures.
    #[arg(long, default_value_t = 503)]
    fail_status: u16,
    /// Which requests the injected failures hit.
    #[arg(long, value_enum, default_value = "any")]
    fail_scope: ScopeArg,
    /// Drop (accept and close) the next N connections.
    #[arg(long, default_value_t = 0)]
    drop_connections: u32,
    /// Cut the next envd response after this many body bytes.
    #[arg(long)]
    drop_stream_after: Option<u64>,
    /// Extra PEM roots trusted for the upstreams of a sandbox's header rules
    /// (network.rules), besides the host's store; repeatable.
    #[arg(long, value_name = "FILE")]
    upstream_ca: Vec<PathBuf>,
    /// A name every sandbox resolves to IP, as `docker run --add-host`; repeatable.
    #[arg(long, value_name = "NAME:IP", value_parser = parse_add_host)]
    add_host: Vec<(String, IpAddr)>,
    /// The Python the code interpreter's kernels run instead of the sandbox's python3 (an
    /// absolute path, e.g. a venv's bin/python with numpy, pandas and matplotlib).
    #[arg(long, value_name = "PATH")]
    kernel_python: Option<PathBuf>,
    /// Exit when standard input reaches end of file (so a test harness cannot leak it).
    #[arg(long)]
    exit_on_stdin_eof: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("e2b-local: starting the runtime failed: {error}");
            return ExitCode::FAILURE;
        }
    };
    let Command::Serve(args) = cli.command;
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Display names the failed step only; the causes follow it on the line.
            let mut line = error.to_string();
            let mut cause = std::error::Error::source(&error);
            while let Some(inner) = cause {
                line.push_str(": ");
                line.push_str(&inner.to_string());
                cause = inner.source();
            }
            eprintln!("{line}");
            ExitCode::FAILURE
        }
    }
}

/// `NAME:IP` (an IPv6 address after the first colon is fine): a DNS name, no wildcard.
fn parse_add_host(text: &str) -> Result<(String, IpAddr), String> {
    let (name, ip) = text
        .split_once(':')
        .ok_or_else(|| format!("'{text}' is not NAME:IP"))?;
    let ip: IpAddr = ip
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("'{ip}' is not an IP address"))?;
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!("'{name}' is not a host name"));
    }
    Ok((name.to_owned(), ip))
}

async fn serve(args: ServeArgs) -> Result<(), e2b_local::Error> {
    let mut templates = vec!["base".to_owned()];
    templates.extend(args.templates.iter().filter(|t| *t != "base").cloned());
    let config = ServerConfig {
        listen: args.listen,
        api_key: args
            .api_key
            .clone()
            .map_or(ApiKeyPolicy::AnyNonEmpty, ApiKeyPolicy::Exact),
        state_dir: args.state_dir.clone(),
        templates,
        clock: Clock::system(),
        isolation: match args.isolation {
            IsolationArg::Auto => IsolationMode::Auto,
            IsolationArg::Namespace => IsolationMode::MountNamespace,
            IsolationArg::PathMapping => IsolationMode::PathMapping,
        },
        latency: Duration::from_millis(args.latency_ms),
        max_running: args.max_running,
        upstream_ca: args.upstream_ca.clone(),
        add_hosts: args.add_host.clone(),
        kernel_python: args.kernel_python.clone(),
    };
    // Handlers first: a signal that arrives right after the URL lines must stop the
    // server cleanly, not kill it with the default action.
    let stop = StopSignals::install();
    let server = Server::start(config).await?;
    let faults = server.faults();
    if args.fail_next > 0 {
        let mut rule = FailRule::new(args.fail_next, args.fail_status);
        rule.scope = args.fail_scope.into();
        faults.fail_next(rule);
    }
    faults.drop_next_connections(args.drop_connections);
    if let Some(bytes) = args.drop_stream_after {
        faults.drop_streams(DropRule::new(1, bytes));
    }
    {
        let mut out = std::io::stdout().lock();
        // Test harnesses parse these lines; flush so they see them at once. The SDKs' volume
        // content client reads its own variable (by default `https://api.<domain>`).
        let _ = writeln!(out, "E2B_API_URL={}", server.url());
        let _ = writeln!(out, "E2B_SANDBOX_URL={}", server.url());
        let _ = writeln!(out, "E2B_VOLUME_API_URL={}", server.url());
        let _ = out.flush();
    }
    let stdin = if args.exit_on_stdin_eof {
        StdinWatch::ExitOnEof
    } else {
        StdinWatch::Ignore
    };
    stop.wait(stdin).await;
    server.shutdown().await
}

/// Whether standard input's end stops the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StdinWatch {
    Ignore,
    ExitOnEof,
}

/// SIGTERM and SIGINT listeners, installed before the server announces itself.
struct StopSignals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn install() -> StopSignals {
        use tokio::signal::unix::{SignalKind, signal};
        StopSignals {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }

    async fn wait(self, stdin: StdinWatch) {
        let exit_on_stdin_eof = stdin == StdinWatch::ExitOnEof;
        let StopSignals { mut term, mut int } = self;
        let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
        if exit_on_stdin_eof {
            // A plain thread: tokio's stdin needs a feature we do not enable, and a
            // blocking read is exactly what this watch is.
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                let mut stdin = std::io::stdin().lock();
                while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
                let _ = eof_tx.send(());
            });
        } else {
            drop(eof_tx);
        }
        let stdin_eof = async {
            if exit_on_stdin_eof {
                let _ = eof_rx.await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let on = |s: &mut Option<tokio::signal::unix::Signal>| {
            let s = s.take();
            async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
        };
        tokio::select! {
            () = on(&mut term) => {}
            () = on(&mut int) => {}
            () = stdin_eof => {}
        }
    }
}
