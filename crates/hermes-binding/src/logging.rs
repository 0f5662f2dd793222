//! `tracing` events of the Rust core, forwarded to Python `logging` under `hermes_e2b`,
//! each redacted on the way (contract X4).
//!
//! The layer takes the GIL only for the moment it hands one record to Python, on whichever
//! thread emitted the event, and never holds it otherwise. Every binding call that can emit
//! events releases the GIL first, so a backend thread logging while a Python thread waits
//! on it cannot deadlock.

use std::fmt::{self, Write as _};

use pyo3::prelude::*;
use pyo3::types::PyString;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// The Python logger every record goes to.
pub const LOGGER_NAME: &str = "hermes_e2b";

/// The crates whose events are forwarded.
const TARGETS: [&str; 8] = [
    "_native",
    "hermes_binding",
    "agent_sandbox",
    "e2b_client",
    "sandbox_identity",
    "writer_lease",
    "state_sync",
    "recovery",
];

/// Python `logging` level numbers.
pub fn python_level(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// Renders an event as one line: the message, then `key=value` for every other field.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={}", field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={:?}", field.name(), value);
        }
    }
}

/// Renders an event's text the way the bridge hands it to Python.
pub fn render(event: &Event<'_>) -> String {
    let mut line = Line::default();
    event.record(&mut line);
    line.message + &line.fields
}

/// The text handed to Python for an event: [`render`], then the redaction pass.
pub fn record_text(event: &Event<'_>) -> String {
    agent_sandbox::redact(&render(event))
}

/// The fields of a span, rendered once when it opens (` task=...`), appended to the lines
/// of the events inside it: which chat a line is about (a binding call's task).
struct SpanFields(String);

/// The layer that calls `logging.getLogger("hermes_e2b").log(level, text)`.
#[derive(Debug, Clone, Copy)]
pub struct PythonLogging;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for PythonLogging {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut line = Line::default();
        attrs.record(&mut line);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(line.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let level = python_level(event.metadata().level());
        let mut rendered = render(event);
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<SpanFields>() {
                    rendered.push_str(&fields.0);
                }
            }
        }
        // Every record, its fields included, passes the redaction pass before Python sees
        // it (X4): a field may carry text a sandbox or a hook chose.
        let text = agent_sandbox::redact(&rendered);
        // `try_attach` returns None while the interpreter shuts down: the record is dropped
        // rather than touching a finalising interpreter.
        let _ = Python::try_attach(|py| {
            let result = (|| -> PyResult<()> {
                let logger = py
                    .import("logging")?
                    .call_method1("getLogger", (LOGGER_NAME,))?;
                if logger.call_method1("isEnabledFor", (level,))?.is_truthy()? {
                    logger.call_method1("log", (level, "%s", PyString::new(py, &text)))?;
                }
                Ok(())
            })();
            if let Err(error) = result {
                // A broken handler must not take the backend down; Python reports it.
                error.write_unraisable(py, None);
            }
        });
    }
}

/// Installs the bridge as the process's global subscriber. Only the first call (per process)
/// takes effect; a host that installed its own subscriber first keeps it.
pub fn install() {
    let filter = TARGETS.iter().fold(Targets::new(), |targets, target| {
        targets.with_target(*target, Level::DEBUG)
    });
    let _ = tracing_subscriber::registry()
        .with(PythonLogging.with_filter(filter))
        .try_init();
}
