//! Contract X4 at the Python boundary: credentials planted in the texts a backend error can
//! quote (sandbox stderr, hook messages, recovery reasons, lower-layer causes, caller-given
//! settings) and in `tracing` events never reach `Error::message`, an error's `Display`, or the
//! text the logging bridge hands to Python.

use std::io;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

use crate::error::Error;
use crate::logging::record_text;

fn secrets() -> impl Strategy<Value = [String; 4]> {
    (
        "[0-9a-f]{40}",
        "[A-Za-z0-9]{16,28}",
        "[a-z][a-z0-9]{9,14}",
        "[A-Za-z0-9]{12,20}",
    )
        .prop_map(|(key, token, user, pass)| {
            [
                key,
                format!("Tk{token}"),
                format!("u{user}"),
                format!("P{pass}"),
            ]
        })
}

fn planted([key, token, user, pass]: &[String; 4]) -> String {
    format!("key e2b_{key} auth Bearer {token} url https://{user}:{pass}@files.example.com/a")
}

/// Keeps the bridge's text of every event.
#[derive(Clone, Default)]
struct Bridge(Arc<Mutex<Vec<String>>>);

impl<S: Subscriber> Layer<S> for Bridge {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        self.0.lock().unwrap().push(record_text(event));
    }
}

fn errors(text: &str) -> Vec<Error> {
    let backend = |error: agent_sandbox::Error| Error::from(error);
    vec![
        backend(agent_sandbox::Error::SandboxCommand {
            operation: "delete files",
            sandbox_id: "isb".to_owned(),
            exit_code: 1,
            stderr: format!("rm: cannot remove '{text}': Is a directory"),
        }),
        backend(agent_sandbox::Error::StateHook {
            operation: "initial push",
            sandbox_id: "isb".to_owned(),
            detail: text.to_owned(),
        }),
        backend(agent_sandbox::Error::NotReady {
            sandbox_id: None,
            reason: text.to_owned(),
            retry_hint: "retry".to_owned(),
        }),
        backend(agent_sandbox::Error::InvalidConfig {
            reason: text.to_owned(),
        }),
        // A cause below the error: only the chain quotes it.
        backend(agent_sandbox::Error::Io {
            operation: "read marker",
            path: "/x".into(),
            source: io::Error::other(text.to_owned()),
        }),
        Error::Io {
            operation: "create state archive",
            path: "/x".into(),
            source: io::Error::other(text.to_owned()),
        },
        Error::InvalidSetting {
            key: "api_url".to_owned(),
            reason: text.to_owned(),
            file: None,
        },
        Error::InvalidArgument {
            operation: "run",
            reason: text.to_owned(),
        },
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn planted_secrets_reach_no_message_and_no_bridged_record(secrets in secrets()) {
        // contract: X4
        let text = planted(&secrets);
        for error in errors(&text) {
            let message = error.message();
            let display = error.to_string();
            for value in &secrets {
                prop_assert!(!message.contains(value.as_str()), "message leaks {value}: {message}");
                prop_assert!(!display.contains(value.as_str()), "Display leaks {value}: {display}");
            }
            prop_assert!(message.contains(agent_sandbox::REDACTED), "{message}");
        }

        let bridge = Bridge::default();
        let subscriber = tracing_subscriber::registry().with(bridge.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(sandbox_id = "isb", name = %text, "pull skipped {text}");
            tracing::error!(detail = ?text, "{}", text);
        });
        let records = bridge.0.lock().unwrap().clone();
        prop_assert_eq!(records.len(), 2);
        for record in &records {
            for value in &secrets {
                prop_assert!(!record.contains(value.as_str()), "record leaks {value}: {record}");
            }
        }
    }
}
