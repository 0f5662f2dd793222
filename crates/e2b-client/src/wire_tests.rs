//! Tests of the client against small in-process HTTP servers: headers, routes, retries,
//! deadlines, streaming and caps as they happen on a real socket.

mod blocking;
mod control;
mod files;
mod first_contact;
mod metrics;
mod network;
mod processes;
mod secrets;
mod snapshots;
mod support;
mod templates;
mod terminal;
mod transport;
mod watch;
