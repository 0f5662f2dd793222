//! Network egress rules: the `network` create field, the update route and the detail read.

use axum::body::Body;
use axum::response::Response;

use super::support::*;
use crate::*;

#[tokio::test]
async fn create_sends_the_network_config_as_the_sdk_does() {
    // contract: X11
    let server = TestServer::start(|_, _| json(201, &sandbox_json())).await;
    let client = client(&server.url);
    let mut options = CreateOptions::new("base".to_owned());
    let mut network = NetworkConfig::new(EgressRules::only(vec![
        "example.com".to_owned(),
        "10.1.0.0/16".to_owned(),
    ]));
    network.allow_public_traffic = Some(false);
    options.network = Some(network);
    client.create(options).await.expect("created");
    let body: serde_json::Value = serde_json::from_slice(&server.requests()[0].body).expect("json");
    // The wire names of the SDK's SandboxNetworkConfig.
    assert_eq!(
        body["network"],
        serde_json::json!({"allowOut": ["example.com", "10.1.0.0/16"], "denyOut": [ALL_TRAFFIC],
            "allowPublicTraffic": false})
    );

    // No network config: no field at all (E2B's defaults).
    client
        .create(CreateOptions::new("base".to_owned()))
        .await
        .expect("created");
    let body: serde_json::Value = serde_json::from_slice(&server.requests()[1].body).expect("json");
    assert!(body.get("network").is_none(), "{body}");
}

#[tokio::test]
async fn update_network_puts_both_lists_and_names_the_sandbox_in_errors() {
    // contract: X11
    let server = TestServer::start(|request, _| {
        if request.path_and_query == format!("/sandboxes/{SANDBOX}/network") {
            Response::builder()
                .status(204)
                .body(Body::empty())
                .expect("response")
        } else {
            json(
                404,
                &serde_json::json!({"code": 404, "message": "sandbox not found"}),
            )
        }
    })
    .await;
    let client = client(&server.url);
    let rules = EgressRules {
        allow_out: vec!["1.1.1.1".to_owned()],
        deny_out: Vec::new(),
    };
    client
        .update_network(&sandbox_id(), &rules)
        .await
        .expect("updated");
    let request = &server.requests()[0];
    assert_eq!(request.method, "PUT");
    assert_eq!(request.header("x-api-key"), Some(KEY));
    // Replace semantics: an empty list is sent, so it clears what was there.
    assert_eq!(
        std::str::from_utf8(&request.body).expect("utf-8"),
        r#"{"allowOut":["1.1.1.1"],"denyOut":[]}"#
    );

    let unknown = SandboxId::parse("iunknown0000000000000".to_owned()).expect("valid");
    let error = client
        .update_network(&unknown, &rules)
        .await
        .expect_err("unknown sandbox");
    assert!(error.is_sandbox_gone(), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("update sandbox network"), "{text}");
    assert!(text.contains("iunknown0000000000000"), "{text}");
}

#[tokio::test]
async fn get_reads_the_network_config_back() {
    // contract: X11
    let server = TestServer::start(|_, _| {
        let mut detail = detail_json();
        detail["network"] = serde_json::json!({"allowOut": ["a.example"], "denyOut": ["0.0.0.0/0"],
            "allowPublicTraffic": true, "maskRequestHost": "${PORT}-x.example"});
        json(200, &detail)
    })
    .await;
    let client = client(&server.url);
    let detail = client.get(&sandbox_id()).await.expect("detail");
    let network = detail.network.expect("network reported");
    assert_eq!(
        network.egress,
        EgressRules::only(vec!["a.example".to_owned()])
    );
    assert_eq!(network.allow_public_traffic, Some(true));
    assert_eq!(
        network.mask_request_host.as_deref(),
        Some("${PORT}-x.example")
    );
}

#[test]
fn same_as_ignores_order_repetition_and_domain_case() {
    let a = EgressRules {
        allow_out: vec!["Example.com".to_owned(), "1.2.3.4".to_owned()],
        deny_out: vec![ALL_TRAFFIC.to_owned()],
    };
    let b = EgressRules {
        allow_out: vec![
            "1.2.3.4".to_owned(),
            "example.com".to_owned(),
            "1.2.3.4".to_owned(),
        ],
        deny_out: vec![ALL_TRAFFIC.to_owned()],
    };
    assert!(a.same_as(&b));
    assert!(!a.same_as(&EgressRules::only(vec!["1.2.3.4".to_owned()])));
    assert!(!a.same_as(&EgressRules::unrestricted()));
}
