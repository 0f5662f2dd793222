//! Best-of-N for agent frameworks: fork the agent's sandbox, try a different fix in each
//! branch at once, keep the branch whose tests pass.
//!
//! The workspace holds `calc.sh`, which should print the sum of its arguments but has a
//! bug, and `test.sh`, which fails. The example
//!
//! 1. forks the scope's sandbox into three branches (one checkpoint, three sandboxes made
//!    from it; each branch is a whole machine with the workspace as it was),
//! 2. applies a different candidate fix in each branch and runs the tests there, all three
//!    at the same time,
//! 3. adopts the first branch whose tests pass: it becomes the scope's sandbox (the one any
//!    later session of the scope attaches to), the sandbox it replaces is checkpointed (the
//!    undo point) and killed, and so are the branches not adopted; when no branch passes,
//!    it discards them all and the sandbox stays as it was.
//!
//! ```text
//! cargo run --example best_of_n
//! ```
//!
//! It runs on e2b-local started in-process; the same `Backend` calls work against E2B with
//! a real API key. `tests/it/best_of_n_example.rs` runs it and checks the outcome from the
//! outside.

#![allow(clippy::print_stdout)]

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_examples::agent_sandbox::{
    ApiKeySource, Backend, Config, DEFAULT_CHECKPOINT_WAIT, Endpoints, ErrorChain, FnSink,
    NoStateHooks, RunOptions, SandboxMode, Scope, Services,
};
use agent_sandbox_examples::e2b_client::ApiKey;
use agent_sandbox_examples::e2b_local::Server;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The local server accepts any non-empty key.
const LOCAL_KEY: &str = "best-of-n-local-key";

/// Where the workspace lives in the sandbox.
const PROJECT: &str = "/home/user/project";

/// The buggy program: it subtracts instead of adding.
const CALC: &str = "#!/bin/bash\n\
# Prints the sum of its arguments.\n\
total=0\n\
for n in \"$@\"; do total=$((total - n)); done\n\
echo \"$total\"\n";

/// The tests the fix must pass.
const TESTS: &str = "#!/bin/bash\n\
check() { got=$(bash calc.sh \"${@:2}\"); [ \"$got\" = \"$1\" ] || { echo \"FAIL: calc.sh ${*:2} printed $got, want $1\"; exit 1; }; }\n\
check 9 2 3 4\n\
check 0\n\
check 5 5\n\
echo PASS\n";

/// The candidate fixes, one per branch: a description and a `sed` script for `calc.sh`.
pub(crate) const ATTEMPTS: [(&str, &str); 3] = [
    ("multiply", "s/total - n/total * n/"),
    ("add", "s/total - n/total + n/"),
    ("count the arguments", "s/total - n/total + 1/"),
];

/// What happened, for the caller (and the test) to check.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The scope's sandbox before the fork.
    pub(crate) parent: String,
    /// Each branch's sandbox, in attempt order.
    pub(crate) branches: Vec<String>,
    /// The attempt adopted, if any passed.
    pub(crate) adopted: Option<usize>,
    /// The scope's sandbox afterwards.
    pub(crate) sandbox: String,
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let server = runtime.block_on(Server::start_loopback())?;
    let home = tempfile::tempdir()?;
    let outcome = run(&runtime, &server.url(), home.path(), &mut std::io::stdout());
    runtime.block_on(server.shutdown())?;
    let outcome = outcome?;
    println!(
        "best of {}: adopted {:?}; the scope's sandbox is {} (was {})",
        outcome.branches.len(),
        outcome.adopted,
        outcome.sandbox,
        outcome.parent
    );
    Ok(())
}

/// A persistent Backend of the scope at `home`, on the server at `url`.
pub(crate) fn backend(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    home: &Path,
) -> Result<Backend> {
    let mut config = Config::new(ApiKeySource::Key(ApiKey::new(LOCAL_KEY.to_owned())));
    config.endpoints = Endpoints::single(url.to_owned());
    config.mode = SandboxMode::Persistent;
    let scope = Scope {
        profile_home: home.to_path_buf(),
        task_id: "best-of-n".to_owned(),
    };
    let services = Services::new(runtime.handle().clone());
    Ok(Backend::new(
        config,
        scope,
        services,
        Arc::new(NoStateHooks),
    )?)
}

/// Runs a shell command to its end; its exit code and output.
pub(crate) fn sh(backend: &Backend, command: &str) -> Result<(i32, String)> {
    let output = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let output = Arc::clone(&output);
        FnSink(move |_stream, bytes: &[u8]| {
            output
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(())
        })
    };
    let exit = backend
        .run(
            command,
            RunOptions::new(Duration::from_secs(60)),
            Box::new(sink),
        )?
        .wait()?;
    let text = String::from_utf8_lossy(&output.lock().unwrap_or_else(PoisonError::into_inner))
        .into_owned();
    Ok((exit.exit_code, text))
}

/// Forks, tries every attempt, adopts a passing branch or discards them all.
pub(crate) fn run(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    home: &Path,
    out: &mut dyn Write,
) -> Result<Outcome> {
    let backend = backend(runtime, url, home)?;
    backend.write_file(&format!("{PROJECT}/calc.sh"), CALC.as_bytes().to_vec())?;
    backend.write_file(&format!("{PROJECT}/test.sh"), TESTS.as_bytes().to_vec())?;
    let (code, output) = sh(&backend, &format!("cd {PROJECT} && bash test.sh"))?;
    let parent = backend.info().ok_or("not attached")?.sandbox_id;
    writeln!(
        out,
        "sandbox {parent}: tests exit {code}: {}",
        output.trim()
    )?;

    let fork = backend.fork(ATTEMPTS.len() as u32, DEFAULT_CHECKPOINT_WAIT)?;
    writeln!(
        out,
        "forked {} into {} branches from checkpoint {}",
        fork.parent,
        fork.branches.len(),
        fork.checkpoint.snapshot_id
    )?;
    let mut branches = Vec::new();
    for (index, branch) in fork.branches.iter().enumerate() {
        match branch {
            Ok(branch) => branches.push(branch.sandbox_id.as_str().to_owned()),
            Err(error) => {
                writeln!(out, "branch {index} did not start: {}", ErrorChain(error))?;
                branches.push(String::new());
            }
        }
    }

    // Every attempt at once, each in its own branch.
    let results: Vec<(usize, Result<(i32, String)>)> = std::thread::scope(|threads| {
        let running: Vec<_> = fork
            .started()
            .map(|branch| {
                let (_, fix) = ATTEMPTS[branch.index];
                let backend = &backend;
                let index = branch.index;
                threads.spawn(move || {
                    let attempt = || -> Result<(i32, String)> {
                        let inside = backend.branch(branch)?;
                        let command =
                            format!("cd {PROJECT} && sed -i '{fix}' calc.sh && bash test.sh");
                        let result = sh(&inside, &command);
                        inside.cleanup();
                        result
                    };
                    (index, attempt())
                })
            })
            .collect();
        running
            .into_iter()
            .map(|thread| thread.join().expect("an attempt thread"))
            .collect()
    });
    let mut passing = None;
    for (index, result) in &results {
        let (name, _) = ATTEMPTS[*index];
        match result {
            Ok((code, output)) => {
                writeln!(
                    out,
                    "branch {index} ({name}) in {}: tests exit {code}: {}",
                    branches[*index],
                    output.trim()
                )?;
                if *code == 0 && passing.is_none() {
                    passing = Some(*index);
                }
            }
            Err(error) => writeln!(out, "branch {index} ({name}): attempt failed: {error}")?,
        }
    }

    let adopted = match passing {
        Some(index) => {
            let chosen = fork
                .started()
                .find(|branch| branch.index == index)
                .ok_or("the passing branch started")?;
            let report = backend.adopt(&fork, chosen, DEFAULT_CHECKPOINT_WAIT)?;
            writeln!(
                out,
                "adopted branch {index} ({}): sandbox {} is the scope's now; {} retired (undo: checkpoint {})",
                ATTEMPTS[index].0,
                report.sandbox_id,
                report.retired_sandbox,
                report.undo.snapshot_id
            )?;
            let others: Vec<&str> = branches
                .iter()
                .enumerate()
                .filter(|(other, id)| *other != index && !id.is_empty())
                .map(|(_, id)| id.as_str())
                .collect();
            writeln!(out, "discarded with the adoption: {}", others.join(", "))?;
            Some(index)
        }
        None => {
            let discarded = backend.discard(&fork)?;
            writeln!(
                out,
                "no attempt passed: discarded {}; the sandbox stays as it was",
                discarded.killed.join(", ")
            )?;
            None
        }
    };
    let (code, output) = sh(&backend, &format!("cd {PROJECT} && bash test.sh"))?;
    let sandbox = backend.info().ok_or("not attached")?.sandbox_id;
    writeln!(
        out,
        "sandbox {sandbox}: tests exit {code}: {}",
        output.trim()
    )?;
    backend.cleanup();
    Ok(Outcome {
        parent,
        branches,
        adopted,
        sandbox,
    })
}
