//! `examples/mcp_server/` end to end: the built binary, spoken to in MCP JSON-RPC over its
//! standard input and output, serving a sandbox of its embedded e2b-local (loopback only).

use crate::support;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

/// A guard against a hung child, not a timing assertion: a healthy exchange takes moments.
const PATIENCE: Duration = Duration::from_secs(120);

/// An MCP client over the example's stdio.
struct McpSession {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<JoinHandle<()>>,
    next_id: u64,
}

impl McpSession {
    /// The example on its embedded e2b-local.
    fn start() -> McpSession {
        McpSession::start_with_env(&[])
    }

    /// The example with these variables set on top of a cleared E2B environment.
    fn start_with_env(variables: &[(&str, &str)]) -> McpSession {
        let binary = support::example_binary("mcp_server");
        let mut command = Command::new(binary);
        for name in support::E2B_VARIABLES {
            command.env_remove(name);
        }
        command.envs(variables.iter().copied());
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        let collected = Arc::clone(&stderr);
        let stderr_reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr_pipe.read_to_string(&mut text);
            collected.lock().unwrap().push_str(&text);
        });
        let stdin = child.stdin.take();
        McpSession {
            child,
            stdin,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
            next_id: 1,
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{message}").expect("the server reads its stdin");
        stdin.flush().expect("flush");
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request without waiting for its answer; returns its id.
    fn start_request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// The next message the server sends.
    fn next_message(&mut self, waiting_for: &str) -> Value {
        let line = match self.lines.recv_timeout(PATIENCE) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("nothing from the server: {waiting_for}"),
            Err(RecvTimeoutError::Disconnected) => {
                panic!("the server closed stdout: {waiting_for}")
            }
        };
        serde_json::from_str(&line)
            .unwrap_or_else(|error| panic!("stdout carries only JSON-RPC ({error}): {line}"))
    }

    /// Sends a request and returns its result plus the notifications that came before it.
    fn request(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        let id = self.start_request(method, params);
        let mut notifications = Vec::new();
        loop {
            let message = self.next_message(method);
            if message["id"] == json!(id) {
                assert!(message.get("error").is_none(), "{method} failed: {message}");
                return (message["result"].clone(), notifications);
            }
            notifications.push(message);
        }
    }

    fn call_tool(&mut self, name: &str, arguments: Value) -> (Value, Vec<Value>) {
        self.request("tools/call", json!({"name": name, "arguments": arguments}))
    }

    /// Closes stdin (the client goes away) and returns how the server exited and its stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        drop(self.stdin.take());
        self.wait()
    }

    /// Sends SIGTERM with stdin still open and returns how the server exited and its stderr.
    fn terminate(self) -> (ExitStatus, String) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM failed: {status}");
        self.wait()
    }

    fn wait(mut self) -> (ExitStatus, String) {
        let (sender, exited) = mpsc::channel();
        let mut child = self.child;
        std::thread::spawn(move || {
            let _ = sender.send(child.wait());
        });
        let status = exited
            .recv_timeout(PATIENCE)
            .expect("the server exits")
            .expect("wait for the server");
        if let Some(reader) = self.stderr_reader.take() {
            reader.join().expect("stderr reader");
        }
        let stderr = self.stderr.lock().unwrap().clone();
        (status, stderr)
    }
}

fn initialize(session: &mut McpSession) -> Value {
    let (result, _) = session.request(
        "initialize",
        json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "mcp-example-test", "version": "0"}
        }),
    );
    session.notify("notifications/initialized", json!({}));
    result
}

fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .expect("content is a list")
        .iter()
        .filter_map(|block| block["text"].as_str())
        .collect()
}

#[test]
fn mcp_server_exposes_the_sandbox_as_tools_and_cleans_up_on_exit() {
    let mut session = McpSession::start();

    let info = initialize(&mut session);
    assert_eq!(info["serverInfo"]["name"], "hermes-e2b-sandbox");
    assert!(info["capabilities"]["tools"].is_object(), "{info}");

    let (tools, _) = session.request("tools/list", json!({}));
    let mut names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("a tool list")
        .iter()
        .map(|tool| tool["name"].as_str().expect("a name"))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "adopt",
            "checkpoint",
            "discard",
            "fork",
            "list_checkpoints",
            "read_file",
            "read_process",
            "rollback",
            "run_command",
            "run_python",
            "signal_process",
            "start_process",
            "write_file",
            "write_process"
        ]
    );

    // Output and exit code; each chunk also arrives as a progress notification.
    let (result, notifications) = session.request(
        "tools/call",
        json!({
            "name": "run_command",
            "arguments": {"command": "echo hi; exit 3"},
            "_meta": {"progressToken": "run-1"}
        }),
    );
    assert_eq!(result["structuredContent"]["exit_code"], 3, "{result}");
    assert_eq!(result["structuredContent"]["output"], "hi\n");
    assert_eq!(result["structuredContent"]["termination"], "exited");
    assert_eq!(result["isError"], false);
    assert!(text_of(&result).starts_with("hi\n[exit code 3"), "{result}");
    let streamed: String = notifications
        .iter()
        .filter(|message| message["method"] == "notifications/progress")
        .inspect(|message| assert_eq!(message["params"]["progressToken"], "run-1"))
        .map(|message| message["params"]["message"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        streamed, "hi\n",
        "progress notifications: {notifications:?}"
    );

    // A write and a read of the same file: a round trip through the sandbox.
    let content = "first line\nünïcode ✓\n";
    let (written, _) = session.call_tool(
        "write_file",
        json!({"path": "/home/user/notes/mcp.txt", "content": content}),
    );
    assert_eq!(written["isError"], false, "{written}");
    let (read, _) = session.call_tool("read_file", json!({"path": "/home/user/notes/mcp.txt"}));
    assert_eq!(read["isError"], false, "{read}");
    assert_eq!(text_of(&read), content);

    // The same persistent sandbox serves every call: the command sees the file.
    let (listed, _) = session.call_tool(
        "run_command",
        json!({"command": "wc -l < notes/mcp.txt; printf %s \"$E2B_SANDBOX_ID\""}),
    );
    let output = listed["structuredContent"]["output"]
        .as_str()
        .expect("output")
        .to_owned();
    let (lines, sandbox_id) = output.split_once('\n').expect("two parts");
    assert_eq!(lines.trim(), "2");
    assert!(!sandbox_id.is_empty(), "{output}");

    // A missing file is a tool error naming the path, not a protocol error.
    let (missing, _) = session.call_tool("read_file", json!({"path": "/home/user/nope.txt"}));
    assert_eq!(missing["isError"], true);
    assert!(
        text_of(&missing).contains("/home/user/nope.txt"),
        "{missing}"
    );

    let (status, stderr) = session.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("cleanup done for sandbox {sandbox_id}")),
        "the backend's cleanup ran for the sandbox; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("embedded e2b-local at http://127.0.0.1:"),
        "{stderr}"
    );
}

#[test]
fn mcp_server_bounds_a_large_output_and_keeps_its_end() {
    let mut session = McpSession::start();
    initialize(&mut session);

    // 200000 bytes of 'x' then a marker line: far more than the 64 KiB the result keeps.
    let (result, notifications) = session.call_tool(
        "run_command",
        json!({"command": "head -c 200000 /dev/zero | tr '\\0' x; echo; echo the-end"}),
    );
    let structured = &result["structuredContent"];
    assert_eq!(structured["exit_code"], 0, "{structured}");
    assert_eq!(structured["output_bytes"], 200_000 + 1 + 8);
    let omitted = structured["omitted_bytes"].as_u64().expect("a count");
    assert_eq!(omitted, 200_009 - 64 * 1024);
    let output = structured["output"].as_str().expect("output");
    assert!(output.starts_with("xxxx"));
    assert!(output.contains(&format!("[... {omitted} bytes omitted ...]")));
    assert!(output.ends_with("x\nthe-end\n"), "the end is kept");
    // No progress token, no progress notifications.
    assert!(
        notifications
            .iter()
            .all(|message| message["method"] != "notifications/progress"),
        "{notifications:?}"
    );

    let (status, stderr) = session.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
}

#[test]
fn mcp_server_cleans_up_on_sigterm() {
    let mut session = McpSession::start();
    initialize(&mut session);
    let (result, _) = session.call_tool(
        "run_command",
        json!({"command": "printf %s \"$E2B_SANDBOX_ID\""}),
    );
    let sandbox_id = result["structuredContent"]["output"]
        .as_str()
        .expect("output")
        .to_owned();
    assert!(!sandbox_id.is_empty(), "{result}");

    // stdin stays open: only the signal ends the session.
    let (status, stderr) = session.terminate();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert!(stderr.contains("signal received"), "{stderr}");
    assert!(
        stderr.contains(&format!("cleanup done for sandbox {sandbox_id}")),
        "the backend's cleanup ran for the sandbox; stderr:\n{stderr}"
    );
}

#[test]
fn mcp_server_kills_the_command_of_a_cancelled_call() {
    // `exec` makes the sleep the command's own pid, which is what a kill reaches (L6).
    cancel_and_wait_until_gone("echo started; exec sleep 3599", "sleep 3599");
}

/// Without `exec`: the `sleep` is a child of the command's shell, and the cancel must reach it
/// too (the command's process group, contract L6), not leave it orphaned.
#[test]
fn mcp_server_kills_what_a_cancelled_command_started() {
    cancel_and_wait_until_gone("echo started; sleep 3598; echo after", "sleep 3598");
}

/// Starts `command` (which prints `started` first) through `run_command`, cancels the call
/// once that output arrives, then waits inside the sandbox until no process runs `process`.
/// Were it never killed, the waiting command would hit its own deadline instead of exiting.
fn cancel_and_wait_until_gone(command: &str, process: &str) {
    let mut session = McpSession::start();
    initialize(&mut session);

    let id = session.start_request(
        "tools/call",
        json!({
            "name": "run_command",
            "arguments": {"command": command},
            "_meta": {"progressToken": "long"}
        }),
    );
    // Its first output proves it runs; then the client cancels the call.
    let first = session.next_message("the long command's first output");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    assert_eq!(first["params"]["message"], "started\n");
    session.notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "the user stopped it"}),
    );

    let (result, _) = session.call_tool(
        "run_command",
        json!({
            "command": format!("while ps -eo args | grep -q '^{process}$'; do sleep 0.1; done; echo gone"),
            "timeout_seconds": 60
        }),
    );
    assert_eq!(
        result["structuredContent"]["termination"], "exited",
        "{result}"
    );
    assert_eq!(result["structuredContent"]["output"], "gone\n");

    let (status, stderr) = session.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
}

/// The E2B path (`E2B_API_KEY` set) with the endpoints from the environment, pointed at an
/// e2b-local server this test runs: the persistent sandbox is found again after a restart.
#[test]
fn mcp_server_on_e2b_endpoints_finds_its_sandbox_again_after_a_restart() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let server = runtime
        .block_on(agent_sandbox_examples::e2b_local::Server::start_loopback())
        .expect("e2b-local starts");
    let url = server.url();
    let home = tempfile::tempdir().expect("a scope directory");
    let home_path = home.path().to_str().expect("a UTF-8 path").to_owned();
    let variables = [
        ("E2B_API_KEY", "e2b_test_key_not_real"),
        ("E2B_API_URL", url.as_str()),
        ("E2B_SANDBOX_URL", url.as_str()),
        ("HERMES_E2B_MCP_HOME", home_path.as_str()),
    ];

    let mut first = McpSession::start_with_env(&variables);
    initialize(&mut first);
    first.call_tool(
        "write_file",
        json!({"path": "/home/user/kept.txt", "content": "from the first run"}),
    );
    let (result, _) = first.call_tool(
        "run_command",
        json!({"command": "printf %s \"$E2B_SANDBOX_ID\""}),
    );
    let sandbox_id = result["structuredContent"]["output"]
        .as_str()
        .expect("output")
        .to_owned();
    let (status, stderr) = first.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("sandbox on E2B ({url})")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("e2b_test_key_not_real"),
        "the key is never printed"
    );

    let mut second = McpSession::start_with_env(&variables);
    initialize(&mut second);
    let (result, _) = second.call_tool(
        "run_command",
        json!({"command": "cat kept.txt; echo; printf %s \"$E2B_SANDBOX_ID\""}),
    );
    assert_eq!(
        result["structuredContent"]["output"],
        format!("from the first run\n{sandbox_id}")
    );
    let (status, stderr) = second.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");

    runtime
        .block_on(server.shutdown())
        .expect("e2b-local stops");
}

/// The sandbox id a command sees.
fn sandbox_id_of(session: &mut McpSession, branch: Option<u64>) -> String {
    let mut arguments = json!({"command": "printf %s \"$E2B_SANDBOX_ID\""});
    if let Some(branch) = branch {
        arguments["branch"] = json!(branch);
    }
    let (result, _) = session.call_tool("run_command", arguments);
    assert_eq!(result["isError"], false, "{result}");
    result["structuredContent"]["output"]
        .as_str()
        .expect("output")
        .to_owned()
}

fn read_text(session: &mut McpSession, arguments: Value) -> Result<String, String> {
    let (read, _) = session.call_tool("read_file", arguments);
    if read["isError"] == true {
        Err(text_of(&read))
    } else {
        Ok(text_of(&read))
    }
}

/// Checkpoint, break, list, roll back; fork two branches that diverge, adopt one; fork again
/// and discard. Every step over MCP JSON-RPC; what is left alive is read from e2b-local.
#[test]
fn mcp_server_checkpoints_rolls_back_forks_adopts_and_discards() {
    // contract: R4, R6 — a rollback restores the checkpoint's files in a new sandbox and
    // retires the old one; an adopted branch becomes the sandbox and the other branches go.
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let server = runtime
        .block_on(agent_sandbox_examples::e2b_local::Server::start_loopback())
        .expect("e2b-local starts");
    let url = server.url();
    let home = tempfile::tempdir().expect("a scope directory");
    let home_path = home.path().to_str().expect("a UTF-8 path").to_owned();
    let mut config = agent_sandbox_examples::e2b_client::Config::new(
        agent_sandbox_examples::e2b_client::ApiKey::new("e2b_test_key_not_real".to_owned()),
    );
    config.api_url = Some(url.clone());
    config.sandbox_url = Some(url.clone());
    let client = agent_sandbox_examples::e2b_client::Client::new(config).expect("a client");
    let is_gone = |id: &str| {
        let id = agent_sandbox_examples::e2b_client::SandboxId::parse(id.to_owned())
            .expect("a sandbox id");
        match runtime.block_on(client.get(&id)) {
            Ok(_) => false,
            Err(error) => error.is_not_found(),
        }
    };

    let mut session = McpSession::start_with_env(&[
        ("E2B_API_KEY", "e2b_test_key_not_real"),
        ("E2B_API_URL", url.as_str()),
        ("E2B_SANDBOX_URL", url.as_str()),
        ("HERMES_E2B_MCP_HOME", home_path.as_str()),
    ]);
    initialize(&mut session);

    // A checkpoint of a good state, then the agent breaks the workspace.
    session.call_tool(
        "write_file",
        json!({"path": "project/plan.txt", "content": "the good plan\n"}),
    );
    let first = sandbox_id_of(&mut session, None);
    let (taken, _) = session.call_tool("checkpoint", json!({"label": "good"}));
    assert_eq!(taken["isError"], false, "{taken}");
    let good = taken["structuredContent"].clone();
    assert_eq!(good["label"], "good", "{taken}");
    assert_eq!(good["reason"], "agent");
    assert_eq!(good["source_sandbox"], first.to_ascii_lowercase());
    let (broken, _) = session.call_tool(
        "run_command",
        json!({"command": "rm -rf project && echo broken"}),
    );
    assert_eq!(broken["structuredContent"]["output"], "broken\n");
    assert!(read_text(&mut session, json!({"path": "project/plan.txt"})).is_err());

    let (listed, _) = session.call_tool("list_checkpoints", json!({}));
    let checkpoints = listed["structuredContent"]["checkpoints"]
        .as_array()
        .expect("a list")
        .clone();
    assert_eq!(checkpoints.len(), 1, "{listed}");
    assert_eq!(checkpoints[0]["snapshot_id"], good["snapshot_id"]);
    assert!(text_of(&listed).contains("good"), "{listed}");

    // The rollback: a new sandbox from the checkpoint; the broken one is checkpointed, then
    // gone.
    let (rolled, _) = session.call_tool("rollback", json!({"checkpoint": "good"}));
    assert_eq!(rolled["isError"], false, "{rolled}");
    let rolled = rolled["structuredContent"].clone();
    assert_eq!(rolled["restored"]["snapshot_id"], good["snapshot_id"]);
    assert_eq!(rolled["retired_sandbox"], first);
    assert_eq!(rolled["undo"]["reason"], "rollback");
    let second = sandbox_id_of(&mut session, None);
    assert_eq!(rolled["sandbox_id"], second);
    assert_ne!(second, first);
    assert_eq!(
        read_text(&mut session, json!({"path": "project/plan.txt"})),
        Ok("the good plan\n".to_owned())
    );
    assert!(is_gone(&first), "the rolled-back sandbox {first} is killed");
    let (listed, _) = session.call_tool("list_checkpoints", json!({}));
    let newest = &listed["structuredContent"]["checkpoints"][0];
    assert_eq!(
        newest["snapshot_id"], rolled["undo"]["snapshot_id"],
        "{listed}"
    );

    // Best of two: each branch gets its own attempt.
    let (forked, _) = session.call_tool("fork", json!({"count": 2}));
    assert_eq!(forked["isError"], false, "{forked}");
    let branches = forked["structuredContent"]["branches"]
        .as_array()
        .expect("branches")
        .clone();
    assert_eq!(branches.len(), 2, "{forked}");
    let branch_ids: Vec<String> = branches
        .iter()
        .map(|b| b["sandbox_id"].as_str().expect("started").to_owned())
        .collect();
    for (index, attempt) in ["attempt A\n", "attempt B\n"].iter().enumerate() {
        let (written, _) = session.call_tool(
            "write_file",
            json!({"path": "project/attempt.txt", "content": attempt, "branch": index}),
        );
        assert_eq!(written["isError"], false, "{written}");
        assert_eq!(
            sandbox_id_of(&mut session, Some(index as u64)),
            branch_ids[index]
        );
    }
    // The branches are copies: the sandbox itself has neither attempt.
    assert!(read_text(&mut session, json!({"path": "project/attempt.txt"})).is_err());
    let (refused, _) = session.call_tool("rollback", json!({}));
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(text_of(&refused).contains("a fork is open"), "{refused}");

    let (adopted, _) = session.call_tool("adopt", json!({"branch": 1}));
    assert_eq!(adopted["isError"], false, "{adopted}");
    assert_eq!(adopted["structuredContent"]["sandbox_id"], branch_ids[1]);
    assert_eq!(adopted["structuredContent"]["retired_sandbox"], second);
    assert_eq!(sandbox_id_of(&mut session, None), branch_ids[1]);
    assert_eq!(
        read_text(&mut session, json!({"path": "project/attempt.txt"})),
        Ok("attempt B\n".to_owned())
    );
    assert_eq!(
        read_text(&mut session, json!({"path": "project/plan.txt"})),
        Ok("the good plan\n".to_owned())
    );
    assert!(is_gone(&branch_ids[0]), "the branch not adopted is killed");
    assert!(
        is_gone(&second),
        "the sandbox the branch replaced is killed"
    );
    let no_fork = read_text(
        &mut session,
        json!({"path": "project/attempt.txt", "branch": 0}),
    );
    assert!(
        no_fork.as_ref().is_err_and(|e| e.contains("no open fork")),
        "{no_fork:?}"
    );

    // A fork given up: discard kills its branches, the sandbox stays.
    let (forked, _) = session.call_tool("fork", json!({"count": 1}));
    let branch = forked["structuredContent"]["branches"][0]["sandbox_id"]
        .as_str()
        .expect("started")
        .to_owned();
    let (discarded, _) = session.call_tool("discard", json!({}));
    assert_eq!(discarded["isError"], false, "{discarded}");
    assert_eq!(discarded["structuredContent"]["killed"], json!([branch]));
    assert!(is_gone(&branch));
    assert_eq!(sandbox_id_of(&mut session, None), branch_ids[1]);

    let (status, stderr) = session.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    runtime
        .block_on(server.shutdown())
        .expect("e2b-local stops");
}

#[test]
fn mcp_server_keeps_python_state_and_drives_background_processes() {
    // contract: O8, O9
    let mut session = McpSession::start();
    initialize(&mut session);

    // Python cells share one kernel: state survives from call to call, until a reset.
    let (first, _) = session.call_tool("run_python", json!({"code": "x = 41\nprint('set')"}));
    assert_eq!(first["structuredContent"]["status"], "ok", "{first}");
    assert_eq!(first["structuredContent"]["fresh_kernel"], true, "{first}");
    let (second, _) = session.call_tool("run_python", json!({"code": "x += 1\nprint(x)"}));
    assert_eq!(text_of(&second), "42\n", "{second}");
    assert_eq!(
        second["structuredContent"]["execution_count"], 2,
        "{second}"
    );
    let (failed, _) = session.call_tool("run_python", json!({"code": "1 / 0"}));
    assert_eq!(failed["isError"], true, "{failed}");
    assert!(text_of(&failed).contains("ZeroDivisionError"), "{failed}");
    let (reset, _) = session.call_tool(
        "run_python",
        json!({"code": "print('x' in globals())", "reset": true}),
    );
    assert_eq!(text_of(&reset), "False\n", "{reset}");

    // A prompt answered on the process's stdin, its output read as it comes.
    let (started, _) = session.call_tool(
        "start_process",
        json!({"command": "echo 'name?'; read name; echo \"hello $name\"; sleep 300"}),
    );
    let id = started["structuredContent"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let (asked, _) = session.call_tool("read_process", json!({"id": id, "wait_seconds": 30}));
    assert_eq!(asked["structuredContent"]["output"], "name?\n", "{asked}");
    assert_eq!(asked["structuredContent"]["status"], "running", "{asked}");
    let (written, _) = session.call_tool("write_process", json!({"id": id, "data": "mcp\n"}));
    assert_eq!(written["isError"], false, "{written}");
    let (answered, _) = session.call_tool("read_process", json!({"id": id, "wait_seconds": 30}));
    assert_eq!(
        answered["structuredContent"]["output"], "hello mcp\n",
        "{answered}"
    );
    let (killed, _) = session.call_tool("signal_process", json!({"id": id, "signal": "kill"}));
    assert_eq!(killed["isError"], false, "{killed}");
    let (ended, _) = session.call_tool("read_process", json!({"id": id, "wait_seconds": 30}));
    assert_eq!(ended["structuredContent"]["status"], "killed", "{ended}");

    // A REPL on a terminal: typed lines are answered, Ctrl-C interrupts it.
    let (repl, _) = session.call_tool(
        "start_process",
        json!({"command": "python3 -i -q", "terminal": true}),
    );
    let repl = repl["structuredContent"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    session.call_tool(
        "write_process",
        json!({"id": repl, "data": "print(6 * 7)\n"}),
    );
    let mut seen = String::new();
    for _ in 0..60 {
        let (read, _) = session.call_tool("read_process", json!({"id": repl, "wait_seconds": 1}));
        seen.push_str(
            read["structuredContent"]["output"]
                .as_str()
                .unwrap_or_default(),
        );
        if seen.contains("42\r\n") {
            break;
        }
    }
    assert!(seen.contains("42\r\n"), "{seen:?}");
    session.call_tool(
        "write_process",
        json!({"id": repl, "data": "import time; time.sleep(300)\n"}),
    );
    session.call_tool("write_process", json!({"id": repl, "data": "\u{0003}"}));
    for _ in 0..60 {
        let (read, _) = session.call_tool("read_process", json!({"id": repl, "wait_seconds": 1}));
        seen.push_str(
            read["structuredContent"]["output"]
                .as_str()
                .unwrap_or_default(),
        );
        if seen.contains("KeyboardInterrupt") {
            break;
        }
    }
    assert!(seen.contains("KeyboardInterrupt"), "{seen:?}");
    session.call_tool("write_process", json!({"id": repl, "data": "\u{0004}"}));
    // A read returns as soon as there is output (the echoed end of line comes first).
    let mut status = json!("running");
    for _ in 0..30 {
        let (read, _) = session.call_tool("read_process", json!({"id": repl, "wait_seconds": 1}));
        status = read["structuredContent"]["status"].clone();
        if status != "running" {
            break;
        }
    }
    assert_eq!(status, "exited");

    let (status, stderr) = session.finish();
    assert!(status.success(), "{stderr}");
}
