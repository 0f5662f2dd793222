//! Control plane: lifecycle state machine (driven by the injected clock, no sleeping),
//! list paging and filters, error statuses and bodies, restart persistence.

use std::time::Duration;

use crate::support;
use crate::support::{Api, KEY, Sandbox, manual_server, t0};
use e2b_local::{Clock, Server, ServerConfig};
use serde_json::json;

fn rfc3339(t: std::time::SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

#[tokio::test]
async fn lease_expiry_pauses_or_kills_by_lifecycle() {
    // contract: L3 (E2B pauses a persistent sandbox at lease expiry), L4 (ephemeral: kill)
    let server = manual_server().await;
    let api = Api::new(&server);
    let (persistent, _) = api
        .create(json!({"templateID": "base", "timeout": 60, "autoPause": true, "autoPauseMemory": false}))
        .await;
    let (ephemeral, _) = api
        .create(json!({"templateID": "base", "timeout": 60, "autoPause": false}))
        .await;
    let detail = api.get(&format!("/sandboxes/{persistent}")).await;
    assert_eq!(detail.json["state"], "running");
    assert_eq!(
        detail.json["endAt"],
        rfc3339(t0() + Duration::from_secs(60))
    );
    assert_eq!(
        detail.json["lifecycle"],
        json!({"autoResume": false, "onTimeout": "pause"})
    );

    server.clock().advance(Duration::from_secs(59));
    assert_eq!(
        api.get(&format!("/sandboxes/{persistent}")).await.json["state"],
        "running"
    );
    assert_eq!(
        api.get(&format!("/sandboxes/{ephemeral}")).await.status,
        200
    );

    server.clock().advance(Duration::from_secs(1));
    let paused = api.get(&format!("/sandboxes/{persistent}")).await;
    assert_eq!(paused.json["state"], "paused");
    assert_eq!(
        paused.json["endAt"],
        rfc3339(t0() + Duration::from_secs(60))
    );
    let gone = api.get(&format!("/sandboxes/{ephemeral}")).await;
    assert_eq!(gone.status, 404);
    assert_eq!(
        gone.json,
        json!({"code": 404, "message": format!("Sandbox \"{ephemeral}\" doesn't exist or you don't have access to it")})
    );
    assert!(
        !server.sandbox_home(&ephemeral).exists(),
        "killed sandbox files are deleted"
    );
    assert!(
        server.sandbox_home(&persistent).exists(),
        "paused sandbox files are kept"
    );

    // envd answers 502 for both.
    for id in [&persistent, &ephemeral] {
        let sandbox = Sandbox {
            id: id.clone(),
            token: None,
        };
        let reply = api.rpc(&sandbox, "process.Process/List", json!({})).await;
        assert_eq!(reply.status, 502);
        assert_eq!(
            reply.json,
            json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502})
        );
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn connect_extends_only_and_resumes_paused() {
    // contract: L5 (extension never shortens a lease)
    let server = manual_server().await;
    let api = Api::new(&server);
    let (id, _) = api
        .create(json!({"templateID": "base", "timeout": 300, "autoPause": true}))
        .await;
    let end = |reply: &support::Reply| reply.json["endAt"].as_str().unwrap().to_owned();

    let shorter = api
        .post(&format!("/v2/sandboxes/{id}/connect"), r#"{"timeout":30}"#)
        .await;
    assert_eq!(shorter.status, 200);
    assert_eq!(shorter.json["sandboxID"], id.as_str());
    assert_eq!(
        end(&api.get(&format!("/sandboxes/{id}")).await),
        rfc3339(t0() + Duration::from_secs(300))
    );

    let longer = api
        .post(&format!("/sandboxes/{id}/connect"), r#"{"timeout":900}"#)
        .await;
    assert_eq!(longer.status, 200);
    assert_eq!(
        end(&api.get(&format!("/sandboxes/{id}")).await),
        rfc3339(t0() + Duration::from_secs(900))
    );

    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        204
    );
    server.clock().advance(Duration::from_secs(10));
    let resumed = api.post(&format!("/v2/sandboxes/{id}/connect"), "{}").await;
    assert_eq!(resumed.status, 201);
    assert!(resumed.json["envdAccessToken"].is_string());
    let detail = api.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(detail.json["state"], "running");
    // v2 connect without a timeout: the server default of 300 s from now.
    assert_eq!(end(&detail), rfc3339(t0() + Duration::from_secs(310)));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn set_timeout_shortens_and_pause_kill_statuses() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let (id, _) = api
        .create(json!({"templateID": "base", "timeout": 3600, "autoPause": true}))
        .await;
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/timeout"), r#"{"timeout":30}"#)
            .await
            .status,
        204
    );
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["endAt"],
        rfc3339(t0() + Duration::from_secs(30))
    );

    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        204
    );
    let again = api
        .post(&format!("/sandboxes/{id}/pause"), r#"{"memory":true}"#)
        .await;
    assert_eq!(again.status, 409);
    assert_eq!(
        again.json,
        json!({"code": 409, "message": format!("Error pausing sandbox - sandbox '{id}' is already paused")})
    );
    // set_timeout only works on running sandboxes.
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/timeout"), r#"{"timeout":30}"#)
            .await
            .status,
        404
    );
    // Kill of a paused sandbox deletes it.
    assert_eq!(api.delete(&format!("/sandboxes/{id}")).await.status, 204);
    assert_eq!(api.delete(&format!("/sandboxes/{id}")).await.status, 404);
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        404
    );
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/connect"), r#"{"timeout":10}"#)
            .await
            .status,
        404
    );

    // Timeout 0 expires right away.
    let (short, _) = api
        .create(json!({"templateID": "base", "timeout": 60}))
        .await;
    assert_eq!(
        api.post(&format!("/sandboxes/{short}/timeout"), r#"{"timeout":0}"#)
            .await
            .status,
        204
    );
    assert_eq!(api.get(&format!("/sandboxes/{short}")).await.status, 404);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_gets_e2b_statuses_never_a_crash() {
    let server = manual_server().await;
    let api = Api::new(&server);
    // A malformed sandbox id is a 404: the spec documents no 400 on these routes.
    let cases: Vec<(reqwest::Method, &str, Option<&str>, u16)> = vec![
        (reqwest::Method::GET, "/sandboxes/BAD_ID", None, 404),
        (reqwest::Method::GET, "/sandboxes/abc%2F..", None, 404),
        (reqwest::Method::DELETE, "/sandboxes/UPPER", None, 404),
        (
            reqwest::Method::GET,
            "/sandboxes/iunknown0000000000000",
            None,
            404,
        ),
        (
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(r#"{"templateID":"base","timeout":0}"#),
            400,
        ),
        (
            reqwest::Method::POST,
            "/sandboxes",
            Some(r#"{"templateID":"base","timeout":-5}"#),
            400,
        ),
        (
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(r#"{"templateID":"base","timeout":999999}"#),
            400,
        ),
        (
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(r#"{"templateID":"nope"}"#),
            404,
        ),
        (
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some("{not json"),
            400,
        ),
        (
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(r#"{"templateID":7}"#),
            400,
        ),
        (reqwest::Method::POST, "/v2/sandboxes", Some(r#"{}"#), 400),
        (
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(r#"{"templateID":"base","autoPauseMemory":false}"#),
            400,
        ),
        (
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(
                r#"{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}"#,
            ),
            400,
        ),
        (reqwest::Method::GET, "/v2/sandboxes?limit=0", None, 400),
        (
            reqwest::Method::GET,
            "/v2/sandboxes?metadata=a%3D1%3D2",
            None,
            400,
        ),
        (
            reqwest::Method::GET,
            "/v2/sandboxes?nextToken=garbage!",
            None,
            400,
        ),
        (reqwest::Method::GET, "/v2/sandboxes?state=dead", None, 400),
        (reqwest::Method::GET, "/nowhere", None, 404),
        (reqwest::Method::PUT, "/v2/sandboxes", None, 405),
    ];
    for (method, path, body, status) in cases {
        let reply = api.rest(method.clone(), path, body).await;
        assert_eq!(
            reply.status, status,
            "{method} {path} {body:?}: {}",
            reply.text
        );
        assert_eq!(
            reply.json["code"], status,
            "{method} {path}: body {}",
            reply.text
        );
        assert!(reply.json["message"].is_string(), "{path}");
    }
    let (id, _) = api.create(json!({"templateID": "base:latest"})).await;
    let v1_connect = api.post(&format!("/sandboxes/{id}/connect"), "{}").await;
    assert_eq!(v1_connect.status, 400, "v1 connect requires a timeout");
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/connect"), r#"{"timeout":0}"#)
            .await
            .status,
        400
    );
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/timeout"), "[]")
            .await
            .status,
        400
    );
    // Legacy composite ids are accepted.
    assert_eq!(
        api.get(&format!("/sandboxes/{id}-6532622b")).await.status,
        200
    );

    // Authentication.
    let no_key = reqwest::get(format!("{}/v2/sandboxes", server.url()))
        .await
        .unwrap();
    assert_eq!(no_key.status().as_u16(), 401);
    let health = reqwest::get(format!("{}/health", server.url()))
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn exact_api_key_policy() {
    let mut config = ServerConfig::loopback();
    config.api_key = e2b_local::ApiKeyPolicy::Exact("s3cret".into());
    assert!(
        !format!("{config:?}").contains("s3cret"),
        "key redacted in Debug"
    );
    let server = Server::start(config).await.unwrap();
    let http = reqwest::Client::new();
    let url = format!("{}/v2/sandboxes", server.url());
    let wrong = http
        .get(&url)
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let right = http
        .get(&url)
        .header("x-api-key", "s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status().as_u16(), 200);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn list_pages_filters_and_double_decoding() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let mut ids = Vec::new();
    for i in 0..5 {
        server.clock().advance(Duration::from_secs(1));
        let (id, _) = api
            .create(
                json!({"templateID": "base", "metadata": {"scope": "a b/c", "i": i.to_string()}}),
            )
            .await;
        ids.push(id);
    }
    api.create(json!({"templateID": "base", "metadata": {"scope": "other"}}))
        .await;
    api.create(json!({"templateID": "base"})).await;

    // What the SDK sends for metadata={"scope": "a b/c"}: double-encoded.
    let filter = "metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused";
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = format!("/v2/sandboxes?{filter}&limit=2");
        if let Some(t) = &token {
            path.push_str(&format!("&nextToken={t}"));
        }
        let reply = api.get(&path).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.headers["x-total-running"], "7");
        pages += 1;
        for item in reply.json.as_array().unwrap() {
            assert_eq!(item["state"], "running");
            assert_eq!(item["metadata"]["scope"], "a b/c");
            seen.push(item["sandboxID"].as_str().unwrap().to_owned());
        }
        token = reply
            .headers
            .get("x-next-token")
            .map(|v| v.to_str().unwrap().to_owned());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);

    // Ascending order, state filter, exact page boundary (no token on a full last page).
    let asc = api
        .get(&format!("/v2/sandboxes?{filter}&order=asc&limit=5"))
        .await;
    let asc_ids: Vec<&str> = asc
        .json
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["sandboxID"].as_str().unwrap())
        .collect();
    assert_eq!(asc_ids, ids.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(asc.headers.get("x-next-token").is_none());

    assert_eq!(
        api.post(&format!("/sandboxes/{}/pause", ids[2]), "{}")
            .await
            .status,
        204
    );
    let paused = api.get("/v2/sandboxes?state=paused").await;
    assert_eq!(paused.json.as_array().unwrap().len(), 1);
    assert_eq!(paused.json[0]["sandboxID"], ids[2].as_str());
    assert_eq!(paused.json[0]["state"], "paused");
    assert!(paused.headers.get("x-total-running").is_none());
    // v1 list: running only.
    let v1 = api.get("/sandboxes").await;
    assert_eq!(v1.json.as_array().unwrap().len(), 6);
    // Two keys (AND) and a key nobody has.
    let both = api
        .get("/v2/sandboxes?metadata=scope%3Da%252520b%252Fc%26i%3D4")
        .await;
    assert_eq!(both.json.as_array().unwrap().len(), 1);
    assert_eq!(both.json[0]["sandboxID"], ids[4].as_str());
    let none = api.get("/v2/sandboxes?metadata=missing%3Dx").await;
    assert_eq!(none.json, json!([]));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn paused_sandboxes_survive_a_restart_with_a_state_dir() {
    // contract: L2 (found again after a restart and resumed; files survive)
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(t0());
    let mut config = ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = clock.clone();
    let server = Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    let (id, token) = api
        .create(
            json!({"templateID": "base", "timeout": 60, "autoPause": true, "metadata": {"k": "v"}}),
        )
        .await;
    let sandbox = Sandbox {
        id: id.clone(),
        token,
    };
    assert_eq!(
        api.upload(&sandbox, "notes/a.txt", b"persisted")
            .await
            .status,
        200
    );
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        204
    );
    server.shutdown().await.unwrap();

    let server = Server::start(config).await.unwrap();
    let api = Api::new(&server);
    let detail = api.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(detail.json["state"], "paused");
    assert_eq!(detail.json["metadata"], json!({"k": "v"}));
    let resumed = api
        .post(&format!("/v2/sandboxes/{id}/connect"), r#"{"timeout":60}"#)
        .await;
    assert_eq!(resumed.status, 201);
    let sandbox = Sandbox {
        id: id.clone(),
        token: resumed.json["envdAccessToken"].as_str().map(str::to_owned),
    };
    let (status, body) = api.download(&sandbox, "/home/user/notes/a.txt").await;
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"persisted");
    // A new sandbox after restart does not collide with the old one.
    let (other, _) = api.create(json!({"templateID": "base"})).await;
    assert_ne!(other, id);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn admin_clock_route_expires_leases() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let (id, _) = api
        .create(json!({"templateID": "base", "timeout": 60, "autoPause": true}))
        .await;
    let no_key = reqwest::Client::new()
        .post(format!("{}/_e2b_local/clock/advance", server.url()))
        .body(r#"{"seconds":61}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status().as_u16(), 401);
    let advanced = api
        .post("/_e2b_local/clock/advance", r#"{"seconds":61}"#)
        .await;
    assert_eq!(advanced.status, 200);
    assert_eq!(
        advanced.json["now"],
        rfc3339(t0() + Duration::from_secs(61))
    );
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["state"],
        "paused"
    );
    assert_eq!(
        api.post("/_e2b_local/clock/advance", r#"{"seconds":-1}"#)
            .await
            .status,
        400
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn config_without_base_template_is_refused() {
    let mut config = ServerConfig::loopback();
    config.templates = vec!["other".into()];
    let error = Server::start(config).await.unwrap_err();
    assert!(error.is_invalid_config(), "{error}");
}
