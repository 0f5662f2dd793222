//! An E2B-compatible server for one machine: control plane and envd on one loopback port, for development and tests.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), e2b_local::Error> {
//! // Any E2B client (the official SDK included) can use this URL as both
//! // E2B_API_URL and E2B_SANDBOX_URL, with any non-empty API key.
//! let server = e2b_local::Server::start_loopback().await?;
//! assert!(server.url().starts_with("http://127.0.0.1:"));
//! // Lease expiry is driven by an injectable clock, so tests never sleep.
//! server.clock().advance(std::time::Duration::from_secs(600));
//! server.shutdown().await
//! # }
//! ```
//!
//! What it is: a real server, not a mock. It implements the E2B control-plane routes
//! (v1 and v2 create/connect, list with the double-encoded metadata filter and paging,
//! get, timeout, pause, kill) with E2B's lifecycle (lease expiry pauses or kills,
//! connect only extends, set-timeout may shorten, pause of a paused sandbox is 409),
//! and envd's Process and Filesystem RPCs over Connect JSON plus `/files`, with one
//! real process per command. A request carrying an `E2b-Sandbox-Id` header is an envd
//! request for that sandbox; every other request is a control-plane request.
//!
//! What it is not: a security boundary. Each sandbox gets its own directory, seen by
//! its commands as `/home/user` with a private `/tmp`, and its own PID namespace (and,
//! with internet access off, a network namespace with only loopback) where the OS
//! allows, but commands run on the host kernel next to everything else.
//! Memory is never kept across a pause: a paused sandbox keeps its files only.
//!
//! For clients nobody here wrote: a body the handler left unread is read (up to
//! 256 KiB) before the answer goes out, so keep-alive connections survive early errors;
//! E2B routes it lacks answer 501; every answer carries `Server-Timing`; requests are
//! logged at debug (target `e2b_local::request`).
//!
//! Knobs for reliability tests ([`Faults`], [`Clock`], and the `/_e2b_local/` admin
//! routes) inject latency, 5xx answers, dropped connections and streams, vanishing
//! and pausing sandboxes, and move the clock. [`Server::requests`] counts the requests
//! received per route, so tests can prove how many requests a client sends.
//!
//! # Module layering
//!
//! A module imports only modules on lower lines, or along an arrow on its own line, so
//! there are no import circles: a type two modules share lives below both.
//!
//! ```text
//! server                     Server, dispatch (admin | envd | rest)
//! rest -> admin -> faults    control plane, /_e2b_local/ routes, fault rules applied
//! envd -> envd::{process, filesystem, files} -> envd::ctx -> envd::connect
//! app                        the state every handler shares
//! store, config              sandbox records and lifecycle; ServerConfig
//! process_table, fault_state, requests, parse -> reply
//! clock, isolation -> sandbox_ns, paths, plane, body, error
//! ```

#![deny(missing_docs)]

mod admin;
mod app;
mod body;
mod clock;
mod config;
mod envd;
mod error;
mod fault_state;
mod faults;
mod isolation;
mod parse;
mod paths;
mod plane;
mod process_table;
mod reply;
mod requests;
mod rest;
mod sandbox_ns;
mod server;
mod store;

pub use clock::Clock;
pub use config::{ApiKeyPolicy, ServerConfig};
pub use error::Error;
pub use fault_state::{DropRule, FailRule, FaultScope};
pub use faults::Faults;
pub use isolation::IsolationMode;
pub use requests::RequestCounts;
pub use server::Server;
