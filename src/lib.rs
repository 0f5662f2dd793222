//! The E2B sandbox backend for agents, as one dependency.
//!
//! This facade re-exports the workspace's library crates so that examples and
//! integration tests can name everything through one path. Each crate stands on
//! its own; depend on the one you need rather than on this facade.
//!
//! ```no_run
//! // Start the embedded E2B-compatible server and point a client at it.
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = hermes_e2b::e2b_local::Server::start_loopback().await?;
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
