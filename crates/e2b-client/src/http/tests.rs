use super::*;
use crate::config::Config;

fn ctx(target: Target) -> Ctx {
    Ctx::new(
        Operation::Kill,
        target,
        ApiKey::new("e2b_secretkey_123456".to_owned()),
        Some(AccessToken::new("envd-token-abcdef".to_owned())),
    )
}

fn id() -> SandboxId {
    SandboxId::parse("isbx1".to_owned()).expect("valid id")
}

#[test]
fn control_plane_error_bodies() {
    let ctx = ctx(Target::Control(Some(id())));
    let error = ctx.response_error(
        404,
        br#"{"code":404,"message":"Sandbox \"isbx1\" doesn't exist or you don't have access to it"}"#,
    );
    assert!(error.is_not_found());
    assert!(error.is_sandbox_gone());
    assert!(!error.is_conflict());
    assert_eq!(error.status(), Some(404));
    let error = ctx.response_error(
        409,
        br#"{"code":409,"message":"already paused","error_code":"conflict_x"}"#,
    );
    assert!(error.is_conflict());
    assert_eq!(error.code(), Some("conflict_x"));
    let error = ctx.response_error(503, b"<html>busy</html>");
    assert!(error.is_transient());
    assert!(error.to_string().contains("<html>busy</html>"), "{error}");
    let error = ctx.response_error(500, b"");
    assert!(error.to_string().contains("(empty body)"), "{error}");
}

#[test]
fn envd_error_bodies() {
    let ctx = ctx(Target::Envd(id()));
    let error = ctx.response_error(
        404,
        br#"{"code":"not_found","message":"process with pid 1001 not found"}"#,
    );
    assert!(error.is_not_found());
    assert!(!error.is_sandbox_gone());
    assert_eq!(error.code(), Some("not_found"));
    let error = ctx.response_error(
        502,
        br#"{"sandboxId":"isbx1","message":"The sandbox was not found","code":502}"#,
    );
    assert!(error.is_sandbox_gone());
    assert!(!error.is_transient());
    assert!(matches!(error, Error::SandboxNotRunning { .. }));
    let error = ctx.response_error(
        502,
        br#"{"message":"The sandbox is running but port is not open","code":502}"#,
    );
    assert!(!error.is_sandbox_gone());
    assert!(error.is_transient());
    assert_eq!(error.code(), None);
    let error = ctx.response_error(409, br#"{"code":"already_exists","message":"exists"}"#);
    assert!(error.is_conflict());
    let error = ctx.response_error(401, br#"{"code":401,"message":"unauthorized access"}"#);
    assert!(error.is_unauthorized());
}

#[test]
fn error_text_never_carries_known_secrets() {
    // contract: X1
    let ctx = ctx(Target::Envd(id()));
    let error = ctx.response_error(
        400,
        br#"{"code":"invalid_argument","message":"bad token envd-token-abcdef for key e2b_secretkey_123456"}"#,
    );
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains("envd-token-abcdef"), "{shown}");
    assert!(!shown.contains("secretkey"), "{shown}");
}

#[test]
fn stream_errors_keep_the_connect_code() {
    let ctx = ctx(Target::Envd(id()));
    let error = ctx.stream_error(
        Some("deadline_exceeded".to_owned()),
        Some("context deadline exceeded".to_owned()),
    );
    assert!(error.is_deadline_exceeded());
    assert_eq!(error.status(), None);
    assert!(
        error
            .to_string()
            .contains("stream error (deadline_exceeded)")
    );
}

proptest::proptest! {
    #[test]
    fn no_variant_ever_shows_a_secret(
        key in "[A-Z][0-9][A-Za-z0-9_-]{8,40}",
        token in "[A-Z][0-9][A-Za-z0-9_-]{8,40}",
        user in "[A-Z][0-9][a-z0-9]{6,12}",
        pass in "[A-Z][0-9][A-Za-z0-9]{6,20}",
        sig in "[A-Z][0-9][A-Za-z0-9_-]{6,30}",
        status in 300u16..600,
    ) {
        // contract: X1, X4
        let hostile = format!(
            "key {key} X-API-Key: {key} token={token} Timeout at https://{user}:{pass}@h.example/files?path=a&signature={sig} Authorization: Bearer {token} timed out"
        );
        let json_body = serde_json::json!({"code": status, "message": hostile, "error_code": hostile}).to_string();
        let connect_body = serde_json::json!({"code": hostile, "message": hostile}).to_string();
        let gone_body = serde_json::json!({"code": 502, "message": format!("The sandbox was not found {hostile}")}).to_string();
        let control = Ctx::new(Operation::Create, Target::Control(None), ApiKey::new(key.clone()), None);
        let envd = Ctx::new(
            Operation::StartProcess,
            Target::Envd(id()),
            ApiKey::new(key.clone()),
            Some(AccessToken::new(token.clone())),
        );
        let mut errors = vec![
            control.response_error(status, json_body.as_bytes()),
            control.response_error(status, hostile.as_bytes()),
            envd.response_error(status, connect_body.as_bytes()),
            envd.response_error(502, gone_body.as_bytes()),
            envd.response_error(status, hostile.as_bytes()),
            envd.stream_error(Some(hostile.clone()), Some(hostile.clone())),
            envd.protocol(&hostile),
            envd.invalid_input(&hostile),
            envd.limit(Some(&hostile), 10),
            control.deadline(std::time::Duration::from_secs(3)),
        ];
        let mut config = Config::new(ApiKey::new(key.clone()));
        config.api_url = Some(format!("gopher://{user}:{pass}@h.example/?signature={sig}"));
        errors.push(crate::Client::new(config).expect_err("bad scheme"));
        for error in &errors {
            let shown = format!("{error} | {error:?}");
            for secret in [&key, &token, &pass, &user, &sig] {
                proptest::prop_assert!(!shown.contains(secret.as_str()), "{} in {}", secret, shown);
            }
        }
    }
}
