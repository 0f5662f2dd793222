//! The standard-input driver of the multi-process test binaries (`sandbox-session` here,
//! `campaign-host` in the campaign crate): one command a line, one answer line each. Public
//! only so the campaign's host binary can share it; hidden from the docs, no API promise.
//!
//! Commands: `attach`, `run <shell command>`, `pause <ms>`, `cleanup`, `finalize`, `quit`,
//! and the checkpoint steps: `checkpoint [label]`, `rollback [label or snapshot id]` (the
//! latest checkpoint without one), `fork-adopt <count> <branch>` (fork, then adopt that
//! branch; the fork is discarded when that branch did not start or the adoption fails) and
//! `prune <keep>`.
//! Answers: `attached <sandbox id> <role>`, `exit <code> <output>` (see [`RunOutput`]),
//! `paused`, `cleanup <pull outcome>`, `finalized`, `checkpoint <snapshot id>`,
//! `rolledback <sandbox id> <retired sandbox id>`, `adopted <sandbox id> <retired sandbox id>`,
//! `pruned <count>`, or `error <message>`. `quit` (or the end of input) ends the loop without
//! an answer.

use std::io::{self, BufRead, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::{
    Backend, CheckpointReason, CheckpointRequest, CheckpointTarget, DEFAULT_CHECKPOINT_WAIT,
    DiscardSink, Error, ErrorChain, OutputSink, OutputStream, RunOptions,
};

/// What `run` answers after the exit code.
#[derive(Debug, Clone, Copy)]
pub enum RunOutput {
    /// The number of output bytes forwarded (the output itself is discarded).
    Count,
    /// Up to this many bytes of stdout and stderr together, `\` and newlines escaped.
    Capture(usize),
}

/// How the commands are carried out.
#[derive(Debug, Clone, Copy)]
pub struct LineDriver {
    /// The deadline of every `run`.
    pub run_timeout: Duration,
    /// What `run` answers.
    pub output: RunOutput,
}

impl LineDriver {
    /// Answers each line of `input` on standard output until `quit` or the end of input.
    pub fn serve(&self, backend: &Backend, input: impl BufRead) -> io::Result<()> {
        for line in input.lines() {
            let line = line?;
            let Some(answer) = self.answer(backend, &line) else {
                break;
            };
            emit(&answer.replace('\n', " "))?;
        }
        Ok(())
    }

    /// The answer to one command line; `None` for `quit`.
    fn answer(&self, backend: &Backend, line: &str) -> Option<String> {
        let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
        Some(match verb {
            "attach" => match backend.attach() {
                Ok(info) => format!("attached {} {:?}", info.sandbox_id, info.role),
                Err(error) => format!("error {}", ErrorChain(&error)),
            },
            "run" => self.run(backend, rest),
            // Spaces a host's commands, so another host's grant can lapse in between.
            "pause" => match rest.parse() {
                Ok(ms) => {
                    std::thread::sleep(Duration::from_millis(ms));
                    "paused".to_owned()
                }
                Err(error) => format!("error bad pause {rest:?}: {error}"),
            },
            "cleanup" => format!("cleanup {:?}", backend.cleanup().pull),
            "finalize" => {
                backend.finalize();
                "finalized".to_owned()
            }
            "checkpoint" => {
                let request = CheckpointRequest {
                    label: (!rest.is_empty()).then(|| rest.to_owned()),
                    reason: CheckpointReason::Manual,
                    wait: DEFAULT_CHECKPOINT_WAIT,
                };
                match backend.checkpoint(request) {
                    Ok(checkpoint) => format!("checkpoint {}", checkpoint.snapshot_id),
                    Err(error) => format!("error {}", ErrorChain(&error)),
                }
            }
            "rollback" => {
                let target = if rest.is_empty() {
                    CheckpointTarget::Latest
                } else {
                    CheckpointTarget::Named(rest.to_owned())
                };
                match backend.rollback(target, DEFAULT_CHECKPOINT_WAIT) {
                    Ok(report) => {
                        format!(
                            "rolledback {} {}",
                            report.sandbox_id, report.retired_sandbox
                        )
                    }
                    Err(error) => format!("error {}", ErrorChain(&error)),
                }
            }
            "fork-adopt" => match fork_adopt(backend, rest) {
                Ok(answer) => answer,
                Err(error) => format!("error {}", ErrorChain(&error)),
            },
            "prune" => match rest.parse() {
                Ok(keep) => match backend.prune_checkpoints(keep) {
                    Ok(deleted) => format!("pruned {}", deleted.len()),
                    Err(error) => format!("error {}", ErrorChain(&error)),
                },
                Err(error) => format!("error bad prune {rest:?}: {error}"),
            },
            "quit" => return None,
            other => format!("error unknown command {other:?}"),
        })
    }

    fn run(&self, backend: &Backend, command: &str) -> String {
        let options = RunOptions::new(self.run_timeout);
        let kept = Arc::new(Mutex::new(Vec::new()));
        let sink: Box<dyn OutputSink> = match self.output {
            RunOutput::Count => Box::new(DiscardSink),
            RunOutput::Capture(cap) => Box::new(Capture {
                cap,
                kept: Arc::clone(&kept),
            }),
        };
        let exit = match backend.run(command, options, sink) {
            Ok(running) => match running.wait() {
                Ok(exit) => exit,
                Err(error) => return format!("error {}", ErrorChain(&error)),
            },
            Err(error) => return format!("error {}", ErrorChain(&error)),
        };
        match self.output {
            RunOutput::Count => format!("exit {} {}", exit.exit_code, exit.forwarded_bytes),
            RunOutput::Capture(_) => {
                let kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
                format!("exit {} {}", exit.exit_code, escape(&kept))
            }
        }
    }
}

/// `fork-adopt <count> <branch>`: forks, then adopts that branch; discards the fork when the
/// branch did not start or the adoption failed.
fn fork_adopt(backend: &Backend, args: &str) -> Result<String, Error> {
    let numbers: Vec<usize> = args
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    let [count, index] = numbers[..] else {
        return Err(Error::InvalidConfig {
            reason: format!("fork-adopt takes <count> <branch>, not {args:?}"),
        });
    };
    let fork = backend.fork(count as u32, DEFAULT_CHECKPOINT_WAIT)?;
    let adopted = match fork.started().find(|branch| branch.index == index) {
        Some(chosen) => backend.adopt(&fork, chosen, DEFAULT_CHECKPOINT_WAIT),
        None => Err(Error::InvalidConfig {
            reason: format!("branch {index} of the fork did not start"),
        }),
    };
    match adopted {
        Ok(report) => Ok(format!(
            "adopted {} {}",
            report.sandbox_id, report.retired_sandbox
        )),
        Err(error) => {
            let _ = backend.discard(&fork);
            Err(error)
        }
    }
}

/// Writes `line` to standard output and flushes it, under one lock: state hooks write event
/// lines (`phase push`, `pushing`) from other threads between answers.
pub fn emit(line: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// Keeps the first `cap` bytes of stdout and stderr together.
struct Capture {
    cap: usize,
    kept: Arc<Mutex<Vec<u8>>>,
}

impl OutputSink for Capture {
    fn chunk(&mut self, _stream: OutputStream, bytes: &[u8]) -> io::Result<()> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let room = self.cap.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        Ok(())
    }
}

fn escape(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
}
