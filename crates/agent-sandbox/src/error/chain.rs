//! An error and every error below it, each once: the whole story for a person.

use std::fmt;

use super::Error;

/// Renders an error and every error below it, each once, separated by `": "`: the full
/// story for a person, where `Display` alone shows one step.
///
/// A cause whose text its parent already printed (the parent's message is that text or ends
/// with `": "` and that text, the habit of errors that print their source) is not repeated,
/// so chains that mix both habits still read once. The E2B client's error below a backend
/// step shows only what the step did not say: its reason, with the request's own operation
/// when that differs from the step's name, and its sandbox when the step had none (contract
/// O5: each operation once).
///
/// ```
/// use agent_sandbox::ErrorChain;
///
/// let cause = std::io::Error::other("disk full");
/// let error = agent_sandbox::Error::Io {
///     operation: "write marker",
///     path: "/tmp/x".into(),
///     source: cause,
/// };
/// assert_eq!(error.to_string(), "E2B write marker failed for /tmp/x");
/// assert_eq!(ErrorChain(&error).to_string(), "E2B write marker failed for /tmp/x: disk full");
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        let mut chain = shown.clone();
        let mut parent: &(dyn std::error::Error + 'static) = self.0;
        let mut next = self.0.source();
        while let Some(error) = next {
            let text = match (
                parent.downcast_ref::<Error>(),
                error.downcast_ref::<e2b_client::Error>(),
            ) {
                (Some(step), Some(client)) => below_step(step, client),
                _ => error.to_string(),
            };
            let printed = shown == text
                || shown
                    .strip_suffix(text.as_str())
                    .is_some_and(|head| head.ends_with(": "));
            if !printed {
                chain.push_str(": ");
                chain.push_str(&text);
            }
            shown = text;
            parent = error;
            next = error.source();
        }
        // Causes from lower crates (recovery's file names, hook errors) carry text the sandbox
        // or a hook chose; the whole story passes the redaction pass once, here (X4).
        f.write_str(&e2b_client::redact(&chain))
    }
}

/// The client's error as the backend step above it leaves it to say (see [`ErrorChain`]).
fn below_step(step: &Error, client: &e2b_client::Error) -> String {
    let (Error::E2b { operation, .. } | Error::ConcurrencyLimit { operation, .. }) = step else {
        return client.to_string();
    };
    let Some(request) = client.operation() else {
        return client.to_string();
    };
    let request = request.to_string();
    let mut head = String::new();
    // "connect" above "connect sandbox", "list sandboxes" above "list sandboxes": one name.
    if !request.starts_with(operation) {
        head.push_str(&request);
    }
    if let (None, Some(id)) = (step.sandbox_id(), client.sandbox_id()) {
        if !head.is_empty() {
            head.push(' ');
        }
        head.push_str(&format!("for sandbox {id}"));
    }
    if head.is_empty() {
        client.reason()
    } else {
        format!("{head}: {}", client.reason())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
