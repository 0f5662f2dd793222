//! `agent-sandbox-bench <scenario> '<params json>'`: one benchmark scenario of
//! `scripts/bench`, measured in a process of its own so that its peak RSS is its own.
//!
//! The orchestrator (`crates/bench/python/run.py`) talks to it over stdin/stdout, so that it
//! can read e2b-local's request counter around the measured part only:
//!
//! ```text
//! child:  ready                 (setup done: sandbox attached, files made)
//! parent: go
//! child:  result {json}         (the measured part, then its figures)
//! parent: done
//! child:  (tears down, exits 0)
//! ```
//!
//! The endpoint comes from `E2B_API_URL` (e2b-local serves both planes on it) and the key
//! from `E2B_API_KEY` (a throwaway key e2b-local accepts). Peak RSS is the kernel's VmHWM,
//! reset at `go` through `/proc/self/clear_refs`, never an allocator estimate.
//!
//! `agent-sandbox-bench write-docs <report.md> <page.md>` measures nothing: it writes a full
//! run's figures into the page's generated section (`scripts/bench --write-docs`; see `docs`).

mod docs;
mod memory;
mod scenarios;

use std::io::{BufRead, Write};
use std::process::ExitCode;

use serde_json::{Map, Value};

/// A failure, with the step it happened in; the orchestrator shows it as the scenario's error.
type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// The parent's side of the protocol: the scenario prints through it and waits on it.
#[derive(Debug)]
pub(crate) struct Protocol {
    lines: std::io::Lines<std::io::StdinLock<'static>>,
}

impl Protocol {
    fn new() -> Protocol {
        Protocol {
            lines: std::io::stdin().lock().lines(),
        }
    }

    fn send(&self, line: &str) -> Result<(), BenchError> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
        Ok(())
    }

    fn expect(&mut self, word: &str) -> Result<(), BenchError> {
        match self.lines.next() {
            Some(Ok(line)) if line.trim() == word => Ok(()),
            Some(Ok(line)) => {
                Err(format!("expected {word:?} from the orchestrator, got {line:?}").into())
            }
            Some(Err(error)) => Err(error.into()),
            None => Err(format!("stdin closed while waiting for {word:?}").into()),
        }
    }

    /// Setup is done: waits for `go`, then resets the peak-RSS mark.
    pub(crate) fn ready(&mut self) -> Result<memory::Mark, BenchError> {
        self.send("ready")?;
        self.expect("go")?;
        Ok(memory::Mark::now())
    }

    /// The measured part is done: prints its figures with the memory growth since `mark`, and
    /// waits for `done` before the scenario tears down.
    pub(crate) fn result(
        &mut self,
        mark: &memory::Mark,
        mut figures: Map<String, Value>,
    ) -> Result<(), BenchError> {
        mark.finish(&mut figures);
        self.send(&format!("result {}", Value::Object(figures)))?;
        self.expect("done")
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("write-docs") {
        let [_, _, report, page] = &args[..] else {
            eprintln!("usage: agent-sandbox-bench write-docs <report.md> <page.md>");
            return ExitCode::from(2);
        };
        return match docs::write_docs(report.as_ref(), page.as_ref()) {
            Ok(()) => {
                eprintln!("wrote the figures of {report} into {page}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("agent-sandbox-bench write-docs: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let (scenario, params) = match &args[..] {
        [_, scenario] => (scenario.as_str(), "{}"),
        [_, scenario, params] => (scenario.as_str(), params.as_str()),
        _ => {
            eprintln!(
                "usage: agent-sandbox-bench <scenario> ['<params json>'] | write-docs <report.md> <page.md>"
            );
            return ExitCode::from(2);
        }
    };
    let params: Value = match serde_json::from_str(params) {
        Ok(Value::Object(map)) => Value::Object(map),
        Ok(_) | Err(_) => {
            eprintln!("agent-sandbox-bench {scenario}: the parameters must be a JSON object");
            return ExitCode::from(2);
        }
    };
    let mut protocol = Protocol::new();
    match scenarios::run(scenario, &params, &mut protocol) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut line = format!("agent-sandbox-bench {scenario}: {error}");
            let mut cause = std::error::Error::source(&*error);
            while let Some(inner) = cause {
                line.push_str(": ");
                line.push_str(&inner.to_string());
                cause = inner.source();
            }
            eprintln!("{line}");
            ExitCode::FAILURE
        }
    }
}
