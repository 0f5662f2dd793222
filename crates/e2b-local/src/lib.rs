#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod admin;
mod app;
mod body;
mod builds;
mod clock;
mod config;
mod conn;
mod egress;
mod envd;
mod error;
mod fault_state;
mod faults;
mod freeze;
mod identity;
mod interpreter;
mod isolation;
mod kernels;
mod metrics;
mod parse;
mod paths;
mod plane;
mod private_json;
mod process_table;
mod pty;
mod reply;
mod requests;
mod rest;
mod sandbox_log;
mod sandbox_ns;
mod secrets;
mod server;
mod snapshots;
mod store;
mod token;
mod tree_copy;
mod volumes;
mod watch;

pub use clock::Clock;
pub use config::{ApiKeyPolicy, ServerConfig};
pub use error::Error;
pub use fault_state::{DropRule, FailRule, FaultScope, HoldRule, Release};
pub use faults::Faults;
pub use isolation::IsolationMode;
pub use requests::RequestCounts;
pub use server::Server;
