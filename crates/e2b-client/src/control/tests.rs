use super::*;
use crate::secret::AccessToken;

#[test]
fn order_start_time_and_template_filters_are_sent_as_the_sdk_sends_them() {
    let mut query = ListQuery::all();
    query.state = StateFilter::Running;
    query.order = Some(ListOrder::OldestFirst);
    query.started_after = Some(time::macros::datetime!(2026-12-07 10:00:00 UTC));
    query.template = Some("code interpreter/v1".to_owned());
    assert_eq!(
        list_query_string(&query),
        "state=running&order=asc&startedAfter=2026-12-07T10%3A00%3A00Z&template=code%20interpreter%2Fv1"
    );
    query.order = Some(ListOrder::NewestFirst);
    query.started_after = None;
    query.template = None;
    assert_eq!(list_query_string(&query), "state=running&order=desc");
}

#[test]
fn metadata_filter_matches_the_wire_capture() {
    let one: BTreeMap<String, String> = [("scope".to_owned(), "a b/c".to_owned())].into();
    assert_eq!(metadata_filter(&one), "scope%3Da%252520b%252Fc");
    let mut query = ListQuery::all();
    query.metadata = one;
    query.limit = Some(50);
    // As the official SDK sends it: GET /v2/sandboxes?metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=50
    assert_eq!(
        list_query_string(&query),
        "metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=50"
    );
}

#[test]
fn metadata_filter_separators_and_unicode() {
    let map: BTreeMap<String, String> = [
        ("hermes.scope".to_owned(), "ab12".to_owned()),
        ("k=&".to_owned(), "v?#é".to_owned()),
    ]
    .into();
    // quote("k=&") = k%3D%26, urlencode -> k%253D%2526, query -> k%25253D%252526.
    // quote("v?#é") = v%3F%23%C3%A9 -> v%253F%2523%25C3%25A9 -> v%25253F%252523%2525C3%2525A9.
    assert_eq!(
        metadata_filter(&map),
        "hermes.scope%3Dab12%26k%25253D%252526%3Dv%25253F%252523%2525C3%2525A9"
    );
}

/// Decodes the filter the way E2B's server does (URL-decode twice) and checks it round-trips.
#[test]
fn metadata_filter_round_trips_through_the_server_decoding() {
    fn unescape(text: &str) -> String {
        percent_encoding::percent_decode_str(&text.replace('+', " "))
            .decode_utf8()
            .expect("utf-8")
            .into_owned()
    }
    let map: BTreeMap<String, String> = [
        ("scope".to_owned(), "a b/c+d%e".to_owned()),
        ("x y".to_owned(), "&=?".to_owned()),
    ]
    .into();
    // The query layer decodes once, then the server unescapes, splits, unescapes again.
    let as_received = unescape(&metadata_filter(&map));
    let once = unescape(&as_received);
    let mut decoded = BTreeMap::new();
    for pair in once.split('&') {
        let parts: Vec<&str> = pair.split('=').collect();
        assert_eq!(parts.len(), 2, "{pair}");
        decoded.insert(unescape(parts[0]), unescape(parts[1]));
    }
    assert_eq!(decoded, map);
}

#[test]
fn state_filters() {
    let mut query = ListQuery::all();
    assert_eq!(list_query_string(&query), "state=running%2Cpaused");
    query.state = StateFilter::Paused;
    assert_eq!(list_query_string(&query), "state=paused");
}

#[test]
fn create_body_for_each_lifecycle() {
    let metadata = BTreeMap::from([("scope".to_owned(), "x".to_owned())]);
    let envs = BTreeMap::new();
    let body = |auto_pause, auto_pause_memory| NewSandbox {
        template_id: "base",
        timeout: Some(120),
        auto_pause,
        auto_pause_memory,
        auto_resume: None,
        secure: None,
        allow_internet_access: Some(false),
        network: None,
        metadata: &metadata,
        env_vars: &envs,
        volume_mounts: &[],
        iam: None,
        mcp: None,
    };
    assert_eq!(
        serde_json::to_string(&body(Some(true), Some(false))).expect("json"),
        r#"{"templateID":"base","timeout":120,"autoPause":true,"autoPauseMemory":false,"allow_internet_access":false,"metadata":{"scope":"x"},"envVars":{}}"#
    );
    assert_eq!(
        serde_json::to_string(&body(Some(false), None)).expect("json"),
        r#"{"templateID":"base","timeout":120,"autoPause":false,"allow_internet_access":false,"metadata":{"scope":"x"},"envVars":{}}"#
    );
}

/// A create of `base` setting nothing, its metadata and env vars both `empty`.
fn bare_body(empty: &BTreeMap<String, String>) -> NewSandbox<'_> {
    NewSandbox {
        template_id: "base",
        timeout: None,
        auto_pause: None,
        auto_pause_memory: None,
        auto_resume: None,
        secure: None,
        allow_internet_access: None,
        network: None,
        metadata: empty,
        env_vars: empty,
        volume_mounts: &[],
        iam: None,
        mcp: None,
    }
}

#[test]
fn a_create_body_names_its_volume_mounts_and_omits_none() {
    let map = BTreeMap::new();
    let mounts = [crate::VolumeMountInfo::new(
        "data".to_owned(),
        "/mnt/data".to_owned(),
    )];
    let body = NewSandbox {
        volume_mounts: &mounts,
        ..bare_body(&map)
    };
    let value = serde_json::to_value(&body).expect("json");
    assert_eq!(
        value["volumeMounts"],
        serde_json::json!([{"name": "data", "path": "/mnt/data"}])
    );
    assert!(value.get("iam").is_none() && value.get("mcp").is_none());
}

#[test]
fn iam_tokens_go_as_e2b_spells_them_and_bad_names_are_refused() {
    let map = BTreeMap::new();
    let tokens = BTreeMap::from([(
        "aws".to_owned(),
        crate::IamToken::jwt_svid("sts.amazonaws.com".to_owned()),
    )]);
    let body = NewSandbox {
        iam: Some(IamWire { tokens: &tokens }),
        ..bare_body(&map)
    };
    assert_eq!(
        serde_json::to_value(&body).expect("json")["iam"],
        serde_json::json!({"tokens": {"aws": {"audience": "sts.amazonaws.com", "tokenType": "JWT-SVID"}}})
    );
    assert_eq!(
        crate::identity_token_placeholder("aws").expect("usable"),
        "${e2b.identity.tokens.aws}"
    );
    for bad in ["", "a}b", "a{b", "a\nb"] {
        assert!(crate::identity_token_placeholder(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn whole_seconds_round_up() {
    assert_eq!(whole_secs(Duration::from_millis(1500)), 2);
    assert_eq!(whole_secs(Duration::from_secs(30)), 30);
    assert_eq!(whole_secs(Duration::ZERO), 0);
}

#[test]
fn decodes_sandbox_shapes() {
    let info: SandboxInfo = serde_json::from_str(
        r#"{"templateID":"rki5","alias":"base","sandboxID":"ikk8xw53nne4bytcdg87t",
            "clientID":"6532622b","envdVersion":"0.6.13","envdAccessToken":"tok",
            "trafficAccessToken":null,"domain":null,"someNewField":[1,2]}"#,
    )
    .expect("camelCase");
    assert_eq!(info.sandbox_id.as_str(), "ikk8xw53nne4bytcdg87t");
    assert_eq!(
        info.envd_access_token.as_ref().map(AccessToken::expose),
        Some("tok")
    );
    assert!(info.traffic_access_token.is_none() && info.domain.is_none());
    // contract: X6 — a private sandbox's traffic access token is read, and is a secret:
    // Debug output never shows it.
    let private: SandboxInfo = serde_json::from_str(
        r#"{"templateID":"rki5","sandboxID":"ikk8xw53nne4bytcdg87t","clientID":"6532622b",
            "envdVersion":"0.6.13","envdAccessToken":"tok","trafficAccessToken":"traffic-secret-1"}"#,
    )
    .expect("with a traffic token");
    assert_eq!(
        private
            .traffic_access_token
            .as_ref()
            .map(AccessToken::expose),
        Some("traffic-secret-1")
    );
    let shown = format!("{private:?}");
    assert!(!shown.contains("traffic-secret-1"), "{shown}");
    let snake: SandboxInfo = serde_json::from_str(
        r#"{"sandbox_id":"abc","template_id":"t","envd_version":"0.6.13","envd_access_token":""}"#,
    )
    .expect("snake_case");
    assert_eq!(snake.template_id, "t");
    assert!(snake.envd_access_token.is_none());
    assert!(serde_json::from_str::<SandboxInfo>(r#"{"sandboxID":"../x"}"#).is_err());

    let detail: SandboxDetail = serde_json::from_str(
        r#"{"templateID":"base","alias":"base","sandboxID":"ikk8","clientID":"6532622b",
            "startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:05:00Z","cpuCount":2,
            "memoryMB":"512","diskSizeMB":1024,"metadata":{"scope":"s"},"state":"running",
            "envdVersion":"0.6.13","envdAccessToken":"tok","allowInternetAccess":false,
            "domain":null,"lifecycle":{"autoResume":false,"onTimeout":"pause"}}"#,
    )
    .expect("detail");
    assert_eq!(detail.summary.memory_mb, 512);
    assert_eq!(detail.summary.state, SandboxState::Running);
    assert_eq!(
        (detail.summary.end_at - detail.summary.started_at).whole_seconds(),
        300
    );
    assert_eq!(
        detail.lifecycle.as_ref().map(|l| l.on_timeout.as_str()),
        Some("pause")
    );
    assert_eq!(detail.allow_internet_access, Some(false));
    let access = detail.envd_access();
    assert_eq!(access.sandbox_id.as_str(), "ikk8");

    let listed: Vec<ListedSandbox> = serde_json::from_str(
        r#"[{"sandbox_id":"a1","started_at":"2026-01-01T00:00:00Z","end_at":"2026-01-01T00:00:00Z",
             "state":"snapshotting","metadata":null,"cpu_count":"4"}]"#,
    )
    .expect("listed");
    assert_eq!(
        listed[0].state,
        SandboxState::Other("snapshotting".to_owned())
    );
    assert_eq!(listed[0].cpu_count, 4);
    assert!(listed[0].metadata.is_empty());
}

#[test]
fn every_spelling_of_the_shared_fields_reaches_every_sandbox_answer() {
    let times =
        r#""startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:05:00Z","state":"running""#;
    for (id, template, client, envd, token) in [
        (
            "sandboxID",
            "templateID",
            "clientID",
            "envdVersion",
            "envdAccessToken",
        ),
        (
            "sandboxId",
            "templateId",
            "clientId",
            "envdVersion",
            "envdAccessToken",
        ),
        (
            "sandbox_id",
            "template_id",
            "client_id",
            "envd_version",
            "envd_access_token",
        ),
    ] {
        let shared = format!(
            r#""{id}":"ikk8","{template}":"t","alias":"a","{client}":"c","{envd}":"0.6.13","{token}":"tok","domain":"d""#
        );
        let info: SandboxInfo =
            serde_json::from_str(&format!("{{{shared}}}")).expect("create answer");
        let listed: ListedSandbox =
            serde_json::from_str(&format!("{{{shared},{times}}}")).expect("list answer");
        let detail: SandboxDetail =
            serde_json::from_str(&format!("{{{shared},{times}}}")).expect("get answer");
        for (sandbox_id, template_id, alias, client_id, envd_version) in [
            (
                &info.sandbox_id,
                &info.template_id,
                &info.alias,
                &info.client_id,
                &info.envd_version,
            ),
            (
                &listed.sandbox_id,
                &listed.template_id,
                &listed.alias,
                &listed.client_id,
                &listed.envd_version,
            ),
            (
                &detail.summary.sandbox_id,
                &detail.summary.template_id,
                &detail.summary.alias,
                &detail.summary.client_id,
                &detail.summary.envd_version,
            ),
        ] {
            assert_eq!(sandbox_id.as_str(), "ikk8", "{id}");
            assert_eq!(
                (template_id.as_str(), alias.as_deref()),
                ("t", Some("a")),
                "{template}"
            );
            assert_eq!(
                (client_id.as_str(), envd_version.as_str()),
                ("c", "0.6.13"),
                "{client}"
            );
        }
        for access in [info.envd_access(), detail.envd_access()] {
            assert_eq!(
                access.access_token.as_ref().map(AccessToken::expose),
                Some("tok"),
                "{token}"
            );
            assert_eq!(access.domain.as_deref(), Some("d"));
        }
    }
}

#[test]
fn sandbox_states_decode_by_name_and_keep_unknown_ones() {
    let state = |raw: &str| serde_json::from_value::<SandboxState>(serde_json::json!(raw));
    assert_eq!(state("running").unwrap(), SandboxState::Running);
    assert_eq!(state("paused").unwrap(), SandboxState::Paused);
    assert_eq!(
        state("snapshotting").unwrap(),
        SandboxState::Other("snapshotting".to_owned())
    );
}
