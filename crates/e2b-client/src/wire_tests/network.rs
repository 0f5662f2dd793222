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

/// A header value shaped like nothing the pattern pass knows, so only the known-value pass
/// can remove it.
const HEADER_VALUE: &str = "Bearer plainshapedvalue42";
const PROXY_PASSWORD: &str = "proxypasswordvalue7";

fn credential_rules() -> TransformRules {
    let mut headers = std::collections::BTreeMap::new();
    headers.insert(
        "Authorization".to_owned(),
        SecretValue::new(HEADER_VALUE.to_owned()),
    );
    let mut rules = TransformRules::new();
    rules.insert(
        "api.github.com".to_owned(),
        vec![HeaderTransform { headers }],
    );
    rules
}

fn proxy() -> EgressProxy {
    EgressProxy {
        address: "proxy.example:1080".to_owned(),
        username: Some("user".to_owned()),
        password: Some(SecretValue::new(PROXY_PASSWORD.to_owned())),
    }
}

/// A server that echoes the request body in a 400, and the credential alone, as a careless
/// validator might.
async fn echoing_server() -> TestServer {
    TestServer::start(|request, _| {
        json(
            400,
            &serde_json::json!({"code": 400,
                "message": format!("bad body {}; bad credential plainshapedvalue42",
                    String::from_utf8_lossy(&request.body))}),
        )
    })
    .await
}

/// Rules whose value has no shape the pattern pass knows (no `Bearer`, no `key=`).
fn shapeless_rules() -> TransformRules {
    let mut headers = std::collections::BTreeMap::new();
    headers.insert(
        "X-Custom".to_owned(),
        SecretValue::new("Scheme plainshapedvalue42".to_owned()),
    );
    let mut rules = TransformRules::new();
    rules.insert(
        "api.github.com".to_owned(),
        vec![HeaderTransform { headers }],
    );
    rules
}

#[tokio::test]
async fn create_sends_transform_rules_and_the_egress_proxy_as_the_sdk_does() {
    // contract: X15
    let server = TestServer::start(|_, _| json(201, &sandbox_json())).await;
    let client = client(&server.url);
    let mut options = CreateOptions::new("base".to_owned());
    let mut network = NetworkConfig::new(EgressRules::only(vec!["api.github.com".to_owned()]));
    network.rules = credential_rules();
    network.egress_proxy = Some(proxy());
    options.network = Some(network.clone());
    client.create(options).await.expect("created");
    let body: serde_json::Value = serde_json::from_slice(&server.requests()[0].body).expect("json");
    assert_eq!(
        body["network"],
        serde_json::json!({"allowOut": ["api.github.com"], "denyOut": [ALL_TRAFFIC],
            "rules": {"api.github.com": [{"transform": {"headers": {"Authorization": HEADER_VALUE}}}]},
            "egressProxy": {"address": "proxy.example:1080", "username": "user",
                "password": PROXY_PASSWORD}})
    );
    // Debug of the configuration shows neither secret.
    let shown = format!("{network:?}");
    assert!(!shown.contains("plainshapedvalue42"), "{shown}");
    assert!(!shown.contains(PROXY_PASSWORD), "{shown}");
    assert!(shown.contains("api.github.com"), "{shown}");
}

#[tokio::test]
async fn replace_network_sends_the_whole_policy_and_omits_what_is_empty() {
    // contract: X15
    let server = TestServer::start(|_, _| {
        Response::builder()
            .status(204)
            .body(Body::empty())
            .expect("response")
    })
    .await;
    let client = client(&server.url);
    let mut update = NetworkUpdate::new(EgressRules::only(vec!["api.github.com".to_owned()]));
    update.rules = credential_rules();
    client
        .replace_network(&sandbox_id(), &update)
        .await
        .expect("updated");
    let body: serde_json::Value = serde_json::from_slice(&server.requests()[0].body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"allowOut": ["api.github.com"], "denyOut": [ALL_TRAFFIC],
            "rules": {"api.github.com": [{"transform": {"headers": {"Authorization": HEADER_VALUE}}}]}})
    );
    // Nothing to transform: no `rules` (omitted clears them, as an empty map would).
    client
        .replace_network(
            &sandbox_id(),
            &NetworkUpdate::new(EgressRules::unrestricted()),
        )
        .await
        .expect("updated");
    assert_eq!(
        std::str::from_utf8(&server.requests()[1].body).expect("utf-8"),
        r#"{"allowOut":[],"denyOut":[]}"#
    );
}

#[tokio::test]
async fn errors_never_carry_a_header_value_or_the_proxy_password() {
    // contract: X15
    let server = echoing_server().await;
    let client = client(&server.url);
    let mut update = NetworkUpdate::new(EgressRules::unrestricted());
    update.rules = shapeless_rules();
    update.egress_proxy = Some(proxy());
    let update_error = client
        .replace_network(&sandbox_id(), &update)
        .await
        .expect_err("refused");
    let mut options = CreateOptions::new("base".to_owned());
    let mut network = NetworkConfig::new(EgressRules::unrestricted());
    network.rules = shapeless_rules();
    network.egress_proxy = Some(proxy());
    options.network = Some(network);
    let create_error = client.create(options).await.expect_err("refused");
    for error in [update_error, create_error] {
        for shown in [error.to_string(), format!("{error:?}")] {
            // The body did reach the error (the server echoed it) ...
            assert!(shown.contains("api.github.com"), "{shown}");
            // ... without the value, or the credential inside it, or the password.
            assert!(!shown.contains("plainshapedvalue42"), "{shown}");
            assert!(!shown.contains(PROXY_PASSWORD), "{shown}");
        }
    }
}

#[tokio::test]
async fn get_reads_transform_rules_back_without_showing_them() {
    // contract: X15
    let server = TestServer::start(|_, _| {
        let mut detail = detail_json();
        detail["network"] = serde_json::json!({"allowOut": ["api.github.com"],
            "rules": {"api.github.com": [{"transform": {"headers": {"Authorization": HEADER_VALUE}}}],
                "other.example": [{}]},
            "egressProxy": {"address": "p:1080"}});
        json(200, &detail)
    })
    .await;
    let client = client(&server.url);
    let detail = client.get(&sandbox_id()).await.expect("detail");
    let shown = format!("{detail:?}");
    assert!(!shown.contains("plainshapedvalue42"), "{shown}");
    let network = detail.network.expect("network reported");
    assert_eq!(
        network.rules["api.github.com"],
        credential_rules()["api.github.com"]
    );
    assert!(network.rules["other.example"][0].headers.is_empty());
    let proxy = network.egress_proxy.expect("proxy");
    assert_eq!(proxy.address, "p:1080");
    assert_eq!(proxy.password, None);
}
