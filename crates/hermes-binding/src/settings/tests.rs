//! Unit tests of settings parsing, endpoint precedence and unknown-key suggestions.

use table::SettingDefault;

use super::*;

fn raw(entries: &[(&str, Value)]) -> BTreeMap<String, Value> {
    entries
        .iter()
        .map(|(key, value)| ((*key).to_owned(), value.clone()))
        .collect()
}

#[test]
fn defaults_are_the_cores() {
    let settings = Settings::parse(&BTreeMap::new(), None).unwrap();
    let config = &settings.config;
    assert_eq!(config.template, "base");
    assert_eq!(config.cwd, None, "the cwd follows the sandbox's real home");
    assert_eq!(config.lease, Duration::from_secs(300));
    assert_eq!(config.command_grace, Duration::from_secs(30));
    assert_eq!(config.internet, InternetAccess::Allowed);
    assert_eq!(config.security, Security::Secure);
    assert!(config.metadata.is_empty());
    assert_eq!(settings.sandbox_id, None);
    assert_eq!(settings.endpoint_summary(), "E2B cloud (e2b.app)");
}

#[test]
fn every_key_of_the_settings_table_is_read_with_its_default() {
    let nulls = SETTINGS
        .iter()
        .map(|setting| (setting.key.to_owned(), Value::Null))
        .collect();
    let settings = Settings::parse(&nulls, None).unwrap();
    assert!(
        settings.unknown_keys.is_empty(),
        "{:?}",
        settings.unknown_keys
    );
    for setting in &SETTINGS {
        if let SettingDefault::Config(read) | SettingDefault::Lifetime(read) = setting.default {
            assert_eq!(
                read(&settings.config),
                read(&table::core_defaults()),
                "{}",
                setting.key
            );
        }
    }
}

/// A value of `setting`'s kind other than `default`.
fn other_value(key: &str, default: &table::Fixed) -> Value {
    match default {
        table::Fixed::Seconds(seconds) => Value::Int(i64::try_from(*seconds).unwrap() + 7),
        table::Fixed::Flag(flag) => Value::Bool(!flag),
        table::Fixed::Count(count) => Value::Int(i64::try_from(*count).unwrap() + 1),
        table::Fixed::Text(text) if key == "writer_arbitration" => {
            Value::Str(if text == "host" { "sandbox" } else { "host" }.to_owned())
        }
        table::Fixed::Text(text) if key == "subagents" => {
            Value::Str(if text == "shared" { "fork" } else { "shared" }.to_owned())
        }
        table::Fixed::Text(text) if key == "subagent_forks" => {
            Value::Str(if text == "kill" { "keep" } else { "kill" }.to_owned())
        }
        table::Fixed::Text(text) if key == "credential_store" => {
            Value::Str(if text == "auto" { "rules" } else { "auto" }.to_owned())
        }
        table::Fixed::Text(text) => Value::Str(format!("{text}-other")),
    }
}

#[test]
fn the_table_reads_the_field_its_key_sets() {
    // A table entry's default is read out of `Config`; this proves it reads the field the
    // parser writes for that key, so the default shown is the default applied.
    for setting in &SETTINGS {
        let (SettingDefault::Config(read) | SettingDefault::Lifetime(read)) = setting.default
        else {
            continue;
        };
        let default = read(&table::core_defaults());
        let given = raw(&[(setting.key, other_value(setting.key, &default))]);
        let changed = read(&Settings::parse(&given, Some(1)).unwrap().config);
        assert_ne!(changed, default, "{} does not reach its field", setting.key);
    }
}

#[test]
fn the_checkpoint_settings_are_off_by_default_and_reach_their_fields() {
    // contract: R11
    let defaults = Settings::parse(&BTreeMap::new(), None).unwrap().checkpoints;
    assert_eq!(defaults, CheckpointSettings::defaults());
    assert!(!defaults.at_session_start && !defaults.agent_tool && defaults.turns == 0);
    for setting in &SETTINGS {
        let SettingDefault::Plugin(read) = setting.default else {
            continue;
        };
        let default = read(&AdapterSettings::defaults());
        let given = raw(&[(setting.key, other_value(setting.key, &default))]);
        let changed = read(&Settings::parse(&given, None).unwrap().adapter());
        assert_ne!(changed, default, "{} does not reach its field", setting.key);
    }
    for (key, value) in [
        ("checkpoint_keep", Value::Int(0)),
        ("checkpoint_keep", Value::Int(101)),
        ("turn_checkpoints", Value::Int(-1)),
        ("turn_checkpoints", Value::Str("many".to_owned())),
        ("checkpoint_tool", Value::Str("yes".to_owned())),
    ] {
        let error = Settings::parse(&raw(&[(key, value)]), None).unwrap_err();
        assert!(error.to_string().contains(key), "{error}");
    }
}

#[test]
fn setting_keys_are_unique_and_endpoint_keys_have_their_variables() {
    for (index, setting) in SETTINGS.iter().enumerate() {
        assert!(
            SETTINGS[..index]
                .iter()
                .all(|other| other.key != setting.key),
            "{} twice",
            setting.key
        );
    }
    assert_eq!(
        endpoint_env_vars(),
        ["E2B_DOMAIN", "E2B_API_URL", "E2B_SANDBOX_URL"]
    );
    let with_env: Vec<_> = SETTINGS
        .iter()
        .filter(|setting| setting.env.is_some())
        .map(|setting| setting.key)
        .collect();
    assert_eq!(with_env, ENDPOINT_KEYS);
}

#[test]
fn writer_arbitration_is_host_or_sandbox_and_reaches_the_config() {
    // contract: C8
    let settings = Settings::parse(&BTreeMap::new(), None).unwrap();
    assert_eq!(settings.config.writer_arbitration, WriterArbitration::Host);
    assert!(settings.arbitration_summary().starts_with("host"));
    let sandbox = raw(&[("writer_arbitration", Value::Str("sandbox".to_owned()))]);
    let settings = Settings::parse(&sandbox, None).unwrap();
    assert!(matches!(
        settings.config.writer_arbitration,
        WriterArbitration::Sandbox { .. }
    ));
    assert!(settings.arbitration_summary().starts_with("sandbox"));
    let config = settings.to_config(
        ApiKeySource::Key(agent_sandbox::ApiKey::new("k".to_owned())),
        Persistence::Persistent,
        Duration::from_secs(300),
    );
    assert_eq!(
        config.writer_arbitration,
        settings.config.writer_arbitration
    );
    let error = Settings::parse(
        &raw(&[("writer_arbitration", Value::Str("both".to_owned()))]),
        None,
    )
    .expect_err("refused");
    assert!(error.to_string().contains("writer_arbitration"), "{error}");
}

#[test]
fn lease_falls_back_to_hermes_lifetime_but_the_setting_wins() {
    let settings = Settings::parse(&BTreeMap::new(), Some(900)).unwrap();
    assert_eq!(settings.config.lease, Duration::from_secs(900));
    let settings = Settings::parse(&raw(&[("lease_seconds", Value::Int(60))]), Some(900)).unwrap();
    assert_eq!(settings.config.lease, Duration::from_secs(60));
}

#[test]
fn wrong_types_and_ranges_name_the_key() {
    let cases = [
        ("lease_seconds", Value::Int(0)),
        ("lease_seconds", Value::Bool(true)),
        ("command_grace_seconds", Value::Int(-1)),
        ("allow_internet_access", Value::Str("yes".to_owned())),
        ("secure", Value::Int(1)),
        ("cwd", Value::Str("relative/dir".to_owned())),
        ("template", Value::Str(String::new())),
        ("api_url", Value::Str("ftp://x".to_owned())),
        ("api_url", Value::Str("https://user:key@host".to_owned())),
        ("sandbox_id", Value::Str("../etc".to_owned())),
        ("metadata", Value::Str("team".to_owned())),
        ("metadata", Value::Str("=infra".to_owned())),
        ("metadata", Value::Str("team=a, team=b".to_owned())),
        ("metadata", Value::Str("{\"team\": [1]}".to_owned())),
        ("metadata", Value::Str("{\"team\": \"infra\"".to_owned())),
        ("metadata", Value::Int(3)),
        ("domain", Value::Str("e2b.app/evil".to_owned())),
        ("deny_out", Value::Str("example.com".to_owned())),
        ("deny_out", Value::List(vec![Value::Int(1)])),
        ("allow_out", Value::Str("not a destination!".to_owned())),
        ("allow_out", Value::Str("[\"pypi.org\"".to_owned())),
        ("allow_out", Value::Bool(true)),
        ("subagent_paths", Value::Str("relative/dir".to_owned())),
        ("subagent_paths", Value::Str("/usr/local/src".to_owned())),
        ("subagent_paths", Value::Str("/".to_owned())),
        (
            "subagent_paths",
            Value::List(vec![Value::Str("/srv/../etc".to_owned())]),
        ),
    ];
    for (key, value) in cases {
        let error = Settings::parse(&raw(&[(key, value.clone())]), None)
            .expect_err(&format!("{key} = {value:?} must be refused"));
        assert!(error.is_configuration());
        assert!(error.to_string().contains(key), "{error}");
    }
}

#[test]
fn subagent_paths_are_plain_absolute_directories_given_as_a_list_or_text() {
    // contract: R15
    let settings = Settings::parse(
        &raw(&[(
            "subagent_paths",
            Value::List(vec![
                Value::Str("/workspace".to_owned()),
                Value::Str("/srv/my app".to_owned()),
            ]),
        )]),
        None,
    )
    .unwrap();
    assert_eq!(
        settings.config.subagent_paths,
        ["/workspace", "/srv/my app"]
    );
    let settings = Settings::parse(
        &raw(&[("subagent_paths", Value::Str("/workspace, /data".to_owned()))]),
        None,
    )
    .unwrap();
    assert_eq!(settings.config.subagent_paths, ["/workspace", "/data"]);
    assert!(
        Settings::parse(&BTreeMap::new(), None)
            .unwrap()
            .config
            .subagent_paths
            .is_empty()
    );
}

#[test]
fn flags_metadata_endpoints_and_attach_mode() {
    let mut metadata = BTreeMap::new();
    metadata.insert("team".to_owned(), Value::Str("infra".to_owned()));
    metadata.insert("tier".to_owned(), Value::Int(2));
    let settings = Settings::parse(
        &raw(&[
            ("allow_internet_access", Value::Bool(false)),
            ("secure", Value::Bool(false)),
            ("metadata", Value::Map(metadata)),
            ("api_url", Value::Str("http://127.0.0.1:3000/".to_owned())),
            (
                "sandbox_url",
                Value::Str("http://127.0.0.1:3000".to_owned()),
            ),
            ("sandbox_id", Value::Str("sbx-123".to_owned())),
            ("surprise", Value::Bool(true)),
        ]),
        None,
    )
    .unwrap();
    assert_eq!(settings.config.internet, InternetAccess::Denied);
    assert_eq!(settings.config.security, Security::Insecure);
    assert_eq!(
        settings.config.metadata.get("tier").map(String::as_str),
        Some("2")
    );
    assert_eq!(
        settings.endpoint_summary(),
        "http://127.0.0.1:3000 (api and sandbox)"
    );
    assert_eq!(settings.unknown_keys, vec!["surprise".to_owned()]);
    let config = settings.to_config(
        ApiKeySource::Resolver(std::sync::Arc::new(|| None)),
        Persistence::Persistent,
        Duration::from_secs(300),
    );
    assert!(matches!(config.mode, SandboxMode::Attach { .. }));
}

#[test]
fn placeholder_cwds_mean_where_the_session_is() {
    let settings = Settings::parse(&raw(&[("cwd", Value::Str("/srv".to_owned()))]), None).unwrap();
    let cwd = |requested, current| settings.session_cwd(requested, current);
    for placeholder in ["", "/root", "~"] {
        assert_eq!(cwd(placeholder, None).as_deref(), Some("/srv"));
        assert_eq!(cwd(placeholder, Some("~")).as_deref(), Some("/srv"));
        assert_eq!(cwd(placeholder, Some("/tmp")).as_deref(), Some("/tmp"));
    }
    assert_eq!(cwd("/opt", None).as_deref(), Some("/opt"));
    assert_eq!(cwd("/opt", Some("/tmp")).as_deref(), Some("/opt"));
    // Unconfigured, a placeholder means the sandbox's default, which attaching learns.
    let unset = Settings::parse(&BTreeMap::new(), None).unwrap();
    assert_eq!(unset.session_cwd("/root", None), None);
    assert_eq!(unset.session_cwd("~", Some("/root")), None);
}

#[test]
fn persistence_chooses_the_mode() {
    let settings = Settings::parse(&BTreeMap::new(), None).unwrap();
    let key = || ApiKeySource::Resolver(std::sync::Arc::new(|| None));
    let lifetime = Duration::from_secs(120);
    let persistent = settings.to_config(key(), Persistence::Persistent, lifetime);
    assert_eq!(persistent.mode, SandboxMode::Persistent);
    let ephemeral = settings.to_config(key(), Persistence::Ephemeral, lifetime);
    assert_eq!(ephemeral.mode, SandboxMode::Ephemeral { lifetime });
    assert!(Persistence::parse("sometimes").is_err());
}

fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        vars.iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| (*value).to_owned())
    }
}

const LOCAL_ENV: &[(&str, &str)] = &[
    ("E2B_API_URL", "http://127.0.0.1:3000/"),
    ("E2B_SANDBOX_URL", "http://127.0.0.1:3001"),
];

#[test]
fn endpoints_from_the_environment_alone() {
    let settings = Settings::parse_with_env(&BTreeMap::new(), None, &env(LOCAL_ENV)).unwrap();
    assert_eq!(settings.endpoints_from, EndpointSource::Environment);
    assert_eq!(
        settings.config.endpoints.api_url.as_deref(),
        Some("http://127.0.0.1:3000")
    );
    assert_eq!(
        settings.config.endpoints.sandbox_url.as_deref(),
        Some("http://127.0.0.1:3001")
    );
    assert_eq!(
        settings.endpoint_summary(),
        "api http://127.0.0.1:3000, sandbox http://127.0.0.1:3001 \
         (from E2B_* environment variables)"
    );
    let domain =
        Settings::parse_with_env(&BTreeMap::new(), None, &env(&[("E2B_DOMAIN", "e2b.corp")]))
            .unwrap();
    assert_eq!(domain.config.endpoints.domain.as_deref(), Some("e2b.corp"));
    assert_eq!(domain.config.endpoints.api_url, None);
}

#[test]
fn endpoints_from_the_settings_alone() {
    let raw = raw(&[("domain", Value::Str("e2b.corp".to_owned()))]);
    let settings = Settings::parse_with_env(&raw, None, &env(&[])).unwrap();
    assert_eq!(settings.endpoints_from, EndpointSource::Settings);
    assert_eq!(
        settings.config.endpoints.domain.as_deref(),
        Some("e2b.corp")
    );
    assert_eq!(settings.endpoint_summary(), "E2B at e2b.corp");
}

#[test]
fn endpoint_settings_win_over_the_environment_as_a_whole() {
    let raw = raw(&[("domain", Value::Str("e2b.corp".to_owned()))]);
    let settings = Settings::parse_with_env(&raw, None, &env(LOCAL_ENV)).unwrap();
    assert_eq!(settings.endpoints_from, EndpointSource::Settings);
    assert_eq!(
        settings.config.endpoints,
        Endpoints {
            domain: Some("e2b.corp".to_owned()),
            api_url: None,
            sandbox_url: None,
        }
    );
}

#[test]
fn neither_settings_nor_environment_means_e2b_cloud() {
    let empty = &env(&[("E2B_API_URL", ""), ("E2B_DOMAIN", "")]);
    let settings = Settings::parse_with_env(&BTreeMap::new(), None, empty).unwrap();
    assert_eq!(settings.endpoints_from, EndpointSource::Default);
    assert_eq!(settings.config.endpoints, Endpoints::e2b_cloud());
    assert_eq!(settings.endpoint_summary(), "E2B cloud (e2b.app)");
}

#[test]
fn a_bad_endpoint_variable_is_refused_by_its_name() {
    let bad = &env(&[("E2B_API_URL", "https://user:secret@host")]);
    let error = Settings::parse_with_env(&BTreeMap::new(), None, bad).unwrap_err();
    assert!(error.is_configuration());
    assert!(error.to_string().contains("E2B_API_URL"), "{error}");
    assert!(!error.to_string().contains("secret"), "{error}");
}

#[test]
fn unknown_keys_name_the_nearest_known_key() {
    assert_eq!(nearest_setting("lease_secs"), Some("lease_seconds"));
    assert_eq!(nearest_setting("Template"), Some("template"));
    assert_eq!(nearest_setting("sandbox_ur"), Some("sandbox_url"));
    assert_eq!(nearest_setting("api-url"), Some("api_url"));
    assert_eq!(nearest_setting("image"), None);
    assert_eq!(nearest_setting("completely_unrelated"), None);
    let settings = Settings::parse(
        &raw(&[
            ("lease_secs", Value::Int(60)),
            ("image", Value::Str("x".to_owned())),
        ]),
        None,
    )
    .unwrap();
    assert_eq!(
        settings.unknown_key_notes(),
        [
            "unknown setting image is ignored",
            "unknown setting lease_secs is ignored; did you mean lease_seconds?",
        ]
    );
}

#[test]
fn metadata_text_forms_equal_the_mapping() {
    // contract: the dashboard's text field and config.yaml's mapping give the same metadata.
    let mut mapping = BTreeMap::new();
    mapping.insert("team".to_owned(), Value::Str("infra".to_owned()));
    mapping.insert("tier".to_owned(), Value::Int(2));
    mapping.insert("url".to_owned(), Value::Str("a=b".to_owned()));
    let expected = Settings::parse(&raw(&[("metadata", Value::Map(mapping))]), None)
        .unwrap()
        .config
        .metadata;
    assert_eq!(expected.len(), 3);
    for text in [
        "team=infra, tier=2, url=a=b",
        "team = infra\ntier=2\n\nurl=a=b\n",
        r#"{"team": "infra", "tier": 2, "url": "a=b"}"#,
        r#"  {"url": "a=b", "tier": 2, "team": "infra"}  "#,
    ] {
        let settings =
            Settings::parse(&raw(&[("metadata", Value::Str(text.to_owned()))]), None).unwrap();
        assert_eq!(settings.config.metadata, expected, "{text:?}");
    }
    for blank in ["", "  ", " , \n"] {
        let settings =
            Settings::parse(&raw(&[("metadata", Value::Str(blank.to_owned()))]), None).unwrap();
        assert!(settings.config.metadata.is_empty(), "{blank:?}");
    }
    let error = Settings::parse(&raw(&[("metadata", Value::Str("team".to_owned()))]), None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("key=value pairs"), "{error}");
}

#[test]
fn egress_lists_come_as_lists_or_text_and_reach_the_config() {
    // contract: X9 — the forms Hermes hands over (a YAML list, text from `hermes config
    // set` or a config screen, a JSON list as text) mean the same policy.
    let list = Value::List(vec![
        Value::Str("PyPI.org".to_owned()),
        Value::Str("10.1.0.0/16".to_owned()),
    ]);
    let forms = [
        list,
        Value::Str("pypi.org, 10.1.0.0/16".to_owned()),
        Value::Str("pypi.org 10.1.0.0/16\n".to_owned()),
        Value::Str("[\"pypi.org\", \"10.1.0.0/16\"]".to_owned()),
    ];
    for form in forms {
        let settings = Settings::parse(
            &raw(&[
                ("allow_out", form.clone()),
                ("deny_out", Value::Str("0.0.0.0/0".to_owned())),
            ]),
            None,
        )
        .unwrap();
        let egress = &settings.config.egress;
        assert_eq!(egress.allow_out(), ["10.1.0.0/16", "pypi.org"], "{form:?}");
        assert_eq!(egress.deny_out(), ["0.0.0.0/0"]);
        assert_eq!(
            settings.egress_summary(),
            "allow 10.1.0.0/16, pypi.org; deny 0.0.0.0/0"
        );
    }
    let none = Settings::parse(&BTreeMap::new(), None).unwrap();
    assert!(none.config.egress.is_empty());
    assert_eq!(
        none.egress_summary(),
        "no rules: every destination is reachable"
    );
    let closed = Settings::parse(
        &raw(&[
            ("allow_internet_access", Value::Bool(false)),
            ("allow_out", Value::Str("pypi.org".to_owned())),
        ]),
        None,
    )
    .unwrap();
    assert_eq!(
        closed.egress_summary(),
        "allow pypi.org; deny 0.0.0.0/0 (0.0.0.0/0 from allow_internet_access: false)"
    );
}
