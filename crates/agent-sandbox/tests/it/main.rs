//! agent-sandbox's integration tests, one binary: each module was once its own test file.
//! They share `support` (an in-process e2b-local world); `support::World` serialises them.

mod account_limit;
mod arbitration;
mod campaign;
mod checkpoints;
mod commands;
mod credentials;
mod egress;
mod fencing;
mod fetch;
mod first_contact;
mod home;
mod inventory;
mod kernel;
mod lifecycle;
mod live;
mod ownership;
mod processes;
mod push_base;
mod quiet;
mod redaction;
mod requests;
mod secret_store;
mod state;
mod state_failures;
mod subagents;
mod support;
mod teardown;
mod turns;
mod watchdog;
