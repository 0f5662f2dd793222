"""Hermes' live tools on E2B's live processes (issue 42; contracts O8, O9, O10), through a
real Hermes as users run it: `hermes chat -q` and `hermes gateway run` against the scripted
model, their tools in e2b-local sandboxes. execute_code cells run in a live kernel (state
kept, one request per cell, tool calls on the kernel's stream); background processes stream
(stdin, a terminal with pty=true, Ctrl-C, kill); both survive a pause and a gateway restart."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from agent_harness import Gateway, NetGuard, agent_config, hermes_chat, write_agent_config
from conftest import assert_no_key
from scripted_model import Dynamic, Reply, ToolCall, scripted_model  # noqa: F401 - fixture
from test_environment import run


@pytest.fixture
def guard(tmp_path: Path) -> NetGuard:
    return NetGuard(tmp_path / "netguard")


def process_call(**arguments) -> ToolCall:
    """process_manage sits behind Hermes' tool search: the model reaches it through tool_call."""
    return ToolCall("tool_call", {"calls": [{"name": "process_manage", "arguments": arguments}]})


def unwrap(result):
    """A tool_call bridge result: the one call's own result."""
    if isinstance(result, dict) and isinstance(result.get("results"), list) and result["results"]:
        inner = result["results"][0]
        inner = inner.get("result", inner) if isinstance(inner, dict) else inner
        if isinstance(inner, str):
            try:
                return json.loads(inner)
            except ValueError:
                return inner
        return inner
    return result


def session_of(results, index=0):
    """The session id of the `index`th background start among a turn's results."""
    starts = [r for r in results if isinstance(r, dict) and r.get("session_id")]
    return starts[index]["session_id"]


def e2b_requests(server) -> dict:
    request = urllib.request.Request(f"{server.api_url}/_e2b_local/requests", headers={"X-API-Key": "e2b_test_listing"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_a_repl_answered_through_process_manage_and_ctrl_c_to_a_terminal_command(home, e2b_local, scripted_model, guard):  # noqa: F811
    # contract: O9
    tag = uuid.uuid4().hex
    marker = f"REPL-{tag[:12]}"
    scripted_model.register(marker, [
        ToolCall("terminal", {"command": "python3 -i -q", "background": True, "pty": True}),
        Dynamic(lambda r: process_call(action="submit", session_id=session_of(r), data="print(6 * 7)")),
        Dynamic(lambda r: process_call(action="wait", session_id=session_of(r), timeout=2)),
        Dynamic(lambda r: process_call(action="write", session_id=session_of(r),
                                       data="import time; time.sleep(300)\n")),
        Dynamic(lambda r: process_call(action="write", session_id=session_of(r), data="\x03")),
        Dynamic(lambda r: process_call(action="submit", session_id=session_of(r),
                                       data="import sys; print(sys.stdin.isatty(), sys.stdout.isatty())")),
        Dynamic(lambda r: process_call(action="close", session_id=session_of(r))),
        Dynamic(lambda r: process_call(action="wait", session_id=session_of(r), timeout=30)),
        Reply(f"done {marker}"),
    ])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag})))
    home.write_key()
    proc = hermes_chat(home, guard, f"Drive a REPL {marker}")
    assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    results = [unwrap(scripted_model.tool_result(marker, step)) for step in range(8)]
    print(json.dumps(results, indent=1)[:6000])
    assert results[1]["status"] == "ok", results[1]
    assert "42" in results[2]["output"], results[2]
    assert results[7]["status"] == "exited", results[7]
    output = results[7]["output"]
    assert "KeyboardInterrupt" in output, output
    assert "True True" in output, output
    assert_no_key(proc.stdout, proc.stderr)


def test_cells_keep_their_state_call_tools_on_their_stream_and_cost_one_request_each(home, e2b_local, scripted_model, guard):  # noqa: F811
    # contract: O8
    tag = uuid.uuid4().hex
    marker = f"CELLS-{tag[:12]}"
    counts: list[int] = []

    def counted(step):
        # Called when Hermes asks the model for the next step: every tool before it has run.
        def make(results):
            counts.append(e2b_requests(e2b_local)["total"])
            return step
        return Dynamic(make)

    scripted_model.register(marker, [
        counted(ToolCall("execute_code", {"code": "x = 41\nprint('set')"})),
        counted(ToolCall("execute_code", {"code": "x += 1\nprint(x)"})),
        counted(ToolCall("terminal", {"command": "echo from-a-tool"})),
        counted(ToolCall("execute_code", {"code": "from hermes_tools import terminal\nprint(terminal('echo from-a-tool')['output'])"})),
        counted(ToolCall("execute_code", {"code": (
            "from hermes_tools import terminal, write_file, read_file\n"
            "out = terminal('echo from-a-tool; echo $E2B_SANDBOX_ID')['output'].split()\n"
            "write_file('/home/user/cell.txt', 'written by a cell\\n')\n"
            "print(out[0], read_file('/home/user/cell.txt')['content'].strip(), x)")})),
        counted(ToolCall("execute_code", {"code": "import subprocess\nsubprocess.run(['echo', 'from a subprocess'])"})),
        counted(ToolCall("execute_code", {"code": "print('x' in globals())", "reset": True})),
        counted(ToolCall("execute_code", {"code": "import time\ntime.sleep(60)"})),
        counted(ToolCall("execute_code", {"code": "print('after', 'x' in globals())"})),
        counted(Reply(f"cells done {marker}")),
    ])
    config = agent_config(scripted_model, e2b_local.settings(metadata={"test": tag}),
                          extra={"code_execution": {"timeout": 8}})
    write_agent_config(home, config)
    home.write_key()
    proc = hermes_chat(home, guard, f"Run the cells {marker}", timeout=240)
    assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert f"cells done {marker}" in proc.stdout
    cells = [scripted_model.tool_result(marker, step) for step in (0, 1, 3, 4, 5, 6, 7, 8)]
    for cell in cells:
        assert cell["kernel"]["live"] is True, cell
    assert cells[0]["output"] == "set\n" and cells[0]["kernel"]["reused"] is False
    assert cells[1]["output"] == "42\n", cells[1]
    assert cells[1]["kernel"]["execution_count"] == 2, cells[1]
    # A tool call inside the cell ran through Hermes with the cell's authority, in the sandbox.
    assert cells[2]["output"] == "from-a-tool\n" and cells[2]["tool_calls_made"] == 1, cells[2]
    assert cells[3]["status"] == "success", cells[3]
    assert cells[3]["output"] == "from-a-tool 1|written by a cell 42\n", cells[3]
    assert cells[3]["tool_calls_made"] == 3, cells[3]
    # What a subprocess of the cell wrote is the cell's output.
    assert cells[4]["output"] == "from a subprocess\n", cells[4]
    assert cells[5]["output"] == "False\n" and cells[5]["kernel"]["state_reset"] is True, cells[5]
    # Past its time: the kernel is killed and the result says the state was lost.
    assert cells[6]["status"] == "timeout", cells[6]
    assert "state was lost" in cells[6]["error"], cells[6]
    assert cells[7]["output"] == "after False\n" and cells[7]["kernel"]["reused"] is False, cells[7]
    # Requests to E2B while each tool ran (e2b-local's own count, read as the model was asked
    # for the next step): a cell is one request, whatever it does; a tool it calls costs what
    # the same call costs the agent, and one request for its answer.
    spent = [after - before for before, after in zip(counts, counts[1:])]
    print(f"requests per tool call: {spent}")
    assert spent[1] == 1, f"a cell after the first costs one request: {spent}"
    assert spent[3] == spent[2] + 1 + 1, f"a cell calling terminal: the cell, the call, its answer: {spent}"
    assert spent[5] == 1, f"a cell whose subprocess prints: one request: {spent}"
    assert guard.attempts() == [], f"Hermes tried to leave loopback:\n{guard.stacks()}"
    assert_no_key(proc.stdout, proc.stderr, json.dumps(scripted_model.requests))


def test_a_background_completion_starts_the_gateway_chats_next_turn(home, e2b_local, scripted_model, guard):  # noqa: F811
    # contract: O9
    from agent_harness import FakeNtfy

    tag = uuid.uuid4().hex
    start, done = f"START-{tag[:12]}", f"JOBDONE-{tag[:12]}"
    scripted_model.register(start, [
        ToolCall("terminal", {"command": f"sleep 2; echo {done}", "background": True, "notify_on_complete": True}),
        Reply(f"started {tag[:8]}"),
    ])
    scripted_model.register(done, [Reply(f"the job is done {tag[:8]}")])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag})))
    home.write_key()
    ntfy = FakeNtfy()
    topic = f"chat-{tag[:8]}"
    gateway = Gateway(home, guard, extra_env=ntfy.env(topic))
    try:
        gateway.start()
        ntfy.send(topic, f"please run it {start}")
        ntfy.wait_for(f"started {tag[:8]}")
        started = scripted_model.tool_result(start, 0)
        assert started.get("notify_on_complete") is True, started
        # Nobody writes again: the completion itself starts the chat's next turn.
        ntfy.wait_for(f"the job is done {tag[:8]}", timeout=60)
        turn = scripted_model.conversation(done)[0]
        spawned = scripted_model.conversation(start)[1]["time"]
        print(f"the completion's turn began {turn['time'] - spawned - 2:.2f} s after the process's exit "
              f"(its 2 s sleep subtracted)")
    finally:
        gateway.close()
        ntfy.stop()
    assert guard.attempts() == [], f"Hermes tried to leave loopback:\n{guard.stacks()}"


def test_a_pause_in_the_middle_of_a_background_process_and_of_a_kernels_life_loses_nothing(home, e2b_local):
    # contract: O10, L17
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}, pause_after_idle_seconds=2),
                      terminal={"timeout": 60})
    home.write_key()
    result = run(home, """
        import time, urllib.request
        from tools.code_execution_tool import execute_code
        from tools.process_registry import process_registry
        def state():
            sandbox_id = next(iter(tt._active_environments.values()))._native.sandbox_id
            request = urllib.request.Request(f"%(api)s/sandboxes/{sandbox_id}", headers={"X-API-Key": "e2b_test_listing"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["state"]
        def until_paused():
            started = time.monotonic()
            while state() != "paused":
                assert time.monotonic() - started < 60, "still running after 60 s"
                time.sleep(0.1)
        r = {}
        r["cell"] = json.loads(execute_code("counter = 41", task_id="t1"))
        r["bg"] = T("for i in $(seq 1 40); do echo line-$i; sleep 0.25; done; echo done", background=True)
        session = process_registry.get(r["bg"]["session_id"])
        until_paused()
        r["seen_at_pause"] = session.output_buffer
        r["exited_at_pause"] = session.exited
        time.sleep(1)
        r["seen_while_paused"] = session.output_buffer
        # The session's next use resumes the sandbox; the process and the kernel were frozen.
        r["back"] = T("echo back")["output"]
        r["cell_after"] = json.loads(execute_code("counter += 1\\nprint(counter)", task_id="t1"))
        # A process alone is no use of the sandbox (L17): the session keeps it busy meanwhile.
        r["busy"] = T("sleep 12")["exit_code"]
        r["wait"] = process_registry.wait(session.id, timeout=60)
        r["output"] = session.output_buffer
        finish(r)
    """ % {"api": e2b_local.api_url})
    assert result["exited_at_pause"] is False, "the pause came in the middle of the process"
    assert result["seen_while_paused"] == result["seen_at_pause"], "nothing arrives while it is frozen"
    lines = result["output"].splitlines()
    assert lines == [f"line-{i}" for i in range(1, 41)] + ["done"], \
        f"every line once, in order, across the pause: {lines}"
    assert result["wait"]["status"] == "exited" and result["wait"]["exit_code"] == 0, result["wait"]
    cell = result["cell_after"]
    assert cell["output"] == "42\n", cell
    assert cell["kernel"]["reused"] is True and not cell["kernel"].get("state_lost"), cell


def test_a_crashed_gateway_finds_its_chats_background_server_again_with_its_output(home, e2b_local, scripted_model, guard):  # noqa: F811
    # contract: O10
    import signal

    tag = uuid.uuid4().hex
    first, second = f"SERVE-{tag[:12]}", f"AGAIN-{tag[:12]}"
    port = 8700 + int(tag[:4], 16) % 200
    visit = f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/"

    def server_of(results):
        listed = [r for r in results if isinstance(r, dict) and "processes" in r]
        return next(p["session_id"] for p in listed[-1]["processes"] if "http.server" in p["command"])

    scripted_model.register(first, [
        ToolCall("terminal", {"command": f"cd /tmp && python3 -u -m http.server {port}", "background": True}),
        ToolCall("terminal", {"command": f"for i in $(seq 50); do {visit}first-visit && break; sleep 0.2; done"}),
        Reply(f"serving {tag[:8]}"),
    ])
    scripted_model.register(second, [
        ToolCall("terminal", {"command": f"{visit}second-visit"}),
        process_call(action="list"),
        Dynamic(lambda r: process_call(action="wait", session_id=server_of(r), timeout=1)),
        Dynamic(lambda r: process_call(action="kill", session_id=server_of(r))),
        Reply(f"still serving {tag[:8]}"),
    ])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag})))
    home.write_key()
    chat = f"chat-{tag[:8]}"
    gateway = Gateway(home, guard)
    try:
        gateway.start()
        assert gateway.chat(f"start a server {first}", session_id=chat) == f"serving {tag[:8]}"
        assert scripted_model.tool_result(first, 1)["output"].endswith("404"), scripted_model.tool_result(first, 1)
        # A crash: no shutdown runs (a clean one kills every background process, as Hermes does
        # with its local ones).
        assert gateway.kill() == -signal.SIGKILL
        gateway.start()
        assert gateway.chat(f"is it still there {second}", session_id=chat) == f"still serving {tag[:8]}"
        assert scripted_model.tool_result(second, 0)["output"] == "404", "the server answers"
        listed = unwrap(scripted_model.tool_result(second, 1))
        server = next(p for p in listed["processes"] if "http.server" in p["command"])
        assert server["status"] == "running", listed
        waited = unwrap(scripted_model.tool_result(second, 2))
        # Its whole output: what it logged before the crash and after the restart.
        assert "first-visit" in waited["output"] and "second-visit" in waited["output"], waited
        killed = unwrap(scripted_model.tool_result(second, 3))
        assert killed["status"] == "killed", killed
        restarted = [line for line in gateway.log_lines() if "recovered background process" in line]
        assert restarted, gateway.tail()
    finally:
        gateway.close()
    assert guard.attempts() == [], f"Hermes tried to leave loopback:\n{guard.stacks()}"


def test_live_tools_false_leaves_hermes_own_polling_paths_and_the_doctor_says_which_is_in_force(home, e2b_local):
    # contract: O8, O9
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), terminal={"timeout": 60})
    home.write_key()
    rows = home.hermes("e2b", "doctor").stdout
    assert "E2B execute_code: a live kernel in the sandbox" in rows.replace("ok    ", ""), rows
    assert "E2B background processes: live" in rows.replace("ok    ", ""), rows
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}, live_tools=False), terminal={"timeout": 60})
    rows = home.hermes("e2b", "doctor").stdout
    assert "Hermes' own remote kernel (live_tools: false)" in rows, rows
    assert "Hermes' own poller (live_tools: false)" in rows, rows
    result = run(home, """
        from tools.code_execution_tool import execute_code
        from tools.process_registry import process_registry
        r = {"cell": json.loads(execute_code("print(6 * 7)", task_id="t1"))}
        r["bg"] = T("read line", background=True)
        r["write"] = process_registry.write_stdin(r["bg"]["session_id"], "x\\n")
        process_registry.kill_process(r["bg"]["session_id"])
        finish(r)
    """)
    assert result["cell"]["output"] == "42\n" and "live" not in result["cell"]["kernel"], result["cell"]
    assert "stdin not available" in result["write"]["error"], result["write"]


def test_the_hermes_internals_the_live_tools_wrap_are_the_installed_hermes_own(home):
    """What the plugin wraps is small and pinned here against the Hermes installed (upstream's
    main has the same names and parameters: docs/upstream-seam.md): the entry points keep
    their names and parameters, every parameter Hermes' spawn takes is one the live spawn
    knows (an unknown one sends every background process to Hermes' own poller), and the
    python3 probe the environment answers is the one Hermes sends."""
    home.write_config()
    result = home.driver("""
        import inspect, json
        from hermes_cli.plugins import discover_plugins
        discover_plugins()
        import tools.code_kernel_remote as remote
        import tools.code_execution_tool as code
        import tools.terminal_tool_background as background
        from tools.process_registry import process_registry
        from hermes_e2b import environment, kernels, processes
        r = {
            # The wrappers carry Hermes' own function as __wrapped__.
            "kernel_params": sorted(inspect.signature(inspect.unwrap(remote.execute_in_remote_kernel)).parameters),
            "registry": [name for name in ("_REGISTRY", "_REMOTE_KERNELS", "_kernel_key", "_reap_unlocked", "_evict_over_cap_unlocked") if hasattr(remote, name)],
            "probe_in_hermes": environment.PYTHON3_PROBE in inspect.getsource(code._execute_remote),
            "spawn_params": sorted(inspect.signature(inspect.unwrap(background._spawn)).parameters),
            "wrapped": [inspect.unwrap(f) is not f for f in (remote.execute_in_remote_kernel, background._spawn)],
            "registry_methods": [n for n in ("_new_session", "_track_started", "_finish_exited", "_ingest_output", "write_stdin", "close_stdin", "_signal_kill", "recover_from_checkpoint") if callable(getattr(process_registry, n, None))],
            "kernels": kernels.unsupported(), "processes": processes.unsupported(),
            "spawn_known": sorted(processes._SPAWN_PARAMETERS),
        }
        print("RESULT:" + json.dumps(r))
    """)
    assert result["probe_in_hermes"], "Hermes' remote execute_code sends the probe the environment answers"
    assert {"code", "env", "env_type", "task_env_id", "sandbox_tools", "timeout", "max_tool_calls", "reset",
            "idle_exit"} <= set(result["kernel_params"]), result
    assert len(result["registry"]) == 5, result
    assert {"process_registry", "env", "env_type", "command", "cwd", "effective_task_id", "task_id", "session_key",
            "effective_pty"} <= set(result["spawn_params"]), result
    assert set(result["spawn_params"]) - {"process_registry", "env", "env_type"} <= set(result["spawn_known"]), result
    assert len(result["registry_methods"]) == 8, result
    assert result["kernels"] is None and result["processes"] is None, result
    assert result["wrapped"] == [True, True], result
