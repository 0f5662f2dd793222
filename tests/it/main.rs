//! The workspace's integration tests, folded into one test binary so the examples and the
//! client suite link once: e2b-client against an in-process e2b-local, and each example run
//! end to end the way a user runs it.
//!
//! `e2b_client_memory.rs` and `live_e2b.rs` stay separate binaries; their module docs say why.

mod best_of_n_example;
mod contract;
mod e2b_client;
mod hermes_in_sandbox_example;
mod mcp_example;
mod module_cycles;
mod quickstart;
mod support;
