//! The error type's tests, and the Hermes boundary's rule: no text that reaches Python says
//! "timeout" (moved here from agent-sandbox's and e2b-client's own tests when the rewrite
//! moved to this boundary).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;

use pyo3::Python;

use super::*;

#[test]
fn error_is_send_sync_static() {
    fn check<T: Send + Sync + 'static>() {}
    check::<Error>();
}

#[test]
fn invalid_setting_names_the_key_and_is_configuration() {
    let error = Error::InvalidSetting {
        key: "lease_seconds".to_owned(),
        reason: "must be a positive integer".to_owned(),
        file: None,
    };
    assert!(error.is_configuration());
    assert!(!error.is_not_ready());
    assert_eq!(
        error.to_string(),
        "E2B setting lease_seconds is invalid: must be a positive integer"
    );
}

#[test]
fn a_bad_setting_names_its_file_what_is_valid_and_the_check_that_always_works() {
    // contract: O5
    let home = PathBuf::from("/srv/profiles/work");
    let raw = std::collections::BTreeMap::from([(
        "lease_seconds".to_owned(),
        crate::settings::Value::Int(-5),
    )]);
    let error = crate::settings::Settings::parse_with_env(&raw, None, &|_| None)
        .expect_err("a negative lease")
        .in_config_file(config_file(&home));
    assert!(error.is_configuration());
    let (reason, hint) = error.reason_and_hint();
    assert!(
        reason.starts_with(
            "E2B setting lease_seconds (plugins.entries.e2b.settings in \
             /srv/profiles/work/config.yaml) is invalid: must be between"
        ),
        "{reason}"
    );
    assert!(reason.ends_with("not -5"), "{reason}");
    let hint = hint.expect("a hint");
    assert!(
        hint.contains(
            "plugins.entries.e2b.settings.lease_seconds in /srv/profiles/work/config.yaml"
        ),
        "{hint}"
    );
    assert!(hint.ends_with("then run `hermes e2b doctor`"), "{hint}");
}

#[test]
fn a_command_deadline_hermes_cannot_meet_is_refused_naming_terminal_timeout() {
    // contract: O5
    use crate::settings::{Value, command_timeout};
    assert_eq!(
        command_timeout(&Value::Int(180)).expect("valid"),
        std::time::Duration::from_secs(180)
    );
    assert_eq!(
        command_timeout(&Value::Str(" 2.5 ".to_owned())).expect("valid"),
        std::time::Duration::from_millis(2500)
    );
    for (value, shown) in [
        (Value::Int(-1), "is -1:"),
        (Value::Int(0), "is 0:"),
        (Value::Float(f64::NAN), "is NaN:"),
        (Value::Str("5m".to_owned()), "is \"5m\":"),
        (Value::Bool(true), "is a boolean:"),
    ] {
        let error = command_timeout(&value)
            .expect_err("refused")
            .in_config_file(PathBuf::from("/h/config.yaml"));
        assert!(error.is_configuration());
        let text = error.message();
        assert!(
            text.starts_with(&format!(
                "Hermes setting terminal.timeout in /h/config.yaml {shown}"
            )),
            "{text}"
        );
        assert!(text.contains("positive number of seconds"), "{text}");
        assert!(
            text.contains("Hint: fix terminal.timeout in /h/config.yaml"),
            "{text}"
        );
        // Named as written (not rewritten like other messages, contract O3): it is refused
        // at environment creation, where Hermes reads no command time-out into the text.
        assert!(text.contains("TERMINAL_TIMEOUT"), "{text}");
    }
}

#[test]
fn a_missing_key_names_the_profile_s_env_file() {
    // contract: O5
    let home = PathBuf::from("/srv/profiles/work");
    let error = Error::in_profile(agent_sandbox::Error::MissingApiKey, &home);
    assert!(error.is_configuration());
    let (reason, hint) = error.reason_and_hint();
    assert_eq!(
        reason,
        "no E2B API key for this profile: E2B_API_KEY is missing or empty in /srv/profiles/work/.env"
    );
    let hint = hint.expect("a hint");
    assert!(
        hint.starts_with("add the line E2B_API_KEY=e2b_... to /srv/profiles/work/.env"),
        "{hint}"
    );
    assert!(hint.ends_with("then run `hermes e2b doctor`"), "{hint}");
    // Any other backend error passes through unchanged.
    let other = Error::in_profile(
        agent_sandbox::Error::InvalidConfig {
            reason: "x".to_owned(),
        },
        &home,
    );
    assert!(!other.message().contains(".env"), "{}", other.message());
}

#[test]
fn backend_predicates_follow_the_backend_error() {
    let error = Error::from(agent_sandbox::Error::NotReady {
        sandbox_id: Some("sbx-1".to_owned()),
        reason: "dirty".to_owned(),
        retry_hint: "Retry later.".to_owned(),
    });
    assert!(error.is_not_ready());
    assert_eq!(error.retry_hint(), Some("Retry later."));
    assert!(!error.is_configuration());
    let missing_key = Error::from(agent_sandbox::Error::InvalidConfig {
        reason: "no key".to_owned(),
    });
    assert!(missing_key.is_configuration());
}

fn has_time_words(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("timeout") || lower.contains("timed out")
}

#[test]
fn the_time_words_are_rewritten_in_every_case() {
    // contract: O3
    assert_eq!(
        without_time_words("a Timeout b TIMEOUT c"),
        "a deadline b deadline c"
    );
    assert_eq!(without_time_words("set_timeout"), "set_deadline");
    assert_eq!(without_time_words("nothing here"), "nothing here");
    // Non-ASCII text around the word keeps its offsets.
    assert_eq!(without_time_words("é timeout é"), "é deadline é");
    let clean = without_time_words("operation timed out; Timeout must be > 0; set_timeout");
    assert!(!clean.to_ascii_lowercase().contains("timeout"), "{clean}");
    assert!(!clean.to_ascii_lowercase().contains("timed out"), "{clean}");
    assert_eq!(
        without_time_words("Timed-Out, time-outs, TIMEDOUT"),
        "ran out of time, deadlines, ran out of time"
    );
    // Words that merely start like it stay.
    assert_eq!(
        without_time_words("runtime output, timed outcome"),
        "runtime output, timed outcome"
    );
}

#[test]
fn no_backend_error_reaches_python_with_the_word() {
    // contract: O3
    let errors = [
        agent_sandbox::Error::InvalidConfig {
            reason: "lease timeout too short".to_owned(),
        },
        agent_sandbox::Error::NotReady {
            sandbox_id: Some("isb1".to_owned()),
            reason: "Timeout".to_owned(),
            retry_hint: "retry after the timeout".to_owned(),
        },
        agent_sandbox::Error::StateHook {
            operation: "sync",
            sandbox_id: "isb1".to_owned(),
            detail: "upload TIMEOUT".to_owned(),
        },
        agent_sandbox::Error::Io {
            operation: "read",
            path: PathBuf::from("/x/timeout"),
            source: std::io::Error::other("timeout"),
        },
        agent_sandbox::Error::FileRefused {
            operation: "fetch file",
            sandbox_id: Some("isb1".to_owned()),
            path: "/home/user/timeout.pdf".to_owned(),
            reason: agent_sandbox::FileRefusal::NotRegularFile,
        },
    ];
    for error in errors {
        let text = Error::from(error).message();
        assert!(!text.to_ascii_lowercase().contains("timeout"), "{text}");
    }
}

#[test]
fn a_failed_sync_message_never_says_timeout() {
    // contract: O3, S3
    // What agent-sandbox's per-command sync failure carries: the transport's record.
    let error = Error::from(agent_sandbox::Error::StateHook {
        operation: "sync",
        sandbox_id: "isb1".to_owned(),
        detail: "E2B upload files failed for sandbox isb1: upload plan refused: connection timeout"
            .to_owned(),
    });
    assert!(error.is_state_failure());
    let text = error.message();
    assert!(
        text.starts_with("E2B state sync failed for sandbox isb1"),
        "{text}"
    );
    assert!(!has_time_words(&text), "{text}");
}

/// One answer to every request: `status` with a JSON `{"code", "message"}` body.
fn answering_server(status: u16, message: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let body = format!("{{\"code\":{status},\"message\":{}}}", json_string(message));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|read| read > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

fn json_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The client's error, as the backend carries it, for attaching by id to a server that answers
/// `status` and `message` (the binding sees e2b-client only through agent-sandbox).
fn client_error(status: u16, message: &str) -> agent_sandbox::Error {
    backend_error(
        answering_server(status, message),
        agent_sandbox::SandboxMode::Attach {
            sandbox_id: agent_sandbox::SandboxId::parse("isbgone1".to_owned()).expect("id"),
        },
    )
}

/// The backend's error attaching in `mode` to the E2B at `url`.
fn backend_error(url: String, mode: agent_sandbox::SandboxMode) -> agent_sandbox::Error {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = agent_sandbox::Config::new(agent_sandbox::ApiKeySource::Key(
        agent_sandbox::ApiKey::new("e2b_binding_test_key_0123456789".to_owned()),
    ));
    config.endpoints = agent_sandbox::Endpoints::single(url);
    config.mode = mode;
    // A refusal for the account's limit fails at once instead of waiting for a slot.
    config.slot_wait = std::time::Duration::ZERO;
    let home = tempfile::tempdir().expect("home");
    let backend = agent_sandbox::Backend::new(
        config,
        agent_sandbox::Scope {
            profile_home: home.path().to_path_buf(),
            task_id: "default".to_owned(),
        },
        agent_sandbox::Services::new(runtime.handle().clone()),
        std::sync::Arc::new(agent_sandbox::NoStateHooks),
    )
    .expect("backend");
    backend.attach().expect_err("the server refuses")
}

fn ephemeral() -> agent_sandbox::SandboxMode {
    agent_sandbox::SandboxMode::Ephemeral {
        lifetime: std::time::Duration::from_secs(300),
    }
}

/// The message as Python sees it: one operation, one hint with `wanted`, never the key.
fn assert_one_hint(error: agent_sandbox::Error, operation: &str, wanted: &str) -> String {
    let text = Error::from(error).message();
    assert_eq!(text.matches(operation).count(), 1, "{text}");
    assert_eq!(text.matches("Hint: ").count(), 1, "{text}");
    let hint = text.split("Hint: ").nth(1).unwrap_or_default();
    assert!(hint.contains(wanted), "{text}");
    assert!(!text.contains("e2b_binding_test_key"), "{text}");
    assert!(!has_time_words(&text), "{text}");
    text
}

#[test]
fn each_failure_a_user_can_act_on_carries_one_hint() {
    // contract: O5
    for status in [401, 403] {
        assert_one_hint(
            client_error(status, "Invalid API key"),
            "connect",
            "check E2B_API_KEY in this profile's .env (or the environment Hermes runs in), then \
             run `hermes e2b doctor`",
        );
    }
    let text = assert_one_hint(
        backend_error(
            answering_server(
                429,
                "You have reached the maximum number of concurrent E2B sandboxes",
            ),
            ephemeral(),
        ),
        "E2B create failed",
        "paused sandboxes do not count; the plugin pauses this process's idle sandboxes",
    );
    assert!(text.contains("HTTP 429"), "{text}");
    assert_one_hint(
        backend_error(
            answering_server(404, "template 'nope' not found"),
            ephemeral(),
        ),
        "E2B create failed",
        "the `template` setting",
    );
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://127.0.0.1:{}",
        listener.local_addr().expect("addr").port()
    );
    drop(listener);
    let text = assert_one_hint(
        backend_error(url.clone(), ephemeral()),
        "E2B create failed",
        &format!("{url} could not be reached"),
    );
    assert_eq!(
        text.matches(&url).count(),
        2,
        "the error and its hint: {text}"
    );
}

#[test]
fn a_failure_without_a_next_step_has_no_hint() {
    // contract: O5
    let text = Error::from(client_error(400, "Invalid sandbox ID")).message();
    assert!(!text.contains("Hint"), "{text}");
}

#[test]
fn a_server_message_reaches_python_once_and_without_time_words() {
    // contract: O3 (formerly e2b-client's redaction rewrote these words in every error text)
    let hostile = "Timeout at h.example/files: request timed out";
    let error = Error::from(client_error(400, hostile));
    let text = error.message();
    assert!(
        text.starts_with("E2B connect failed for sandbox isbgone1: "),
        "{text}"
    );
    assert_eq!(text.matches("h.example/files").count(), 1, "{text}");
    // The binding's wrapper shows the backend's step; the chain does not repeat it.
    assert_eq!(text.matches("E2B connect failed").count(), 1, "{text}");
    assert!(!has_time_words(&text), "{text}");
}

#[test]
fn a_vanished_sandbox_message_never_says_timeout() {
    // contract: O3 (the Hermes half of agent-sandbox's
    // `infrastructure_errors_name_the_operation_and_the_sandbox`)
    let agent_sandbox::Error::E2b { source, .. } = client_error(404, "sandbox isbgone1 not found")
    else {
        unreachable!("client_error returns E2b")
    };
    assert!(source.is_not_found(), "{source:?}");
    let error = Error::from(agent_sandbox::Error::E2b {
        operation: "start command",
        sandbox_id: Some("isbgone1".to_owned()),
        source,
    });
    let text = error.message();
    assert!(text.starts_with("E2B "), "{text}");
    assert!(text.contains("isbgone1"), "{text}");
    assert!(!has_time_words(&text), "{text}");
}

#[test]
fn the_python_exception_carries_the_message() {
    // contract: O3
    let error = Error::Io {
        operation: "create state archive",
        path: PathBuf::from("/x/state.tar"),
        source: std::io::Error::other("connection timed out"),
    };
    let expected = error.message();
    assert_eq!(
        expected,
        "E2B create state archive failed for /x/state.tar: connection ran out of time"
    );
    let shown = Python::attach(|py| {
        let error = PyErr::from(error);
        assert!(error.is_instance_of::<E2BError>(py));
        error.value(py).to_string()
    });
    assert_eq!(shown, expected);
}

// contract: R13
#[test]
fn checkpoint_refusals_say_what_a_hermes_user_does() {
    let refused = |reason| {
        Error::from(agent_sandbox::Error::CheckpointRefused {
            operation: "checkpoint",
            sandbox_id: Some("sbx-1".to_owned()),
            reason,
        })
        .message()
    };
    let reader = refused(agent_sandbox::CheckpointRefusal::NotWriter);
    assert!(reader.starts_with("E2B checkpoint refused"), "{reader}");
    assert!(reader.contains("sbx-1"), "{reader}");
    assert!(
        reader.ends_with(
            ". Hint: a Hermes session holds the writer role for this scope; run this in that session \
             (/sandbox-checkpoint, /sandbox-checkpoints, /sandbox-rollback) or end it first"
        ),
        "{reader}"
    );
    let busy = refused(agent_sandbox::CheckpointRefusal::CommandsRunning {
        commands: vec!["pid 7: make test".to_owned()],
        waited: std::time::Duration::from_secs(30),
    });
    assert!(
        busy.ends_with("Hint: let pid 7: make test finish, or stop it (Ctrl-C in the session, or /stop), then retry"),
        "{busy}"
    );
    let missing = refused(agent_sandbox::CheckpointRefusal::NoCheckpoint {
        target: "checkpoint `x`".to_owned(),
    });
    assert!(missing.contains("`hermes e2b checkpoints`"), "{missing}");
}
