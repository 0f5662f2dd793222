//! e2b-local's integration tests, one binary (one link, one process) for all of them.

mod cli;
mod egress;
mod egress_api;
mod envd;
mod envd_files;
mod envd_transfer;
mod faults;
mod fidelity;
mod fuzz_corpus;
mod lifecycle;
mod limits;
mod logs;
mod metrics;
mod namespaces;
mod pausing;
mod requests;
mod rest_props;
mod rule_protocols;
mod rules;
mod secret_rules;
mod secrets;
mod snapshots;
mod support;
mod terminal;
mod traffic;
mod watch;
