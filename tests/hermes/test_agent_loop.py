"""A real Hermes running its own agent loop against a scripted OpenAI-compatible model
(scripted_model.py), its tools executed by the e2b backend in e2b-local sandboxes: once as
`hermes chat -q`, once as a real `hermes gateway run` serving the api_server platform
(agent_harness.py). No LLM, no network beyond loopback."""

from __future__ import annotations

import json
import signal
import socket
import uuid
from pathlib import Path

import pytest

from agent_harness import Gateway, NetGuard, agent_config, hermes_chat, write_agent_config
from conftest import assert_no_key
from scripted_model import NO_SCRIPT, Reply, ScriptedModel, ToolCall, scripted_model  # noqa: F401 - fixture
from test_environment import run, sandboxes

WORK = "/home/user/agent-loop"


@pytest.fixture
def guard(tmp_path: Path) -> NetGuard:
    return NetGuard(tmp_path / "netguard")


def output_lines(model, marker, step=0) -> list:
    """The lines a terminal call printed, as Hermes fed them back to the model."""
    result = model.tool_result(marker, step)
    assert isinstance(result, dict) and result.get("exit_code") == 0 and result.get("output"), \
        f"{marker} step {step}: {result!r}"
    return result["output"].splitlines()


def tagged_ids(server, tag) -> set:
    """The ids of this test's sandboxes, running or paused (a cleanup may pause a persistent
    writer's sandbox once its state is on the host, L16)."""
    return {s["sandboxID"] for s in sandboxes(server, tag)}


def test_the_scripted_model_replays_by_marker_and_step_streamed_or_not():
    """The scripted endpoint, read by the OpenAI SDK Hermes uses: the step follows from the
    assistant turns after the last user message (so a retry gets the same step, and a
    continued session's earlier marker never chooses), streamed tool calls reassemble into
    the same calls as the JSON answer, tool results are recorded, an unknown marker gets the
    "no script" text, and the server stops."""
    import openai

    with ScriptedModel() as model:
        model.register("M-1", [[ToolCall("terminal", {"command": "echo hi"}), ToolCall("read_file", {"path": "/x"})],
                               Reply("the end of M-1")])
        model.register("M-2", [Reply("M-2 says hi")])
        client = openai.OpenAI(base_url=model.base_url, api_key="sk-test", max_retries=0)
        tools = [{"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}]
        user = {"role": "user", "content": "go M-1"}

        plain = client.chat.completions.create(model="m", messages=[user], tools=tools)
        assert plain.choices[0].finish_reason == "tool_calls"
        calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in plain.choices[0].message.tool_calls]
        assert [c[1:] for c in calls] == [("terminal", {"command": "echo hi"}), ("read_file", {"path": "/x"})]

        streamed: dict = {}
        finish = None
        for chunk in client.chat.completions.create(model="m", messages=[user], tools=tools, stream=True):
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    entry = streamed.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] += delta.id or ""
                    entry["name"] += (delta.function.name or "") if delta.function else ""
                    entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
        assert finish == "tool_calls"
        assert [(e["id"], e["name"], json.loads(e["arguments"])) for _, e in sorted(streamed.items())] == calls

        assistant = plain.choices[0].message.model_dump(exclude_none=True)
        results = [{"role": "tool", "tool_call_id": c[0], "content": json.dumps({"output": f"out-{i}"})}
                   for i, c in enumerate(calls)]
        second = client.chat.completions.create(model="m", messages=[user, assistant, *results], tools=tools)
        assert (second.choices[0].finish_reason, second.choices[0].message.content) == ("stop", "the end of M-1")
        assert model.tool_result("M-1", 0, 1) == {"output": "out-1"}
        assert model.finished("M-1")

        # A continued session: the earlier turn names M-1, the last user message M-2.
        later = [user, assistant, *results, {"role": "assistant", "content": "the end of M-1"},
                 {"role": "user", "content": "now M-2"}]
        text = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(model="m", messages=later, tools=tools, stream=True) if c.choices)
        assert text == "M-2 says hi"
        unknown = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "who?"}], tools=tools)
        assert unknown.choices[0].message.content == NO_SCRIPT
        assert [m.id for m in client.models.list().data] == [model.model_id]
        assert [(r["marker"], r["step"], r["stream"]) for r in model.requests] == [
            ("M-1", 0, False), ("M-1", 0, True), ("M-1", 1, False), ("M-2", 0, True), (None, 0, False)]
        port = int(model.base_url.split(":")[2].split("/")[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_hermes_chat_runs_terminal_file_and_code_tools_in_the_sandbox(home, e2b_local, scripted_model, guard):  # noqa: F811
    """`hermes chat -q` runs a full agent loop against the scripted model: a terminal command,
    a file write (terminal and write_file), read_file in parallel with a terminal `cat`, and
    execute_code, each executed in the one e2b-local sandbox of the profile; the model gets
    back the real outputs (the sandbox's id, the file contents, the script's stdout), Hermes
    ends with the scripted reply, the files stay in the sandbox (a later process reads them
    there, the host has none of them) and nothing tried to leave loopback."""
    tag = uuid.uuid4().hex
    marker = f"LOOP-{tag[:12]}"
    scripted_model.register(marker, [
        ToolCall("terminal", {"command": f"mkdir -p {WORK} && echo hello-{tag[:8]} && echo \"$E2B_SANDBOX_ID\" "
                                         f"&& echo from-terminal > {WORK}/term.txt"}),
        ToolCall("write_file", {"path": f"{WORK}/notes.txt", "content": f"alpha\nbeta {tag[:8]}\n"}),
        [ToolCall("read_file", {"path": f"{WORK}/notes.txt"}),
         ToolCall("terminal", {"command": f"cat {WORK}/term.txt; wc -c < {WORK}/notes.txt"})],
        ToolCall("execute_code", {"code": f"print(open('{WORK}/notes.txt').read().split())"}),
        Reply(f"all done {marker}"),
    ])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag})))
    home.write_key()

    proc = hermes_chat(home, guard, f"Please run the scripted steps {marker}")
    assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert f"all done {marker}" in proc.stdout
    assert scripted_model.finished(marker)
    steps = [r["step"] for r in scripted_model.conversation(marker)]
    assert steps == [0, 1, 2, 3, 4], f"one request per step, in order: {steps}"

    first = scripted_model.tool_result(marker, 0)
    assert first["exit_code"] == 0, first
    hello, sandbox_id = first["output"].splitlines()
    assert hello == f"hello-{tag[:8]}"
    assert tagged_ids(e2b_local, tag) == {sandbox_id}, \
        f"the command ran in this profile's e2b-local sandbox: {sandboxes(e2b_local, tag)}"

    written = scripted_model.tool_result(marker, 1)
    assert written.get("bytes_written") == len(f"alpha\nbeta {tag[:8]}\n"), written
    read = scripted_model.tool_result(marker, 2, 0)
    assert read["content"].splitlines() == ["1|alpha", f"2|beta {tag[:8]}"], read
    cat = scripted_model.tool_result(marker, 2, 1)
    assert cat["output"].splitlines() == ["from-terminal", str(len(f"alpha\nbeta {tag[:8]}\n"))], cat
    code = scripted_model.tool_result(marker, 3)
    assert f"['alpha', 'beta', '{tag[:8]}']" in code.get("output", ""), code

    # The files are in the sandbox, not on the host: a later process of the profile finds them.
    assert not Path(WORK).exists()
    after = run(home, f"""
        r = T("cat {WORK}/notes.txt {WORK}/term.txt; echo \\"$E2B_SANDBOX_ID\\"")
        finish(r)
    """)
    assert after["output"].splitlines() == ["alpha", f"beta {tag[:8]}", "from-terminal", sandbox_id]
    assert guard.attempts() == [], f"Hermes tried to leave loopback:\n{guard.stacks()}"
    assert_no_key(proc.stdout, proc.stderr, json.dumps(scripted_model.requests))


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_gateway_chats_get_their_own_sandboxes_and_keep_them_across_a_restart(home, e2b_local, scripted_model, guard, stop):  # noqa: F811
    """A real `hermes gateway run` with the api_server platform serves two chats (two
    X-Hermes-Session-Id values) at the same time; each chat's terminal command runs in a
    sandbox of its own (different sandbox ids, chat A's file absent in chat B's sandbox).
    The gateway is stopped (SIGTERM: its clean shutdown; SIGKILL: a crash) and started again
    on the same profile: chat A, continued under its id, gets its old sandbox back with its
    file intact (and still not chat B's), and no sandbox was added."""
    tag = uuid.uuid4().hex
    short = tag[:8]
    a1, b1, a2 = (f"{name}-{tag[:12]}" for name in ("A1", "B1", "A2"))
    probe = 'echo "$E2B_SANDBOX_ID"; for f in chat-a chat-b; do test -e ~/"$f".txt && echo "$f:$(cat ~/"$f".txt)" || echo "$f:absent"; done'
    scripted_model.register(a1, [ToolCall("terminal", {"command": f"echo alpha-{short} > ~/chat-a.txt; sleep 1; {probe}"}),
                                 Reply(f"chat A wrote {short}")])
    scripted_model.register(b1, [ToolCall("terminal", {"command": f"echo beta-{short} > ~/chat-b.txt; sleep 1; {probe}"}),
                                 Reply(f"chat B wrote {short}")])
    scripted_model.register(a2, [ToolCall("terminal", {"command": probe}), Reply(f"chat A is back {short}")])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag})))
    home.write_key()
    chat_a, chat_b = f"chat-a-{short}", f"chat-b-{short}"

    gateway = Gateway(home, guard)
    try:
        gateway.start()
        # Both chats at once: two agent loops in one gateway process.
        thread_a = gateway.chat_in_thread(f"first message {a1}", session_id=chat_a)
        thread_b = gateway.chat_in_thread(f"first message {b1}", session_id=chat_b)
        assert thread_a.result() == f"chat A wrote {short}"
        assert thread_b.result() == f"chat B wrote {short}"

        sandbox_a, *seen_a = output_lines(scripted_model, a1)
        sandbox_b, *seen_b = output_lines(scripted_model, b1)
        assert sandbox_a and sandbox_b and sandbox_a != sandbox_b, "each chat has a sandbox of its own"
        assert seen_a == [f"chat-a:alpha-{short}", "chat-b:absent"]
        assert seen_b == ["chat-a:absent", f"chat-b:beta-{short}"]
        assert tagged_ids(e2b_local, tag) == {sandbox_a, sandbox_b}

        if stop == "sigterm":
            rc = gateway.stop(signal.SIGTERM)
            # Hermes exits 1 after a signal-initiated shutdown (so a service manager revives it).
            assert rc in (0, 1), f"SIGTERM exit code {rc}\n{gateway.tail()}"
            assert any("Received SIGTERM" in line for line in gateway.output_lines()), gateway.tail()
            assert any("Gateway stopped" in line for line in gateway.output_lines()), "a clean shutdown"
        else:
            assert gateway.kill() == -signal.SIGKILL
            assert not any("Gateway stopped" in line for line in gateway.output_lines()), "no shutdown ran"

        gateway.start()
        assert gateway.chat(f"second message {a2}", session_id=chat_a) == f"chat A is back {short}"
        assert gateway.last_headers.get("X-Hermes-Session-Id") == chat_a
        again, *seen_again = output_lines(scripted_model, a2)
        assert again == sandbox_a, "after the restart chat A is back in its own sandbox"
        assert seen_again == [f"chat-a:alpha-{short}", "chat-b:absent"]
        # The session was continued: Hermes replayed chat A's first turn from its state.db.
        continued = scripted_model.conversation(a2)[0]["body"]["messages"]
        assert any(a1 in json.dumps(m.get("content")) for m in continued if m.get("role") == "user")
        assert tagged_ids(e2b_local, tag) == {sandbox_a, sandbox_b}, "no sandbox was added by the restart"
    finally:
        gateway.close()
    assert guard.attempts() == [], f"Hermes tried to leave loopback:\n{guard.stacks()}"
    assert_no_key("\n".join(gateway.log_lines()), json.dumps(scripted_model.requests))
