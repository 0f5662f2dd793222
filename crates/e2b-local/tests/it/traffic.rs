//! Traffic to a sandbox's own ports (not envd's): the traffic access token of a sandbox
//! created with `network.allowPublicTraffic: false`, as E2B's proxy requires it.

use e2b_local::{Clock, Server, ServerConfig};
use serde_json::{Value, json};

use crate::support::{Api, Sandbox, manual_server, t0};

/// A request to port `port` of `id`, with `token` in `e2b-traffic-access-token` if given.
async fn to_port(api: &Api, id: &str, port: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = api
        .http
        .get(format!("{}/", api.url))
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", port);
    if let Some(token) = token {
        request = request.header("e2b-traffic-access-token", token);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_private_sandbox_wants_its_traffic_token_on_its_own_ports() {
    // contract: X6 — allowPublicTraffic=false hands out a traffic access token that traffic
    // to the sandbox's own ports must carry (403 without it or with another), as on E2B.
    let server = manual_server().await;
    let api = Api::new(&server);
    let created = api
        .post(
            "/v2/sandboxes",
            &json!({"templateID": "base", "network": {"allowPublicTraffic": false}}).to_string(),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["sandboxID"].as_str().unwrap().to_owned();
    let token = created.json["trafficAccessToken"]
        .as_str()
        .expect("a traffic access token")
        .to_owned();
    assert_eq!(token.len(), 32);
    let envd_token = created.json["envdAccessToken"].as_str().unwrap();
    assert_ne!(token, envd_token);

    let (status, body) = to_port(&api, &id, "3000", None).await;
    assert_eq!(status, 403);
    assert_eq!(
        body,
        json!({"sandboxId": id, "code": 403, "message": "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"})
    );
    let (status, body) = to_port(&api, &id, "3000", Some("not-the-token")).await;
    assert_eq!(status, 403);
    assert_eq!(
        body["message"],
        "Sandbox is secured with traffic access token. Provided token in header 'e2b-traffic-access-token' is invalid"
    );
    // With the token the request passes the check; e2b-local relays to no sandbox port.
    let (status, body) = to_port(&api, &id, "3000", Some(&token)).await;
    assert_eq!(status, 502);
    assert_eq!(
        body["message"],
        "The sandbox is running but port is not open"
    );
    assert_eq!(body["port"], "3000");

    // envd's port keeps its own check (the envd access token) and needs no traffic token.
    let sandbox = Sandbox {
        id: id.clone(),
        token: Some(envd_token.to_owned()),
    };
    let run = api.run(&sandbox, "echo ok").await;
    assert_eq!(run.stdout, b"ok\n");

    // Connect hands the same token out again; a gone sandbox is the proxy's 502 first.
    let connected = api
        .post(&format!("/v2/sandboxes/{id}/connect"), r#"{"timeout":60}"#)
        .await;
    assert_eq!(connected.json["trafficAccessToken"], json!(token));
    assert_eq!(api.delete(&format!("/sandboxes/{id}")).await.status, 204);
    let (status, body) = to_port(&api, &id, "3000", Some(&token)).await;
    assert_eq!(status, 502);
    assert_eq!(body["message"], "The sandbox was not found");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn public_traffic_needs_no_token() {
    // contract: X6 — allowPublicTraffic true or absent: no token, nothing checked.
    let server = manual_server().await;
    let api = Api::new(&server);
    for network in [json!(null), json!({"allowPublicTraffic": true})] {
        let mut body = json!({"templateID": "base"});
        if !network.is_null() {
            body["network"] = network;
        }
        let created = api.post("/v2/sandboxes", &body.to_string()).await;
        assert_eq!(created.status, 201, "{}", created.text);
        assert_eq!(created.json["trafficAccessToken"], Value::Null);
        let id = created.json["sandboxID"].as_str().unwrap();
        let (status, body) = to_port(&api, id, "8080", None).await;
        assert_eq!(status, 502);
        assert_eq!(
            body["message"],
            "The sandbox is running but port is not open"
        );
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_traffic_token_survives_a_restart() {
    // contract: X6 — kept with the sandbox's record like its other fields.
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = Clock::manual(t0());
    let server = Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    let created = api
        .post(
            "/v2/sandboxes",
            &json!({"templateID": "base", "timeout": 60, "autoPause": true,
                    "network": {"allowPublicTraffic": false}})
            .to_string(),
        )
        .await;
    let id = created.json["sandboxID"].as_str().unwrap().to_owned();
    let token = created.json["trafficAccessToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        204
    );
    server.shutdown().await.unwrap();

    let server = Server::start(config).await.unwrap();
    let api = Api::new(&server);
    let resumed = api
        .post(&format!("/v2/sandboxes/{id}/connect"), r#"{"timeout":60}"#)
        .await;
    assert_eq!(resumed.status, 201, "{}", resumed.text);
    assert_eq!(resumed.json["trafficAccessToken"], json!(token));
    assert_eq!(to_port(&api, &id, "3000", None).await.0, 403);
    assert_eq!(to_port(&api, &id, "3000", Some(&token)).await.0, 502);
    server.shutdown().await.unwrap();
}
