//! `--max-running`: E2B's per-account limit of concurrently running sandboxes. Creates and
//! resumes past it get E2B's own 429; paused and killed sandboxes do not count.

use crate::support::{Api, manual_server, t0};
use e2b_local::{Clock, Server, ServerConfig};
use serde_json::{Value, json};

async fn limited_server(max_running: u32) -> Server {
    let mut config = ServerConfig::loopback();
    config.clock = Clock::manual(t0());
    config.max_running = Some(max_running);
    Server::start(config).await.expect("server starts")
}

/// E2B's body for the limit, word for word (its API's orchestrator).
fn e2b_limit_body(max_running: u32) -> Value {
    json!({
        "code": 429,
        "message": format!(
            "you have reached the maximum number of concurrent E2B sandboxes ({max_running}). \
             If you need more, please visit 'https://e2b.dev/docs/billing'"
        ),
    })
}

const PERSISTENT: &str = r#"{"templateID":"base","timeout":300,"autoPause":true}"#;

async fn try_create(api: &Api) -> crate::support::Reply {
    api.post("/v2/sandboxes", PERSISTENT).await
}

async fn limits(api: &Api) -> Value {
    let reply = api.get("/_e2b_local/limits").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json
}

#[tokio::test]
async fn a_create_past_the_limit_gets_e2b_s_429() {
    // contract: L14 (the concurrency limit as E2B answers it: 429 on create)
    let server = limited_server(2).await;
    let api = Api::new(&server);
    for _ in 0..2 {
        assert_eq!(try_create(&api).await.status, 201);
    }
    for route in ["/v2/sandboxes", "/sandboxes"] {
        let refused = api.post(route, PERSISTENT).await;
        assert_eq!(refused.status, 429, "{route}: {}", refused.text);
        assert_eq!(refused.json, e2b_limit_body(2), "{route}");
    }
    assert_eq!(limits(&api).await, json!({"maxRunning": 2, "running": 2}));
    // A refused create leaves nothing behind: no record, no files.
    let listed = api.get("/v2/sandboxes?state=running,paused").await;
    assert_eq!(listed.json.as_array().map(Vec::len), Some(2));
    let dirs = std::fs::read_dir(server.state_dir().join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(dirs, 2);
}

#[tokio::test]
async fn paused_sandboxes_do_not_count_and_a_resume_takes_a_slot() {
    // contract: L14 (paused sandboxes do not count; a resume counts as a new running one)
    let server = limited_server(1).await;
    let api = Api::new(&server);
    let (paused, _) = api.create(serde_json::from_str(PERSISTENT).unwrap()).await;
    assert_eq!(
        api.post(&format!("/sandboxes/{paused}/pause"), "{}")
            .await
            .status,
        204
    );
    let (running, _) = api.create(serde_json::from_str(PERSISTENT).unwrap()).await;

    for route in [
        format!("/sandboxes/{paused}/connect"),
        format!("/v2/sandboxes/{paused}/connect"),
        format!("/sandboxes/{paused}/resume"),
    ] {
        let refused = api.post(&route, r#"{"timeout":60}"#).await;
        assert_eq!(refused.status, 429, "{route}: {}", refused.text);
        assert_eq!(refused.json, e2b_limit_body(1), "{route}");
    }
    let still = api.get(&format!("/sandboxes/{paused}")).await;
    assert_eq!(
        still.json["state"], "paused",
        "a refused resume leaves it paused"
    );

    // Connecting to a running sandbox is never refused, even at the limit.
    let connected = api
        .post(
            &format!("/sandboxes/{running}/connect"),
            r#"{"timeout":60}"#,
        )
        .await;
    assert_eq!(connected.status, 200, "{}", connected.text);

    assert_eq!(
        api.post(&format!("/sandboxes/{running}/pause"), "{}")
            .await
            .status,
        204
    );
    let resumed = api
        .post(&format!("/sandboxes/{paused}/connect"), r#"{"timeout":60}"#)
        .await;
    assert_eq!(resumed.status, 201, "{}", resumed.text);
    assert_eq!(limits(&api).await, json!({"maxRunning": 1, "running": 1}));
}

#[tokio::test]
async fn killing_a_sandbox_frees_its_slot() {
    // contract: L14 (killed sandboxes do not count)
    let server = limited_server(1).await;
    let api = Api::new(&server);
    let (first, _) = api.create(serde_json::from_str(PERSISTENT).unwrap()).await;
    assert_eq!(try_create(&api).await.status, 429);
    assert_eq!(api.delete(&format!("/sandboxes/{first}")).await.status, 204);
    assert_eq!(try_create(&api).await.status, 201);
    assert_eq!(try_create(&api).await.status, 429);
}

#[tokio::test]
async fn of_concurrent_creates_for_the_last_slots_exactly_that_many_win() {
    // contract: L14 (the limit holds under concurrent creates: counted and reserved at once)
    let server = limited_server(2).await;
    let api = Api::new(&server);
    let (first, _) = api.create(serde_json::from_str(PERSISTENT).unwrap()).await;
    for round in 0..5 {
        // Two creates for the one slot left.
        let (a, b) = tokio::join!(try_create(&api), try_create(&api));
        let mut statuses = [a.status, b.status];
        statuses.sort_unstable();
        assert_eq!(
            statuses,
            [201, 429],
            "round {round}: {} / {}",
            a.text,
            b.text
        );
        let winner = if a.status == 201 { &a } else { &b };
        let id = winner.json["sandboxID"].as_str().unwrap();
        assert_eq!(api.delete(&format!("/sandboxes/{id}")).await.status, 204);
    }
    assert_eq!(api.delete(&format!("/sandboxes/{first}")).await.status, 204);

    // A wider burst: ten creates for two slots.
    let burst = futures::future::join_all((0..10).map(|_| try_create(&api))).await;
    let won = burst.iter().filter(|r| r.status == 201).count();
    let refused = burst.iter().filter(|r| r.status == 429).count();
    assert_eq!((won, refused), (2, 8));
    assert_eq!(limits(&api).await, json!({"maxRunning": 2, "running": 2}));
}

#[tokio::test]
async fn the_limit_changes_at_run_time() {
    // contract: L14 (tests and the campaign vary the limit through the admin route)
    let server = manual_server().await;
    let api = Api::new(&server);
    assert_eq!(
        limits(&api).await,
        json!({"maxRunning": null, "running": 0})
    );
    for _ in 0..3 {
        assert_eq!(try_create(&api).await.status, 201);
    }

    // Lowered below what runs: nothing is stopped, new ones are refused.
    let set = api.post("/_e2b_local/limits", r#"{"maxRunning":2}"#).await;
    assert_eq!(set.status, 200, "{}", set.text);
    assert_eq!(set.json, json!({"maxRunning": 2, "running": 3}));
    let refused = try_create(&api).await;
    assert_eq!(refused.json, e2b_limit_body(2));

    let set = api.post("/_e2b_local/limits", r#"{"maxRunning":4}"#).await;
    assert_eq!(set.json["maxRunning"], 4);
    assert_eq!(try_create(&api).await.status, 201);
    assert_eq!(try_create(&api).await.json, e2b_limit_body(4));

    let lifted = api
        .post("/_e2b_local/limits", r#"{"maxRunning":null}"#)
        .await;
    assert_eq!(lifted.json, json!({"maxRunning": null, "running": 4}));
    assert_eq!(try_create(&api).await.status, 201);

    // A body without the key (or with a bad value) changes nothing.
    for body in [
        r#"{}"#,
        r#"{"maxRunning":-1}"#,
        r#"{"maxRunning":"3"}"#,
        r#"{"max_running":1}"#,
    ] {
        let bad = api.post("/_e2b_local/limits", body).await;
        assert_eq!(bad.status, 400, "{body}: {}", bad.text);
    }
    assert_eq!(
        limits(&api).await,
        json!({"maxRunning": null, "running": 5})
    );
}
