//! E2B Secrets: `/secrets` CRUD as E2B's spec has it, values kept owner-only across a
//! restart and carried by no answer.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use e2b_local::{Clock, Server, ServerConfig};
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{Api, Reply, manual_server, t0};

const VALUE: &str = "ghp_local-secret-value-5d2e";

fn assert_no_value(reply: &Reply) {
    assert!(!reply.text.contains("secret-value"), "{}", reply.text);
}

fn names(reply: &Reply) -> Vec<String> {
    reply
        .json
        .as_array()
        .unwrap()
        .iter()
        .map(|secret| secret["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn secrets_crud_answers_metadata_only_and_classifies_errors() {
    // contract: X20
    let server = manual_server().await;
    let api = Api::new(&server);
    let created = api
        .post(
            "/secrets",
            &json!({"name": "GH_Token", "value": VALUE, "metadata": {"owner": "hermes"}})
                .to_string(),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_no_value(&created);
    let id = created.json["secretID"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sec_"), "{id}");
    assert_eq!(created.json["name"], "gh_token");
    assert_eq!(created.json["currentVersion"], 1);
    assert_eq!(created.json["metadata"], json!({"owner": "hermes"}));
    assert_eq!(created.json["createdAt"], created.json["updatedAt"]);
    assert!(created.json.get("value").is_none());

    // The name is taken whatever its case.
    let taken = api
        .post(
            "/secrets",
            &json!({"name": "gh_TOKEN", "value": VALUE}).to_string(),
        )
        .await;
    assert_eq!(taken.status, 409, "{}", taken.text);
    assert_no_value(&taken);

    // By id and by name (any case).
    for selector in [id.as_str(), "gh_token", "GH_TOKEN"] {
        let got = api.get(&format!("/secrets/{selector}")).await;
        assert_eq!(got.status, 200, "{selector}: {}", got.text);
        assert_eq!(got.json, created.json);
    }

    server.clock().advance(Duration::from_secs(60));
    let updated = api
        .post(
            "/secrets/gh_token",
            &json!({"value": "ghp_local-secret-value-rotated"}).to_string(),
        )
        .await;
    assert_eq!(updated.status, 200, "{}", updated.text);
    assert_no_value(&updated);
    assert_eq!(updated.json["currentVersion"], 2);
    // No metadata in the update keeps it; new metadata replaces it.
    assert_eq!(updated.json["metadata"], json!({"owner": "hermes"}));
    assert_ne!(updated.json["updatedAt"], created.json["updatedAt"]);
    let replaced = api
        .post(
            &format!("/secrets/{id}"),
            &json!({"value": VALUE, "metadata": {}}).to_string(),
        )
        .await;
    assert_eq!(replaced.json["currentVersion"], 3);
    assert_eq!(replaced.json["metadata"], json!({}));

    let listed = api.get("/secrets").await;
    assert_eq!(listed.status, 200);
    assert_no_value(&listed);
    assert_eq!(names(&listed), ["gh_token"]);

    assert_eq!(api.delete("/secrets/gh_token").await.status, 204);
    for (method, body) in [
        (Method::GET, None),
        (Method::POST, Some(json!({"value": VALUE}).to_string())),
        (Method::DELETE, None),
    ] {
        let gone = api
            .rest(method.clone(), "/secrets/gh_token", body.as_deref())
            .await;
        assert_eq!(gone.status, 404, "{method}: {}", gone.text);
        assert_eq!(gone.json["code"], 404);
        assert_no_value(&gone);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_requests_name_the_field_and_never_quote_the_value() {
    // contract: X20
    let server = manual_server().await;
    let api = Api::new(&server);
    let cases = [
        (json!({"value": VALUE}), "name:"),
        (json!({"name": "", "value": VALUE}), "name:"),
        (json!({"name": "has space", "value": VALUE}), "name:"),
        (json!({"name": "sec_mine", "value": VALUE}), "name:"),
        (json!({"name": "x".repeat(129), "value": VALUE}), "name:"),
        (json!({"name": "ok"}), "value:"),
        (json!({"name": "ok", "value": 7}), "value:"),
        (
            json!({"name": "ok", "value": VALUE, "metadata": {"k": 1}}),
            "metadata:",
        ),
        (
            json!({"name": "ok", "value": VALUE, "metadata": (0..33).map(|i| (i.to_string(), json!(""))).collect::<serde_json::Map<String, Value>>()}),
            "metadata:",
        ),
    ];
    for (body, field) in cases {
        let reply = api.post("/secrets", &body.to_string()).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.text);
        let message = reply.json["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
        assert_no_value(&reply);
    }
    // A body that is not JSON: the parser's words could quote it, so they are not sent.
    let reply = api
        .post("/secrets", &format!("{{\"value\": \"{VALUE}"))
        .await;
    assert_eq!(reply.status, 400);
    assert_no_value(&reply);
    // Nothing was stored by any of them.
    assert_eq!(names(&api.get("/secrets").await), Vec::<String>::new());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_list_pages_in_creation_order() {
    let server = manual_server().await;
    let api = Api::new(&server);
    for name in ["c", "a", "b"] {
        let reply = api
            .post(
                "/secrets",
                &json!({"name": name, "value": VALUE}).to_string(),
            )
            .await;
        assert_eq!(reply.status, 201);
    }
    let first = api.get("/secrets?limit=2").await;
    assert_eq!(names(&first), ["c", "a"]);
    let token = first.headers["x-next-token"].to_str().unwrap().to_owned();
    let second = api
        .get(&format!("/secrets?limit=2&nextToken={token}"))
        .await;
    assert_eq!(names(&second), ["b"]);
    assert!(second.headers.get("x-next-token").is_none());
    assert_eq!(api.get("/secrets?limit=0").await.status, 400);
    assert_eq!(api.get("/secrets?nextToken=nope").await.status, 400);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn secrets_survive_a_restart_in_an_owner_only_record() {
    // contract: X20
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = Clock::manual(t0());
    let server = Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    let created = api
        .post(
            "/secrets",
            &json!({"name": "kept", "value": VALUE}).to_string(),
        )
        .await;
    assert_eq!(created.status, 201);
    server.shutdown().await.unwrap();

    let record = dir.path().join("secrets.json");
    let mode = std::fs::metadata(&record).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // A looser record (copied around, say) is made owner-only again at start.
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o644)).unwrap();

    let server = Server::start(config).await.unwrap();
    let api = Api::new(&server);
    let got = api.get("/secrets/kept").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json, created.json);
    let mode = std::fs::metadata(&record).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // The value is in the record (it must be, to be resolved) and in no answer.
    assert!(std::fs::read_to_string(&record).unwrap().contains(VALUE));
    assert_no_value(&api.get("/secrets").await);
    server.shutdown().await.unwrap();
}
