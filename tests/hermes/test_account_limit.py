"""A gateway with more sessions than the account's limit of concurrently running sandboxes
(issue 30, contract L14): e2b-local runs with `--max-running 3`, five gateway chats of one Hermes
process take turns, and each session's commands succeed. A start E2B refuses for the limit
pauses the process's idlest sandbox and tries again; a paused sandbox resumes on its next
command with its files and the writer's pushed state intact; a sandbox with a command
running is never paused. Real Hermes, real e2b-local."""

from __future__ import annotations

import uuid

import pytest

from conftest import LocalServer
from test_environment import run, sandboxes
from test_first_contact import limits


@pytest.fixture(scope="module")
def limited():
    server = LocalServer("--max-running", "3")
    yield server
    server.stop()


def test_five_sessions_share_three_slots_and_lose_nothing(home, limited):
    # contract: L14
    tag = uuid.uuid4().hex
    home.write_config(settings=limited.settings(metadata={"test": tag}, slot_wait_seconds=60),
                      terminal={"timeout": 120})
    home.write_key()
    skill = home.path / "skills" / "limit" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("# pushed by the writer\n")
    result = run(home, f"""
        import threading, time, urllib.request
        from gateway.session_context import clear_session_vars, set_session_vars
        from tools.terminal_tool_lifecycle import cleanup_vm
        import tools.terminal_tool as terminal
        def in_chat(chat, command, **kwargs):
            # Hermes' gateway runs each chat's turns in that chat's session context: one
            # scope, so one sandbox, per chat.
            tokens = set_session_vars(platform="telegram", chat_id=str(chat), session_key=f"agent:main:telegram:dm:{{chat}}")
            try:
                return T(command, task_id=f"turn-{{chat}}", **kwargs)
            finally:
                clear_session_vars(tokens)
        def running_processes():
            request = urllib.request.Request("{limited.api_url}/_e2b_local/requests", headers={{"X-API-Key": "e2b_test_listing"}})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["runningProcesses"]
        r = {{"made": {{}}, "again": {{}}, "skill": {{}}}}
        # Round one: five chats, three slots. Each leaves a mark in its sandbox.
        for n in range(1, 6):
            r["made"][n] = in_chat(n, f"echo session-{{n}} > ~/mark; cat ~/mark")
        # Chat one runs a long command, released only by a file; meanwhile the others take
        # turns, and every resume needs a slot that only a pause can free.
        held = {{}}
        def hold():
            held["result"] = in_chat(1, "while [ ! -e /tmp/go ]; do sleep 0.1; done; echo held-done", timeout=120)
        holder = threading.Thread(target=hold)
        holder.start()
        for _ in range(600):
            if running_processes() > 0:
                break
            time.sleep(0.1)
        r["held_started"] = running_processes() > 0
        for n in range(2, 6):
            r["again"][n] = in_chat(n, "cat ~/mark")
            r["skill"][n] = in_chat(n, "cat ~/.hermes/skills/limit/SKILL.md")
        r["release"] = in_chat(1, "touch /tmp/go")
        holder.join(180)
        r["held"] = held.get("result")
        r["again"][1] = in_chat(1, "cat ~/mark")
        r["keys"] = sorted(terminal._active_environments)
        for key in list(terminal._active_environments):
            cleanup_vm(key)
        finish(r)
    """)
    for n in range(1, 6):
        assert result["made"][str(n)]["exit_code"] == 0, result["made"][str(n)]
        assert result["made"][str(n)]["output"] == f"session-{n}"
        assert result["again"][str(n)]["output"] == f"session-{n}", result["again"][str(n)]
    for n in range(2, 6):
        assert result["skill"][str(n)]["output"] == "# pushed by the writer", result["skill"][str(n)]
    assert result["held_started"]
    # Had session one's sandbox been paused under its command, the command would have died.
    assert result["release"]["exit_code"] == 0, result["release"]
    assert result["held"] is not None and result["held"]["exit_code"] == 0, result["held"]
    assert result["held"]["output"] == "held-done"
    assert len(result["keys"]) == 5
    # One sandbox per session, never more than the limit running.
    found = sandboxes(limited, tag)
    assert len(found) == 5, found
    assert limits(limited)["running"] <= 3
