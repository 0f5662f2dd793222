//! Examples and workspace integration tests for agent frameworks on E2B sandboxes.
//!
//! This package owns `examples/` (the quickstart, an MCP server, best-of-N over a fork,
//! Hermes inside a sandbox)
//! and the workspace's integration tests in `tests/`. Its library only re-exports the
//! workspace's library crates so that both can name everything through one path. It is
//! not the Hermes plugin: that is the `hermes-e2b` wheel built from `crates/hermes-binding`.
//! Each crate stands on its own; depend on the one you need rather than on this package.
//!
//! ```no_run
//! // Start the embedded E2B-compatible server and point a client at it.
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = agent_sandbox_examples::e2b_local::Server::start_loopback().await?;
//! println!("E2B_API_URL={}", server.url());
//! # Ok(()) }
//! ```

pub use agent_sandbox;
pub use e2b_client;
pub use e2b_local;
pub use recovery;
pub use sandbox_identity;
pub use state_sync;
pub use writer_lease;
