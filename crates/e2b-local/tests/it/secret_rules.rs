//! Header rules naming E2B Secrets: `${e2b.secrets.<name>}` (with text around it) resolved
//! at each intercepted request, so a secret's update reaches a live sandbox's next request;
//! an unknown name sends nothing upstream, the raw placeholder least of all.

use std::net::IpAddr;
use std::sync::Arc;

use reqwest::Method;
use serde_json::json;

use crate::rules::{
    Binary, enforces, rules_with, running_as_root, sandbox_with_rules, sh, take, test_pki, upstream,
};

const FIRST: &str = "ghp_placeholder-secret-value-one";
const SECOND: &str = "ghp_placeholder-secret-value-two";

#[tokio::test]
async fn placeholders_in_header_rules_send_the_secrets_current_value_and_never_the_placeholder() {
    // contract: X21
    if !running_as_root() {
        // Rules need the mount namespace and the filter: elsewhere they are refused (X12).
        return;
    }
    let ip: IpAddr = "127.61.0.9".parse().unwrap();
    let pki = test_pki(&["api.example.test"]);
    let seen = upstream(ip, 443, Some(Arc::clone(&pki.server))).await;
    let server = Binary::start(&pki.ca_pem, &[("api.example.test", ip)]);
    let api = &server.api;
    if !enforces(api).await {
        return;
    }
    let created = api
        .post(
            "/secrets",
            &json!({"name": "gh", "value": FIRST}).to_string(),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let sandbox = sandbox_with_rules(api, "Bearer ${e2b.secrets.gh}").await;

    let out = sh(api, &sandbox, "curl -sS https://api.example.test/one").await;
    assert_eq!(out, "ok /one 0\n");
    let expected = format!("Bearer {FIRST}");
    assert_eq!(take(&seen)[0].header("authorization"), [expected.as_str()]);

    // One update of the secret; the live sandbox's next request carries the new value.
    let updated = api
        .post("/secrets/gh", &json!({"value": SECOND}).to_string())
        .await;
    assert_eq!(updated.status, 200, "{}", updated.text);
    let out = sh(api, &sandbox, "curl -sS https://api.example.test/two").await;
    assert_eq!(out, "ok /two 0\n");
    let expected = format!("Bearer {SECOND}");
    assert_eq!(take(&seen)[0].header("authorization"), [expected.as_str()]);

    // The sandbox's record holds the placeholder only.
    let detail = api.get(&format!("/sandboxes/{}", sandbox.id)).await;
    assert!(detail.text.contains("${e2b.secrets.gh}"), "{}", detail.text);
    assert!(!detail.text.contains("secret-value"), "{}", detail.text);

    // A rule naming a secret that does not exist: the sandbox gets a 502 naming it, the
    // upstream gets nothing.
    let path = format!("/sandboxes/{}/network", sandbox.id);
    let body = json!({"rules": rules_with("Bearer ${e2b.secrets.missing}")}).to_string();
    assert_eq!(api.rest(Method::PUT, &path, Some(&body)).await.status, 204);
    let out = sh(
        api,
        &sandbox,
        "curl -sS -w ' %{http_code}\\n' https://api.example.test/three",
    )
    .await;
    assert!(out.contains("the secret 'missing' does not exist"), "{out}");
    assert!(out.trim_end().ends_with(" 502"), "{out}");
    assert!(take(&seen).is_empty(), "nothing may reach the upstream");

    // A deleted secret is as unknown as one never made.
    let body = json!({"rules": rules_with("Bearer ${e2b.secrets.gh}")}).to_string();
    assert_eq!(api.rest(Method::PUT, &path, Some(&body)).await.status, 204);
    assert_eq!(api.delete("/secrets/gh").await.status, 204);
    let out = sh(
        api,
        &sandbox,
        "curl -sS -w ' %{http_code}\\n' https://api.example.test/four",
    )
    .await;
    assert!(out.trim_end().ends_with(" 502"), "{out}");
    assert!(take(&seen).is_empty(), "nothing may reach the upstream");
    assert!(!server.log_text().contains("secret-value"));
}
