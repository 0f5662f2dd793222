//! Request accounting for tests: how many requests of each kind the server received.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};

use crate::plane::Plane;

/// A snapshot of the request counter (see [`crate::Server::requests`]).
///
/// Every request except the `/_e2b_local/` admin routes is counted once, when it arrives and
/// before any injected fault or latency applies (a request failed by a fault rule was still
/// sent). Connections dropped by [`crate::Faults::drop_next_connections`] carry no request
/// and are not counted.
///
/// Routes are named by stable labels:
///
/// | label | request |
/// |---|---|
/// | `create`, `list`, `get`, `connect`, `resume`, `timeout`, `refreshes`, `pause`, `kill` | the control-plane operation (v1 and v2 alike) |
/// | `snapshot`, `fork`, `list snapshots`, `delete template` | `POST /sandboxes/{id}/snapshots`, `POST /sandboxes/{id}/fork`, `GET /snapshots`, `DELETE /templates/{id}` |
/// | `list secrets`, `create secret`, `get secret`, `update secret`, `delete secret` | `GET`/`POST /secrets`, `GET`/`POST`/`DELETE /secrets/{id or name}` |
/// | `health` | control-plane `GET /health` |
/// | `Process/<Rpc>`, `Filesystem/<Rpc>` | envd RPCs, e.g. `Process/Start`, `Process/SendSignal`, `Filesystem/Stat` |
/// | `files GET`, `files POST` | envd `/files` download and upload (pre-signed ones too) |
/// | `envd health`, `envd envs` | envd `GET /health`, `GET /envs` |
/// | `rest other`, `envd other` | anything else (unknown routes, RPCs or methods) |
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestCounts {
    by_route: BTreeMap<&'static str, u64>,
}

impl RequestCounts {
    /// Requests received with this label (0 when none).
    pub fn get(&self, route: &str) -> u64 {
        self.by_route.get(route).copied().unwrap_or(0)
    }

    /// Every counted request.
    pub fn total(&self) -> u64 {
        self.by_route.values().sum()
    }

    /// Control-plane requests.
    pub fn rest(&self) -> u64 {
        self.total() - self.envd()
    }

    /// envd requests.
    pub fn envd(&self) -> u64 {
        self.by_route
            .iter()
            .filter(|(route, _)| is_envd(route))
            .map(|(_, count)| count)
            .sum()
    }

    /// The routes with a non-zero count, in label order.
    pub fn routes(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.by_route
            .iter()
            .filter(|(_, count)| **count > 0)
            .map(|(route, count)| (*route, *count))
    }

    /// What arrived after `earlier` (a snapshot of the same server taken before this one),
    /// so a test can measure one step without resetting the counter.
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        let by_route = self
            .by_route
            .iter()
            .map(|(route, count)| (*route, count.saturating_sub(earlier.get(route))))
            .filter(|(_, count)| *count > 0)
            .collect();
        RequestCounts { by_route }
    }

    /// The JSON form served at `GET /_e2b_local/requests`:
    /// `{"total": n, "rest": n, "envd": n, "routes": {"Process/Start": n, ...}}`.
    pub fn to_json(&self) -> Value {
        let routes: serde_json::Map<String, Value> = self
            .routes()
            .map(|(route, count)| (route.to_owned(), Value::from(count)))
            .collect();
        json!({
            "total": self.total(),
            "rest": self.rest(),
            "envd": self.envd(),
            "routes": routes,
        })
    }
}

fn is_envd(route: &str) -> bool {
    route.starts_with("Process/")
        || route.starts_with("Filesystem/")
        || route.starts_with("files ")
        || route.starts_with("envd ")
}

/// The live counter shared by the request pipeline and the admin routes.
#[derive(Debug, Default)]
pub(crate) struct RequestCounter {
    counts: Mutex<RequestCounts>,
    // Summed over counted requests, arrival to the last byte of the answer, so a benchmark
    // can subtract the server's share from a client's wall time.
    server_micros: AtomicU64,
    // Answers whose body has not ended yet, so a benchmark can wait for the last one before
    // it reads `server_micros`.
    in_flight: AtomicU64,
}

impl RequestCounter {
    pub(crate) fn record(&self, plane: Plane, method: &Method, path: &str) {
        let route = if plane == Plane::Envd {
            envd_route(method, path)
        } else {
            rest_route(method, path)
        };
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.by_route.entry(route).or_insert(0) += 1;
    }

    pub(crate) fn snapshot(&self) -> RequestCounts {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Adds one counted request's time in the server (arrival to the end of its answer).
    pub(crate) fn add_server_time(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.server_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The summed server time of the counted requests, in microseconds.
    pub(crate) fn server_micros(&self) -> u64 {
        self.server_micros.load(Ordering::Relaxed)
    }

    /// Counted answers whose body is still being sent.
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A counted request arrived; [`RequestCounter::left`] follows once its answer is done.
    pub(crate) fn arrived(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A counted request's answer is done (or its client went away).
    pub(crate) fn left(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn reset(&self) {
        self.server_micros.store(0, Ordering::Relaxed);
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_route
            .clear();
    }
}

// Labels are static and drawn from fixed lists, so a client cannot grow the map with
// made-up paths.
const PROCESS_RPCS: &[(&str, &str)] = &[
    ("Start", "Process/Start"),
    ("Connect", "Process/Connect"),
    ("List", "Process/List"),
    ("SendInput", "Process/SendInput"),
    ("StreamInput", "Process/StreamInput"),
    ("CloseStdin", "Process/CloseStdin"),
    ("SendSignal", "Process/SendSignal"),
    ("Update", "Process/Update"),
];

const FILESYSTEM_RPCS: &[(&str, &str)] = &[
    ("Stat", "Filesystem/Stat"),
    ("MakeDir", "Filesystem/MakeDir"),
    ("ListDir", "Filesystem/ListDir"),
    ("Remove", "Filesystem/Remove"),
    ("Move", "Filesystem/Move"),
    ("WatchDir", "Filesystem/WatchDir"),
    ("CreateWatcher", "Filesystem/CreateWatcher"),
    ("GetWatcherEvents", "Filesystem/GetWatcherEvents"),
    ("RemoveWatcher", "Filesystem/RemoveWatcher"),
];

fn lookup(table: &[(&str, &'static str)], rpc: &str) -> Option<&'static str> {
    table
        .iter()
        .find(|(name, _)| *name == rpc)
        .map(|(_, label)| *label)
}

fn envd_route(method: &Method, path: &str) -> &'static str {
    const OTHER: &str = "envd other";
    if let Some(rpc) = path.strip_prefix("/process.Process/") {
        return lookup(PROCESS_RPCS, rpc).unwrap_or(OTHER);
    }
    if let Some(rpc) = path.strip_prefix("/filesystem.Filesystem/") {
        return lookup(FILESYSTEM_RPCS, rpc).unwrap_or(OTHER);
    }
    match (method, path) {
        (&Method::GET, "/files") => "files GET",
        (&Method::POST, "/files") => "files POST",
        (&Method::GET, "/health") => "envd health",
        (&Method::GET, "/envs") => "envd envs",
        _ => OTHER,
    }
}

fn rest_route(method: &Method, path: &str) -> &'static str {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // v2 routes name the same operations as v1.
    let segments = match segments.as_slice() {
        ["v2", rest @ ..] => rest,
        all => all,
    };
    match (method, segments) {
        (&Method::GET, ["health"]) => "health",
        (&Method::POST, ["sandboxes"]) => "create",
        (&Method::GET, ["sandboxes"]) => "list",
        (&Method::GET, ["sandboxes", _]) => "get",
        (&Method::DELETE, ["sandboxes", _]) => "kill",
        (&Method::POST, ["sandboxes", _, "connect"]) => "connect",
        (&Method::POST, ["sandboxes", _, "resume"]) => "resume",
        (&Method::POST, ["sandboxes", _, "timeout"]) => "timeout",
        (&Method::POST, ["sandboxes", _, "refreshes"]) => "refreshes",
        (&Method::POST, ["sandboxes", _, "pause"]) => "pause",
        (&Method::POST, ["sandboxes", _, "snapshots"]) => "snapshot",
        (&Method::POST, ["sandboxes", _, "fork"]) => "fork",
        (&Method::PUT, ["sandboxes", _, "network"]) => "update network",
        (&Method::GET, ["snapshots"]) => "list snapshots",
        (&Method::DELETE, ["templates", _]) => "delete template",
        (&Method::GET, ["secrets"]) => "list secrets",
        (&Method::POST, ["secrets"]) => "create secret",
        (&Method::GET, ["secrets", _]) => "get secret",
        (&Method::POST, ["secrets", _]) => "update secret",
        (&Method::DELETE, ["secrets", _]) => "delete secret",
        _ => "rest other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter_with(requests: &[(bool, Method, &str)]) -> RequestCounter {
        let counter = RequestCounter::default();
        for (envd, method, path) in requests {
            let plane = if *envd { Plane::Envd } else { Plane::Rest };
            counter.record(plane, method, path);
        }
        counter
    }

    #[test]
    fn control_plane_routes_are_named_by_operation() {
        let counter = counter_with(&[
            (false, Method::POST, "/sandboxes"),
            (false, Method::POST, "/v2/sandboxes"),
            (false, Method::GET, "/v2/sandboxes"),
            (false, Method::GET, "/sandboxes"),
            (false, Method::GET, "/sandboxes/abc"),
            (false, Method::DELETE, "/sandboxes/abc"),
            (false, Method::POST, "/sandboxes/abc/connect"),
            (false, Method::POST, "/v2/sandboxes/abc/connect"),
            (false, Method::POST, "/sandboxes/abc/resume"),
            (false, Method::POST, "/sandboxes/abc/timeout"),
            (false, Method::POST, "/sandboxes/abc/refreshes"),
            (false, Method::POST, "/sandboxes/abc/pause"),
            (false, Method::POST, "/sandboxes/abc/snapshots"),
            (false, Method::POST, "/sandboxes/abc/fork"),
            (false, Method::GET, "/snapshots"),
            (false, Method::DELETE, "/templates/local%2Fsnap%3Adefault"),
            (false, Method::GET, "/health"),
            (false, Method::GET, "/secrets"),
            (false, Method::POST, "/secrets"),
            (false, Method::GET, "/secrets/hermes-e2b-x"),
            (false, Method::POST, "/secrets/hermes-e2b-x"),
            (false, Method::DELETE, "/secrets/hermes-e2b-x"),
            (false, Method::PUT, "/sandboxes/abc"),
            (false, Method::GET, "/nowhere"),
        ]);
        let counts = counter.snapshot();
        for (route, expected) in [
            ("create", 2),
            ("list", 2),
            ("get", 1),
            ("kill", 1),
            ("connect", 2),
            ("resume", 1),
            ("timeout", 1),
            ("refreshes", 1),
            ("pause", 1),
            ("snapshot", 1),
            ("fork", 1),
            ("list snapshots", 1),
            ("delete template", 1),
            ("health", 1),
            ("list secrets", 1),
            ("create secret", 1),
            ("get secret", 1),
            ("update secret", 1),
            ("delete secret", 1),
            ("rest other", 2),
        ] {
            assert_eq!(counts.get(route), expected, "{route}");
        }
        assert_eq!(counts.total(), 24);
        assert_eq!(counts.rest(), 24);
        assert_eq!(counts.envd(), 0);
    }

    #[test]
    fn envd_routes_are_named_by_rpc_or_path() {
        let counter = counter_with(&[
            (true, Method::POST, "/process.Process/Start"),
            (true, Method::POST, "/process.Process/Start"),
            (true, Method::POST, "/process.Process/SendSignal"),
            (true, Method::POST, "/process.Process/Invented"),
            (true, Method::POST, "/filesystem.Filesystem/Stat"),
            (true, Method::POST, "/filesystem.Filesystem/MakeDir"),
            (true, Method::GET, "/files"),
            (true, Method::POST, "/files"),
            (true, Method::GET, "/health"),
            (true, Method::GET, "/envs"),
            (true, Method::DELETE, "/files"),
        ]);
        let counts = counter.snapshot();
        assert_eq!(counts.get("Process/Start"), 2);
        assert_eq!(counts.get("Process/SendSignal"), 1);
        assert_eq!(counts.get("Filesystem/Stat"), 1);
        assert_eq!(counts.get("Filesystem/MakeDir"), 1);
        assert_eq!(counts.get("files GET"), 1);
        assert_eq!(counts.get("files POST"), 1);
        assert_eq!(counts.get("envd health"), 1);
        assert_eq!(counts.get("envd envs"), 1);
        assert_eq!(counts.get("envd other"), 2, "unknown RPC and method");
        assert_eq!(counts.get("Process/Invented"), 0, "labels are a fixed set");
        assert_eq!((counts.total(), counts.envd(), counts.rest()), (11, 11, 0));
    }

    #[test]
    fn since_gives_the_difference_and_reset_clears() {
        let counter = counter_with(&[
            (false, Method::GET, "/v2/sandboxes"),
            (true, Method::POST, "/process.Process/Start"),
        ]);
        let before = counter.snapshot();
        counter.record(Plane::Envd, &Method::POST, "/process.Process/Start");
        counter.record(Plane::Rest, &Method::POST, "/sandboxes/x/connect");
        let step = counter.snapshot().since(&before);
        assert_eq!(
            step.routes().collect::<Vec<_>>(),
            vec![("Process/Start", 1), ("connect", 1)]
        );
        assert_eq!(step.get("list"), 0);
        assert_eq!(step.total(), 2);
        assert_eq!(counter.snapshot().total(), 4);
        counter.reset();
        assert_eq!(counter.snapshot(), RequestCounts::default());
    }

    #[test]
    fn json_form_has_totals_and_routes() {
        let counter = counter_with(&[
            (false, Method::POST, "/v2/sandboxes"),
            (true, Method::POST, "/process.Process/Start"),
            (true, Method::POST, "/process.Process/Start"),
        ]);
        assert_eq!(
            counter.snapshot().to_json(),
            json!({
                "total": 3,
                "rest": 1,
                "envd": 2,
                "routes": {"create": 1, "Process/Start": 2},
            })
        );
    }
}
