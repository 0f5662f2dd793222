"""What a quiet chat costs (issue 34; contracts L17, O10): with `pause_after_idle_seconds`
set, a real Hermes' sandbox is paused that long after its last command, whatever lease a long
command timeout asked for, and also with a background server and an idle execute_code kernel
in it: live (their streams open, issue 42) or through Hermes' own poller (`live_tools:
false`). The running time after the last command is measured from e2b-local's own view (the
sandbox's state, sampled), against the setting plus a stated grace: the watcher looks once a
second, and a pause request is one round trip."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

import pytest

from test_environment import run

QUIET = 4
#: The watcher's period (1 s), one pause request and the sampling on a busy 2-core machine.
GRACE = 4


@pytest.mark.parametrize("live_tools", [True, False], ids=["live", "polled"])
def test_a_quiet_chat_runs_its_quiet_time_then_pauses_with_a_background_process_and_a_kernel_in_it(home, e2b_local, live_tools):
    # contract: L17, O10
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}, pause_after_idle_seconds=QUIET,
                                                  live_tools=live_tools),
                      terminal={"timeout": 600})
    home.write_key()
    result = run(home, """
        import time, urllib.request
        def state():
            sandbox_id = next(iter(tt._active_environments.values()))._native.sandbox_id
            request = urllib.request.Request(f"%(api)s/sandboxes/{sandbox_id}", headers={"X-API-Key": "e2b_test_listing"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["state"]
        def running_for():
            # Seconds from now until e2b-local says paused (bounded: 60 s).
            started = time.monotonic()
            while state() != "paused":
                assert time.monotonic() - started < 60, "still running after 60 s"
                time.sleep(0.1)
            return time.monotonic() - started
        r = {}
        # A command with a 600 s timeout: its lease covers 600 s and more (L5).
        r["plain"] = T("echo quiet", timeout=600)["output"]
        r["plain_seconds"] = running_for()
        # A background process (streamed live, or read by Hermes' poller every 2 s) and a kernel
        # with state, then nothing from the chat.
        r["resumed"] = T("echo back")["output"]
        from tools.code_execution_tool import execute_code
        r["cell"] = json.loads(execute_code("kept = 'state'\\nprint(kept)", task_id="t1"))
        r["background"] = T("while true; do date +%%s; sleep 1; done", background=True)
        r["background_seconds"] = running_for()
        from tools.process_registry import process_registry
        r["still_running"] = not process_registry.get(r["background"]["session_id"]).exited
        from tools.terminal_tool_lifecycle import cleanup_vm
        for key in list(tt._active_environments):
            cleanup_vm(key)
        finish(r)
    """ % {"api": e2b_local.api_url})
    assert result["plain"] == "quiet" and result["resumed"] == "back"
    assert result["cell"]["output"] == "state\n", result["cell"]
    assert bool(result["cell"]["kernel"].get("live")) is live_tools, result["cell"]
    print(f"running after the last command: {result['plain_seconds']:.1f} s plain, "
          f"{result['background_seconds']:.1f} s with a background process and a kernel "
          f"({'live' if live_tools else 'polled'}; setting {QUIET} s, grace {GRACE} s)")
    # Not before the setting (a pause counted from the last command), not long after it.
    assert QUIET - 1 <= result["plain_seconds"] <= QUIET + GRACE, result
    assert QUIET - 1 <= result["background_seconds"] <= QUIET + GRACE, result
    assert result["still_running"], "Hermes still tracks the frozen process"
