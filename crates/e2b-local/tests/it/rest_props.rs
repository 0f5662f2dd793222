//! A property test of the REST surface in the spirit of schemathesis (issue 11):
//! generated valid and invalid requests (methods, paths with real, unknown and
//! malformed sandbox ids, query strings, JSON and non-JSON bodies, with and without a
//! key) for every route e2b-local serves. No answer is a 5xx other than 501, and every
//! status is one E2B's `spec/openapi.yml` documents for the route, plus 400 for an
//! invalid request body (the spec's generated server validates bodies on every route)
//! and the HTTP-level 404 (unknown path) and 405 (known path, other method). envd
//! requests may also get the proxy's 502 for a sandbox that is no longer running.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;

use crate::support::{Api, KEY, manual_server, new_sandbox};

/// What a generated request is aimed at.
#[derive(Clone, Debug)]
enum Target {
    Health,
    Sandboxes {
        v2: bool,
    },
    One,
    Action(&'static str),
    V2Connect,
    SnapshotList,
    Template,
    /// `/v3/templates`: a template build's request (POST; other methods are unsupported).
    BuildRequest,
    Unsupported(&'static str),
    Envd(&'static str),
    Admin(&'static str),
    Garbage(String),
}

#[derive(Clone, Debug)]
struct Generated {
    method: reqwest::Method,
    target: Target,
    id: String,
    query: String,
    body: Option<String>,
    with_key: bool,
}

fn method() -> impl Strategy<Value = reqwest::Method> {
    prop_oneof![
        4 => Just(reqwest::Method::GET),
        4 => Just(reqwest::Method::POST),
        1 => Just(reqwest::Method::PUT),
        1 => Just(reqwest::Method::DELETE),
        1 => Just(reqwest::Method::PATCH),
        1 => Just(reqwest::Method::OPTIONS),
    ]
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        Just(Target::Health),
        any::<bool>().prop_map(|v2| Target::Sandboxes { v2 }),
        Just(Target::One),
        prop::sample::select(vec![
            "connect",
            "resume",
            "timeout",
            "refreshes",
            "pause",
            "snapshots",
            "fork"
        ])
        .prop_map(Target::Action),
        Just(Target::V2Connect),
        Just(Target::SnapshotList),
        Just(Target::Template),
        Just(Target::BuildRequest),
        prop::sample::select(vec!["/templates", "/v2/templates", "/teams",])
            .prop_map(Target::Unsupported),
        prop::sample::select(vec![
            "/health",
            "/envs",
            "/files",
            "/process.Process/List",
            "/process.Process/SendSignal",
            "/filesystem.Filesystem/Stat",
            "/filesystem.Filesystem/ListDir",
            "/filesystem.Filesystem/MakeDir",
            "/filesystem.Filesystem/Remove",
            "/metrics",
            "/nowhere",
        ])
        .prop_map(Target::Envd),
        prop::sample::select(vec![
            "clock",
            "clock/advance",
            "requests",
            "isolation",
            "faults/latency",
            "sandboxes/{id}/vanish",
            "sandboxes/{id}/pause",
            "nowhere",
        ])
        .prop_map(Target::Admin),
        "[a-zA-Z0-9_./%-]{0,24}".prop_map(Target::Garbage),
    ]
}

/// Real (running or paused), unknown, and malformed ids; `{running}`/`{paused}` are
/// replaced with the fixtures' ids.
fn sandbox_id() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("{running}".to_owned()),
        2 => Just("{paused}".to_owned()),
        2 => "i[a-z0-9]{20}",
        1 => "[a-z0-9]{1,8}-[a-z0-9]{1,8}",
        // Led by a letter: a bare `.` or `..` segment is folded away by the client.
        2 => "[a-zA-Z][A-Z_.%~ a-z0-9]{0,11}",
        1 => "[a-z]{65,70}",
    ]
}

fn query() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "metadata",
        "state",
        "order",
        "limit",
        "nextToken",
        "startedAfter",
        "template",
        "path",
        "username",
        "x",
    ]);
    let value = prop_oneof![
        "[a-zA-Z0-9=&%+,:-]{0,16}",
        Just("running,paused".to_owned()),
        Just("asc".to_owned()),
        Just("2030-01-01T00:00:00Z".to_owned()),
        (0i64..200).prop_map(|n| n.to_string()),
        Just("a%3D1".to_owned()),
        Just("%zz".to_owned()),
    ];
    prop::collection::vec((key, value), 0..3).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    })
}

fn json_body() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        Just(json!(0)),
        Just(json!(-5)),
        Just(json!(1)),
        Just(json!(60)),
        Just(json!(86_401)),
        Just(json!(1e300)),
        Just(json!("60")),
        Just(json!(null)),
    ];
    let valid = (
        prop::option::of(prop::sample::select(vec![
            "base",
            "base:latest",
            "nope",
            "",
        ])),
        prop::option::of(number.clone()),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<bool>()),
        prop::option::of(number),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(template, timeout, auto_pause, secure, duration, internet)| {
                let mut body = serde_json::Map::new();
                if let Some(t) = template {
                    body.insert("templateID".into(), json!(t));
                }
                if let Some(t) = timeout {
                    body.insert("timeout".into(), t);
                }
                if let Some(b) = auto_pause {
                    body.insert("autoPause".into(), json!(b));
                }
                if let Some(b) = secure {
                    body.insert("secure".into(), json!(b));
                }
                if let Some(d) = duration {
                    body.insert("duration".into(), d);
                }
                if let Some(b) = internet {
                    body.insert("allow_internet_access".into(), json!(b));
                }
                serde_json::Value::Object(body).to_string()
            },
        );
    prop_oneof![
        4 => valid,
        1 => Just("{not json".to_owned()),
        1 => Just("[]".to_owned()),
        1 => Just("null".to_owned()),
        1 => "[ -~]{0,20}",
        1 => Just(r#"{"metadata":{"a":1},"envVars":[]}"#.to_owned()),
        1 => Just(r#"{"process":{"pid":"x"},"signal":"SIGNAL_SIGKILL"}"#.to_owned()),
        1 => Just(r#"{"path":"/home/user/../../etc","depth":-1}"#.to_owned()),
        1 => Just(r#"{"seconds":-1,"ms":1e30,"status":600}"#.to_owned()),
    ]
}

fn generated() -> impl Strategy<Value = Generated> {
    (
        method(),
        target(),
        sandbox_id(),
        query(),
        prop::option::of(json_body()),
        prop::bool::weighted(0.9),
    )
        .prop_map(|(method, target, id, query, body, with_key)| Generated {
            method,
            target,
            id,
            query,
            body,
            with_key,
        })
}

/// The statuses allowed for a REST route: those `spec/openapi.yml` documents for the
/// method, or 405 for a method the path does not serve.
fn documented(method: &reqwest::Method, target: &Target) -> &'static [u16] {
    use reqwest::Method as M;
    match (target, method) {
        (Target::Health, &M::GET) => &[200, 204, 401],
        (Target::Sandboxes { .. }, &M::GET) => &[200, 400, 401],
        // 404: an unknown template (E2B answers it; the SDK maps it).
        (Target::Sandboxes { .. }, &M::POST) => &[201, 400, 401, 404],
        (Target::One, &M::GET) => &[200, 401, 404],
        (Target::One, &M::DELETE) => &[204, 401, 404],
        (Target::Action("connect") | Target::V2Connect, &M::POST) => &[200, 201, 400, 401, 404],
        (Target::Action("resume"), &M::POST) => &[201, 400, 401, 404, 409],
        (Target::Action("timeout" | "refreshes"), &M::POST) => &[204, 400, 401, 404],
        (Target::Action("pause"), &M::POST) => &[204, 400, 401, 404, 409],
        (Target::Action("snapshots"), &M::POST) => &[201, 400, 401, 404],
        (Target::Action("fork"), &M::POST) => &[201, 400, 401, 404, 409],
        (Target::SnapshotList, &M::GET) => &[200, 400, 401],
        (Target::SnapshotList, _) => &[401, 405],
        // 404: no such snapshot (the SDK's delete_snapshot answers False on it).
        (Target::Template, &M::DELETE) => &[204, 400, 401, 404],
        (Target::Template, _) => &[401, 501],
        // 409: the name is a snapshot's alias.
        (Target::BuildRequest, &M::POST) => &[202, 400, 401, 409],
        (Target::BuildRequest | Target::Unsupported(_), _) => &[401, 501],
        (Target::Health, _) => &[401, 405],
        (Target::Sandboxes { .. } | Target::One | Target::Action(_) | Target::V2Connect, _) => {
            &[401, 405]
        }
        _ => &[],
    }
}

fn path_of(request: &Generated, running: &str, paused: &str) -> String {
    let id = request
        .id
        .replace("{running}", running)
        .replace("{paused}", paused);
    let id = id.replace(' ', "%20");
    let path = match &request.target {
        Target::Health => "/health".to_owned(),
        Target::Sandboxes { v2: false } => "/sandboxes".to_owned(),
        Target::Sandboxes { v2: true } => "/v2/sandboxes".to_owned(),
        Target::One => format!("/sandboxes/{id}"),
        Target::Action(action) => format!("/sandboxes/{id}/{action}"),
        Target::V2Connect => format!("/v2/sandboxes/{id}/connect"),
        Target::SnapshotList => "/snapshots".to_owned(),
        Target::Template => format!("/templates/{id}"),
        Target::BuildRequest => "/v3/templates".to_owned(),
        Target::Unsupported(route) => route.replace("{id}", &id),
        Target::Envd(path) => (*path).to_owned(),
        Target::Admin(rest) => format!("/_e2b_local/{}", rest.replace("{id}", &id)),
        Target::Garbage(path) => format!("/{path}"),
    };
    if request.query.is_empty() {
        path
    } else {
        format!("{path}?{}", request.query)
    }
}

#[test]
fn generated_requests_get_only_documented_statuses_and_never_a_5xx() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (server, api, running, paused) = runtime.block_on(async {
        let server = manual_server().await;
        let api = Api::new(&server);
        let running = new_sandbox(&api).await;
        let paused = new_sandbox(&api).await;
        let reply = api
            .post(&format!("/sandboxes/{}/pause", paused.id), "{}")
            .await;
        assert_eq!(reply.status, 204);
        (server, api, running, paused)
    });
    let mut runner = TestRunner::new(Config {
        cases: 400,
        failure_persistence: None,
        ..Config::default()
    });
    let statuses = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let result = runner.run(&generated(), |request| {
        let path = path_of(&request, &running.id, &paused.id);
        let (status, text) = runtime.block_on(async {
            let mut builder = api
                .http
                .request(request.method.clone(), format!("{}{path}", api.url));
            if request.with_key {
                builder = builder.header("x-api-key", KEY);
            }
            if let Target::Envd(_) = request.target {
                builder = builder.header("e2b-sandbox-id", &running.id);
                if let Some(token) = &running.token {
                    builder = builder.header("x-access-token", token);
                }
            }
            if let Some(body) = &request.body {
                builder = builder
                    .header("content-type", "application/json")
                    .body(body.clone());
            }
            let response = builder.send().await.expect("every request is answered");
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        });
        statuses.borrow_mut().insert(status);
        let context = || {
            format!(
                "{} {path} {:?} -> {status} {text}",
                request.method, request.body
            )
        };
        // The proxy's documented answer for a sandbox that is not running (the knobs
        // and DELETE can stop the fixture): 502 "The sandbox was not found".
        let proxy_not_found = matches!(request.target, Target::Envd(_))
            && status == 502
            && text.contains("The sandbox was not found");
        if status >= 500 && status != 501 && !proxy_not_found {
            return Err(TestCaseError::fail(format!("a 5xx: {}", context())));
        }
        let allowed = documented(&request.method, &request.target);
        if !allowed.is_empty() && !allowed.contains(&status) {
            return Err(TestCaseError::fail(format!(
                "undocumented status (allowed {allowed:?}): {}",
                context()
            )));
        }
        // envd's Connect `unimplemented` (an unknown signal, as real envd answers) is
        // a 501 too.
        let unsupported = match &request.target {
            Target::Unsupported(_) | Target::Envd(_) => true,
            Target::Template => request.method != reqwest::Method::DELETE,
            Target::BuildRequest => request.method != reqwest::Method::POST,
            _ => false,
        };
        if status == 501 && !unsupported {
            return Err(TestCaseError::fail(format!(
                "501 on a served route: {}",
                context()
            )));
        }
        Ok(())
    });
    runtime.block_on(server.shutdown()).unwrap();
    drop(api);
    if let Err(error) = result {
        panic!("{error}");
    }
    // The generator reaches successes, client errors and the unsupported routes alike.
    let statuses = statuses.into_inner();
    for wanted in [200, 400, 401, 404, 405, 501] {
        assert!(
            statuses.contains(&wanted),
            "never saw {wanted}: {statuses:?}"
        );
    }
}
