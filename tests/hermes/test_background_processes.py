"""A chat serving a background process under the account's limit (issues 34 and 42;
contracts L17, L18, O9): e2b-local runs with `--max-running 2`, one gateway chat starts a web
server with the terminal tool's `background=True` (a live process, or with `live_tools:
false` Hermes' own poller watching it), and two other chats need slots. The plain idle chat
is paused first; when the serving chat is paused in turn (the only one left: another chat
runs a command), its server is frozen with the sandbox (a pause keeps memory), Hermes keeps
it as running (its poller's reads answered on the host, or the live stream waiting for the
chat's next use) instead of resuming the sandbox, and the chat's next command finds the
server answering again. Real Hermes, real e2b-local."""

from __future__ import annotations

import uuid

import pytest

from conftest import LocalServer
from test_environment import run


@pytest.fixture
def limited():
    server = LocalServer("--max-running", "2")
    yield server
    server.stop()


@pytest.mark.parametrize("live_tools", [True, False], ids=["live", "polled"])
def test_a_background_server_is_paused_last_and_survives_its_pause(home, limited, live_tools):
    # contract: L17, L18, O9
    tag = uuid.uuid4().hex
    home.write_config(settings=limited.settings(metadata={"test": tag}, slot_wait_seconds=30, live_tools=live_tools),
                      terminal={"timeout": 60})
    home.write_key()
    result = run(home, """
        import time, urllib.request
        from gateway.session_context import clear_session_vars, set_session_vars
        from tools.process_registry import process_registry
        from tools.terminal_tool_lifecycle import cleanup_vm
        def in_chat(chat, command, **kwargs):
            tokens = set_session_vars(platform="telegram", chat_id=chat, session_key=f"agent:main:telegram:dm:{chat}")
            try:
                return T(command, task_id=f"turn-{chat}", **kwargs)
            finally:
                clear_session_vars(tokens)
        def state(chat):
            sandbox_id = tt._active_environments[f"session:agent:main:telegram:dm:{chat}"]._native.sandbox_id
            request = urllib.request.Request(f"%(api)s/sandboxes/{sandbox_id}", headers={"X-API-Key": "e2b_test_listing"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["state"]
        r = {}
        r["idle"] = in_chat("idle", "echo idle")["output"]
        r["started"] = in_chat("web", "cd /tmp && python3 -m http.server 8765", background=True)
        session_id = r["started"].get("session_id")
        # Hermes' poller watches it (a poll every 2 s); the server answers.
        for _ in range(100):
            answered = in_chat("web", "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:8765/ || true")["output"]
            if answered == "200":
                break
            time.sleep(0.2)
        r["answered_before"] = answered
        # The server's log of that request reached Hermes (streamed, or read by its poller).
        def until(condition, what):
            deadline = time.monotonic() + 60
            while not condition():
                assert time.monotonic() < deadline, f"waited 60 s for {what}; log: " + chr(10).join(_log.getvalue().splitlines()[-60:])
                time.sleep(0.1)
        until(lambda: "GET / " in process_registry.get(session_id).output_buffer, "the poller to read the log")
        # A third chat needs a slot: the idle chat is paused, not the serving one.
        r["third"] = in_chat("third", "echo third")["output"]
        r["after_third"] = {"idle": state("idle"), "web": state("web")}
        # The third chat runs a long command, so a fourth chat's slot can only come from the
        # serving chat: it is paused then, not before.
        import threading
        held = {}
        def hold():
            held["result"] = in_chat("third", "touch /tmp/holding; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo held-done", timeout=120)
        holder = threading.Thread(target=hold)
        holder.start()
        until(lambda: in_chat("third", "test -e /tmp/holding && echo up || true")["output"] == "up", "the held command")
        r["fourth"] = in_chat("fourth", "echo fourth")["output"]
        r["web_paused"] = state("web")
        if not %(live)s:
            until(lambda: "E2B poll answered on the host" in _log.getvalue(), "a poll of the paused sandbox")
        session = process_registry.get(session_id)
        r["poll_while_paused"] = {"exited": session.exited, "exit_code": session.exit_code}
        # The chat's next command resumes it: the same server answers again.
        r["answered_after"] = in_chat("web", "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:8765/ || true")["output"]
        r["still_tracked"] = not process_registry.get(session_id).exited
        in_chat("third", "touch /tmp/go")
        holder.join(120)
        r["held"] = held.get("result", {}).get("output")
        for key in list(tt._active_environments):
            cleanup_vm(key)
        finish(r)
    """ % {"api": limited.api_url, "live": live_tools})
    assert result["idle"] == "idle" and result["answered_before"] == "200", result
    assert result["after_third"] == {"idle": "paused", "web": "running"}, result["after_third"]
    assert result["fourth"] == "fourth" and result["web_paused"] == "paused", result
    assert result["poll_while_paused"]["exited"] is False, result["poll_while_paused"]
    assert result["answered_after"] == "200", result
    assert result["still_tracked"] is True
    assert result["held"] == "held-done", "the held command was never paused under"

