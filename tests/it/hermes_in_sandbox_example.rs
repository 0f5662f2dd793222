//! `examples/hermes_in_sandbox.rs` end to end against its embedded e2b-local (loopback only):
//! the built binary runs the whole flow with the stand-in Hermes, and its printed output says
//! what happened.

use crate::support;

use std::io::Read as _;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A guard against a hung child, not a timing assertion: the flow takes a few seconds.
const PATIENCE: Duration = Duration::from_secs(180);

/// A stand-in provider key: it must reach the sandbox and never be printed.
const PROVIDER_KEY: &str = "sk-or-v1-example-test-secret-5e1f";

/// Runs the built example with these variables on top of a cleared E2B environment; returns
/// its exit status, stdout and stderr.
fn run_example(variables: &[(&str, &str)]) -> (ExitStatus, String, String) {
    let binary = support::example_binary("hermes_in_sandbox");
    let mut command = Command::new(binary);
    for name in support::E2B_VARIABLES {
        command.env_remove(name);
    }
    let mut child = command
        .env_remove("OPENROUTER_API_KEY")
        .env_remove("HERMES_EXAMPLE_INTERNET")
        .env_remove("HERMES_MODEL")
        .envs(variables.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let mut stdout_pipe = child.stdout.take().expect("piped stdout");
    let mut stderr_pipe = child.stderr.take().expect("piped stderr");
    let (sender, finished) = mpsc::channel();
    // Each pipe has its own reader, so neither can fill up and stall the example.
    let stderr_reader = std::thread::spawn(move || {
        let mut stderr = String::new();
        let _ = stderr_pipe.read_to_string(&mut stderr);
        stderr
    });
    std::thread::spawn(move || {
        let mut stdout = String::new();
        let _ = stdout_pipe.read_to_string(&mut stdout);
        let stderr = stderr_reader.join().unwrap_or_default();
        let _ = sender.send((child.wait(), stdout, stderr));
    });
    let (status, stdout, stderr) = finished
        .recv_timeout(PATIENCE)
        .expect("the example finishes");
    (status.expect("wait for the example"), stdout, stderr)
}

#[test]
fn hermes_flow_runs_two_turns_of_one_session_in_a_deny_all_sandbox_and_kills_it() {
    let (status, stdout, stderr) = run_example(&[("OPENROUTER_API_KEY", PROVIDER_KEY)]);
    assert!(
        status.success(),
        "exit {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let line_with = |needle: &str| -> usize {
        lines
            .iter()
            .position(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no line contains {needle:?}:\n{stdout}"))
    };

    // It says plainly that this is the stand-in, not Hermes.
    line_with("embedded e2b-local at http://127.0.0.1:");
    line_with("STAND-IN `hermes`");
    line_with("No model is called.");

    // The hermes template, the key passed but not shown, deny-all egress as E2B reports it.
    let created = lines[line_with("created sandbox ")];
    assert!(created.ends_with("from template `hermes`"), "{created}");
    let sandbox_id = created
        .trim_start_matches("created sandbox ")
        .split(' ')
        .next()
        .expect("an id");
    line_with("env: OPENROUTER_API_KEY passed from the host (value not shown)");
    line_with("egress: deny-all (E2B reports allowInternetAccess=false)");
    assert!(
        !stdout.contains(PROVIDER_KEY) && !stderr.contains(PROVIDER_KEY),
        "the provider key is never printed"
    );

    // Turn one: the headless command, answered from the files written before it.
    let first = line_with("$ hermes chat -Q --yolo --provider openrouter");
    assert!(
        lines[first].contains("skill named incident-triage"),
        "{}",
        lines[first]
    );
    let turn_one = lines[first + 1];
    assert!(
        turn_one.starts_with("[stand-in hermes] session "),
        "{turn_one}"
    );
    assert!(
        turn_one.ends_with(", turn 1, provider key present"),
        "{turn_one}"
    );
    let session = turn_one
        .trim_start_matches("[stand-in hermes] session ")
        .split(',')
        .next()
        .expect("a session id");
    line_with("Newest incident: first.json (release checkout-42).");
    line_with("Created skill incident-triage from 3 runbook steps.");

    // Turn two continues the same session in the same sandbox, with the skill and new file.
    let second = line_with(" -c --skills incident-triage -q ");
    assert!(second > first);
    assert_eq!(
        lines[second + 1],
        format!("[stand-in hermes] session {session}, turn 2, provider key present")
    );
    line_with("Loaded skill incident-triage.");
    line_with("Newest incident: next.json (release checkout-43).");
    line_with("Continuing from turn 1: Study /home/user/runbook.md");

    // Both turns and the listing succeeded; the skill outlived turn one.
    let exits = lines
        .iter()
        .filter(|line| **line == "[exit code 0]")
        .count();
    assert_eq!(exits, 4, "mkdir, two turns, ls:\n{stdout}");
    let listing = line_with("$ ls ~/.hermes/skills");
    assert_eq!(lines[listing + 1], "incident-triage");

    // Killed at the end.
    assert_eq!(
        lines.last(),
        Some(&format!("killed sandbox {sandbox_id}").as_str())
    );
}

/// With `E2B_API_KEY` set the example takes E2B's path (endpoints from the environment, here
/// an e2b-local this test runs with the `hermes` template): no stand-in is installed, so the
/// `hermes` command is missing there, the first turn fails, the sandbox is still killed and
/// the example exits with an error.
#[test]
fn hermes_flow_on_e2b_endpoints_runs_the_real_command_and_kills_the_sandbox_when_it_fails() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let mut config = agent_sandbox_examples::e2b_local::ServerConfig::loopback();
    config.templates = vec!["base".to_owned(), "hermes".to_owned()];
    let server = runtime
        .block_on(agent_sandbox_examples::e2b_local::Server::start(config))
        .expect("e2b-local starts");
    let url = server.url();

    let (status, stdout, stderr) = run_example(&[
        ("E2B_API_KEY", "e2b_test_key_not_real"),
        ("E2B_API_URL", url.as_str()),
        ("E2B_SANDBOX_URL", url.as_str()),
    ]);
    assert!(
        !status.success(),
        "a failed turn fails the example\n{stdout}"
    );
    assert!(
        stdout.contains(&format!("target: E2B at {url}")),
        "{stdout}"
    );
    assert!(!stdout.contains("STAND-IN"), "{stdout}");
    assert!(stdout.contains("note: deny-all egress also keeps Hermes from its model provider"));
    assert!(stdout.contains("[exit code 127]"), "{stdout}");
    assert!(
        stderr.contains("hermes turn 1 failed with exit code 127"),
        "{stderr}"
    );
    let created = stdout
        .lines()
        .find_map(|line| line.strip_prefix("created sandbox "))
        .expect("a created line");
    let sandbox_id = created.split(' ').next().expect("an id");
    assert!(
        stdout.contains(&format!("killed sandbox {sandbox_id}")),
        "{stdout}"
    );
    assert!(!stdout.contains("e2b_test_key_not_real") && !stderr.contains("e2b_test_key_not_real"));

    runtime
        .block_on(server.shutdown())
        .expect("e2b-local stops");
}
