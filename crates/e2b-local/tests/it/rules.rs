//! `network.rules` (per-domain header transforms) and `network.egressProxy`: checked with
//! E2B's limits, stored, reported, kept across pause, resume and a restart.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

/// The secret every test here hands over and then looks for where it must not be.
const SECRET: &str = "Bearer sk-e2b-local-never-shown-7f3a";

fn rules_with(value: &str) -> Value {
    json!({"api.example.test": [{"transform": {"headers": {"Authorization": value}}}]})
}

/// Whether this server can enforce rules (namespaces and the seccomp filter).
async fn enforces(api: &Api) -> bool {
    api.get("/_e2b_local/isolation").await.json["egressRules"] == true
}

#[tokio::test]
async fn rules_and_egress_proxy_are_stored_reported_and_survive_pause_and_restart() {
    // contract: X12
    let dir = tempfile::tempdir().unwrap();
    let mut config = e2b_local::ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = e2b_local::Clock::manual(t0());
    let server = e2b_local::Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    let network = json!({
        "rules": rules_with(SECRET),
        "egressProxy": {"address": "127.0.0.1:1080", "username": "u", "password": "hunter2-pw"},
    });
    let created = api
        .post(
            "/v2/sandboxes",
            &json!({"templateID": "base", "timeout": 60, "network": network}).to_string(),
        )
        .await;
    if !enforces(&api).await {
        // Where commands cannot be held to rules, asking for them is refused, clearly.
        assert_eq!(created.status, 400, "{}", created.text);
        assert!(
            created.text.contains("network.rules cannot be enforced"),
            "{}",
            created.text
        );
        assert!(!created.text.contains(SECRET), "{}", created.text);
        server.shutdown().await.unwrap();
        return;
    }
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["sandboxID"].as_str().unwrap().to_owned();
    let expected = json!({"allowOut": [], "denyOut": [], "rules": rules_with(SECRET),
        "egressProxy": {"address": "127.0.0.1:1080", "username": "u"}});
    let detail = api.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(detail.json["network"], expected);
    assert!(!detail.text.contains("hunter2-pw"), "{}", detail.text);

    // The record on disk holds the secret (it must survive a restart): owner-only.
    let record = std::fs::read_dir(dir.path().join("sandboxes"))
        .unwrap()
        .map(|entry| entry.unwrap().path().join("sandbox.json"))
        .find(|path| path.exists())
        .expect("a record");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&record).unwrap().permissions().mode() & 0o777,
        0o600
    );

    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        204
    );
    let resumed = api.post(&format!("/sandboxes/{id}/resume"), "{}").await;
    assert!(resumed.status < 300, "{}", resumed.text);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["network"],
        expected
    );
    server.shutdown().await.unwrap();

    let server = e2b_local::Server::start(config).await.unwrap();
    let api = Api::new(&server);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["network"],
        expected
    );

    // The update replaces: new value; then rules left out are cleared.
    let path = format!("/sandboxes/{id}/network");
    let body = json!({"rules": rules_with("Bearer second")}).to_string();
    let reply = api.rest(Method::PUT, &path, Some(&body)).await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["network"],
        json!({"allowOut": [], "denyOut": [], "rules": rules_with("Bearer second")})
    );
    let reply = api.rest(Method::PUT, &path, Some("{}")).await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["network"],
        json!({"allowOut": [], "denyOut": []})
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn rules_past_e2b_limits_are_refused_naming_the_field_never_the_value() {
    // contract: X12
    let server = manual_server().await;
    let api = Api::new(&server);
    let many: serde_json::Map<String, Value> = (0..11)
        .map(|i| {
            (
                format!("d{i}.example.test"),
                rules_with(SECRET)["api.example.test"].clone(),
            )
        })
        .collect();
    let long = format!("{SECRET}{}", "x".repeat(2048));
    let cases = [
        (json!(many), "at most 10"),
        (json!({"*.example.test": []}), "plain DNS name"),
        (json!({"10.1.2.3": []}), "plain DNS name"),
        (
            json!({"a.test": [{"transform": {"headers": {"a": SECRET}}}, {}]}),
            "at most one rule",
        ),
        (
            json!({"a.test": [{"transform": {"headers": {"x".repeat(65): SECRET}}}]}),
            "1 to 64",
        ),
        (
            json!({"a.test": [{"transform": {"headers": {"x": long}}}]}),
            "longer than 2048",
        ),
        (
            json!({"a.test": [{"transform": {"headers": {"x": format!("{SECRET}\r\nInjected: 1")}}}]}),
            "not a valid HTTP header value",
        ),
        (
            json!({"a.test": [{"transform": {"headers": SECRET}}]}),
            "headers must be an object",
        ),
    ];
    for (rules, needle) in cases {
        let body = json!({"templateID": "base", "timeout": 60, "network": {"rules": rules}});
        let reply = api.post("/v2/sandboxes", &body.to_string()).await;
        assert_eq!(reply.status, 400, "{needle}: {}", reply.text);
        assert!(reply.text.contains("network.rules"), "{}", reply.text);
        assert!(reply.text.contains(needle), "{needle}: {}", reply.text);
        assert!(!reply.text.contains("sk-e2b-local"), "{}", reply.text);
    }
    server.shutdown().await.unwrap();
}
