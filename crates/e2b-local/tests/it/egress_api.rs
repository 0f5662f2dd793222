//! The network routes: rules checked and stored at create, replaced by the update route,
//! reported by the detail (enforcement itself: `egress.rs`).

use reqwest::Method;
use serde_json::json;

use crate::support::*;

async fn create_with(api: &Api, network: serde_json::Value) -> Reply {
    api.post(
        "/v2/sandboxes",
        &json!({"templateID": "base", "timeout": 60, "network": network}).to_string(),
    )
    .await
}

#[tokio::test]
async fn rules_are_stored_replaced_and_reported() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    let created = create_with(
        &api,
        json!({"allowOut": ["example.com", "10.0.0.0/8"], "denyOut": ["0.0.0.0/0"],
            "allowPublicTraffic": false, "maskRequestHost": "${PORT}-x.test"}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["sandboxID"].as_str().unwrap().to_owned();
    let detail = api.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(
        detail.json["network"],
        json!({"allowOut": ["example.com", "10.0.0.0/8"], "denyOut": ["0.0.0.0/0"],
            "allowPublicTraffic": false, "maskRequestHost": "${PORT}-x.test"})
    );

    // Replace semantics: a field left out is cleared; the public-URL settings stay.
    let updated = api
        .rest(
            Method::PUT,
            &format!("/sandboxes/{id}/network"),
            Some(r#"{"denyOut": ["192.0.2.0/24"]}"#),
        )
        .await;
    assert_eq!(updated.status, 204, "{}", updated.text);
    let detail = api.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(
        detail.json["network"],
        json!({"allowOut": [], "denyOut": ["192.0.2.0/24"],
            "allowPublicTraffic": false, "maskRequestHost": "${PORT}-x.test"})
    );

    // A sandbox created without rules reports none.
    let plain = new_sandbox(&api).await;
    let detail = api.get(&format!("/sandboxes/{}", plain.id)).await;
    assert!(detail.json.get("network").is_none(), "{}", detail.json);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_rules_and_unenforceable_features_are_refused_with_the_reason() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    let cases = [
        (json!({"denyOut": ["example.com"]}), "only in allowOut"),
        (json!({"allowOut": ["not a host"]}), "'not a host'"),
        (json!({"denyOut": ["10.0.0.0/33"]}), "'10.0.0.0/33'"),
        (
            json!({"egressProxy": {"address": "proxy.test"}}),
            "egressProxy",
        ),
        (
            json!({"rules": {"*.api.test": [{"transform": {"headers": {"a": "b"}}}]}}),
            "network.rules",
        ),
        (json!({"dnsServers": ["::1"]}), "dnsServers"),
    ];
    for (network, needle) in cases {
        let reply = create_with(&api, network.clone()).await;
        assert_eq!(reply.status, 400, "{network}: {}", reply.text);
        assert!(reply.text.contains(needle), "{network}: {}", reply.text);
    }
    // An empty proxy or rule set asks for nothing and is accepted.
    let reply = create_with(&api, json!({"egressProxy": null, "rules": {}})).await;
    assert_eq!(reply.status, 201, "{}", reply.text);

    let sandbox = new_sandbox(&api).await;
    let path = format!("/sandboxes/{}/network", sandbox.id);
    let reply = api
        .rest(Method::PUT, &path, Some(r#"{"denyOut": ["example.com"]}"#))
        .await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn update_answers_404_for_an_unknown_and_409_for_a_paused_sandbox() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    let reply = api
        .rest(
            Method::PUT,
            "/sandboxes/inosuchsandbox0000000/network",
            Some("{}"),
        )
        .await;
    assert_eq!(reply.status, 404, "{}", reply.text);

    let created = create_with(&api, json!({"denyOut": ["0.0.0.0/0"]})).await;
    let id = created.json["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        204
    );
    let reply = api
        .rest(Method::PUT, &format!("/sandboxes/{id}/network"), Some("{}"))
        .await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert!(reply.text.contains("paused"), "{}", reply.text);
    let reply = api
        .rest(Method::GET, &format!("/sandboxes/{id}/network"), None)
        .await;
    assert_eq!(reply.status, 405);
    server.shutdown().await.unwrap();
}

/// Whether this server enforces rules (as root it must; elsewhere these tests have
/// nothing to check, `egress.rs` checks the refusal).
async fn enforces(api: &Api) -> bool {
    api.get("/_e2b_local/isolation").await.json["egressRules"] == true
}

#[tokio::test]
async fn a_process_a_finished_command_left_behind_keeps_rules_away_with_a_409() {
    // contract: X11 — not only the commands envd started: what they left running counts.
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforces(&api).await {
        return;
    }
    let plain = new_sandbox(&api).await;
    let left = api
        .run(
            &plain,
            "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo started",
        )
        .await;
    assert_eq!(String::from_utf8_lossy(&left.stdout), "started\n");
    let path = format!("/sandboxes/{}/network", plain.id);
    let deny = r#"{"denyOut": ["0.0.0.0/0"]}"#;
    let reply = api.rest(Method::PUT, &path, Some(deny)).await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert!(reply.text.contains("run unfiltered"), "{}", reply.text);
    // pkill only sends the signal: wait until the sleep is gone (reaped by the sandbox's
    // init, pid 1, itself a `sleep`), which is what the update looks at; under load it
    // can outlive pkill.
    let killed = api
        .run(
            &plain,
            "pkill -x sleep; timeout 30 sh -c 'while pgrep -x sleep | grep -qvx 1; do :; done'; echo done",
        )
        .await;
    assert_eq!(String::from_utf8_lossy(&killed.stdout), "done\n");
    let reply = api.rest(Method::PUT, &path, Some(deny)).await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn rules_fail_closed_on_a_server_restarted_where_it_cannot_enforce_them() {
    // contract: X11
    let dir = tempfile::tempdir().unwrap();
    let mut config = e2b_local::ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = e2b_local::Clock::manual(t0());
    let server = e2b_local::Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    if !enforces(&api).await {
        return;
    }
    let created = create_with(&api, json!({"denyOut": ["0.0.0.0/0"]})).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["sandboxID"].as_str().unwrap().to_owned();
    server.shutdown().await.unwrap();

    // The same sandbox, on a server that runs commands without namespaces (and so
    // without the filter): its commands are refused, never run unfiltered.
    config.isolation = e2b_local::IsolationMode::PathMapping;
    let server = e2b_local::Server::start(config).await.unwrap();
    let api = Api::new(&server);
    let sandbox = Sandbox {
        id,
        token: created.json["envdAccessToken"].as_str().map(str::to_owned),
    };
    let mut stream = api.start(&sandbox, "echo ran", &[]).await;
    let mut frames = Vec::new();
    while let Some(frame) = stream.next().await {
        frames.push(frame.json.to_string());
    }
    assert!(
        !frames.iter().any(|frame| frame.contains("\"start\"")),
        "ran unfiltered: {frames:?}"
    );
    assert!(
        frames.iter().any(|frame| frame.contains("cannot enforce")),
        "{frames:?}"
    );
    server.shutdown().await.unwrap();
}
