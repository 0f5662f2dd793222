//! E2B Secrets: routes, bodies, paging, E2B's errors, and the value kept out of every error.

use std::collections::BTreeMap;

use futures::TryStreamExt;

use super::support::*;
use crate::*;

const VALUE: &str = "ghp_wire-secret-value-91c3";

fn secret_json(name: &str, version: u64) -> serde_json::Value {
    serde_json::json!({"secretID": format!("sec_{name}"), "name": name, "currentVersion": version,
        "metadata": {"owner": "hermes"}, "createdAt": "2026-01-01T00:00:00Z",
        "updatedAt": "2026-01-02T00:00:00Z"})
}

fn new_secret(name: &str) -> NewSecret {
    NewSecret {
        name: name.to_owned(),
        value: SecretValue::new(VALUE.to_owned()),
        metadata: Some(BTreeMap::from([("owner".to_owned(), "hermes".to_owned())])),
    }
}

#[tokio::test]
async fn create_sends_the_canonical_name_and_reads_metadata_only() {
    // contract: X20
    let server = TestServer::start(|request, _| {
        let body: serde_json::Value = serde_json::from_slice(&request.body).expect("json body");
        if body["name"] == "taken" {
            // A server that echoes the value must not put it into the error.
            return json(
                409,
                &serde_json::json!({"code": 409, "message": format!("secret taken (value {VALUE})")}),
            );
        }
        json(201, &secret_json("gh_token", 1))
    })
    .await;
    let client = client(&server.url);
    let info = client
        .create_secret(new_secret("GH_Token"))
        .await
        .expect("created");
    assert_eq!(info.secret_id, "sec_gh_token");
    assert_eq!(info.name, "gh_token");
    assert_eq!(info.current_version, 1);
    assert_eq!(info.metadata["owner"], "hermes");
    assert!(info.updated_at > info.created_at);
    let request = &server.requests()[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path_and_query, "/secrets");
    assert_eq!(request.header("x-api-key"), Some(KEY));
    let body: serde_json::Value = serde_json::from_slice(&request.body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"name": "gh_token", "value": VALUE, "metadata": {"owner": "hermes"}})
    );

    let error = client
        .create_secret(new_secret("taken"))
        .await
        .expect_err("taken");
    assert!(error.is_name_taken(), "{error:?}");
    assert!(error.is_conflict(), "{error:?}");
    assert!(!error.is_sandbox_gone(), "{error:?}");
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains("wire-secret-value"), "{shown}");
        assert!(shown.contains("[REDACTED]"), "{shown}");
    }
    assert!(error.to_string().contains("create secret"), "{error}");
    // Only one request: a create is not retried.
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn names_and_metadata_e2b_refuses_are_refused_before_sending() {
    let server = TestServer::start(|_, _| json(500, &serde_json::json!({}))).await;
    let client = client(&server.url);
    for name in ["", "has space", "sec_reserved", "brace}"] {
        let error = client
            .create_secret(new_secret(name))
            .await
            .expect_err(name);
        assert!(error.is_invalid_request(), "{error:?}");
        assert!(error.reason().starts_with("name:"), "{}", error.reason());
        assert!(!error.to_string().contains("wire-secret-value"), "{error}");
    }
    let mut too_much = new_secret("fine");
    too_much.metadata = Some((0..33).map(|i| (i.to_string(), String::new())).collect());
    let error = client.create_secret(too_much).await.expect_err("metadata");
    assert!(
        error.reason().starts_with("metadata:"),
        "{}",
        error.reason()
    );
    let error = client.get_secret("a/b").await.expect_err("bad selector");
    assert!(error.is_invalid_request(), "{error:?}");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn list_follows_the_next_token_one_page_at_a_time() {
    let server = TestServer::start(|request, _| {
        if request.path_and_query.contains("nextToken=p%2F2") {
            json(200, &serde_json::json!([secret_json("c", 1)]))
        } else {
            with_header(
                json(
                    200,
                    &serde_json::json!([secret_json("a", 1), secret_json("b", 3)]),
                ),
                "x-next-token",
                "p/2",
            )
        }
    })
    .await;
    let client = client(&server.url);
    let all: Vec<SecretInfo> = client
        .list_secrets(SecretQuery { limit: Some(2) })
        .try_collect()
        .await
        .expect("listed");
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(all[1].current_version, 3);
    let paths: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.path_and_query.clone())
        .collect();
    assert_eq!(
        paths,
        ["/secrets?limit=2", "/secrets?limit=2&nextToken=p%2F2"]
    );
}

#[tokio::test]
async fn get_update_delete_address_by_name_or_id_and_classify_errors() {
    // contract: X20
    let server = TestServer::start(|request, _| {
        let path = request.path_and_query.as_str();
        match (request.method.as_str(), path) {
            (_, "/secrets/missing") => json(
                404,
                &serde_json::json!({"code": 404, "message": "secret not found"}),
            ),
            ("POST", "/secrets/bad") => json(
                400,
                &serde_json::json!({"code": 400, "message": format!("metadata: too long; value {VALUE}")}),
            ),
            ("GET", "/secrets/gh") | ("GET", "/secrets/sec_Ab12") => {
                json(200, &secret_json("gh", 1))
            }
            ("POST", "/secrets/gh") => json(200, &secret_json("gh", 2)),
            ("DELETE", "/secrets/gh") => json(204, &serde_json::json!(null)),
            _ => json(500, &serde_json::json!({"code": 500, "message": "unexpected"})),
        }
    })
    .await;
    let client = client(&server.url);
    assert_eq!(client.get_secret("GH").await.expect("by name").name, "gh");
    // An id keeps its case: only names are canonical in lower case.
    assert_eq!(
        client.get_secret("sec_Ab12").await.expect("by id").name,
        "gh"
    );

    let update = SecretUpdate {
        value: SecretValue::new(VALUE.to_owned()),
        metadata: None,
    };
    let updated = client
        .update_secret("gh", update.clone())
        .await
        .expect("updated");
    assert_eq!(updated.current_version, 2);
    let sent = server.requests()[2].clone();
    assert_eq!(sent.method, "POST");
    let body: serde_json::Value = serde_json::from_slice(&sent.body).expect("json");
    assert_eq!(body, serde_json::json!({"value": VALUE}));

    let error = client.get_secret("missing").await.expect_err("404");
    assert!(
        error.is_not_found() && !error.is_sandbox_gone(),
        "{error:?}"
    );
    let error = client
        .update_secret("missing", update.clone())
        .await
        .expect_err("404");
    assert!(error.is_not_found(), "{error:?}");
    let error = client.update_secret("bad", update).await.expect_err("400");
    assert!(error.is_invalid_request(), "{error:?}");
    assert!(error.reason().contains("metadata"), "{}", error.reason());
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains("wire-secret-value"), "{shown}");
    }

    assert_eq!(
        client.delete_secret("gh").await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        client.delete_secret("missing").await.expect("gone"),
        DeleteOutcome::NotFound
    );
}

#[test]
fn the_value_is_in_no_debug_output() {
    // contract: X20
    let shown = format!(
        "{:?} {:?}",
        new_secret("gh"),
        SecretUpdate {
            value: SecretValue::new(VALUE.to_owned()),
            metadata: None
        }
    );
    assert!(!shown.contains("wire-secret-value"), "{shown}");
    assert!(shown.contains("[REDACTED]"), "{shown}");
}
