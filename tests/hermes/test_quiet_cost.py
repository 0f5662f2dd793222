"""What a quiet chat costs (issue 34; contract L17): with `pause_after_idle_seconds` set, a
real Hermes' sandbox is paused that long after its last command, whatever lease a long
command timeout asked for, and also while Hermes' poller watches a background process in
it. The running time after the last command is measured from e2b-local's own view (the
sandbox's state, sampled), against the setting plus a stated grace: the watcher looks once a
second, and a pause request is one round trip."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

from test_environment import run

QUIET = 4
#: The watcher's period (1 s), one pause request and the sampling on a busy 2-core machine.
GRACE = 4


def test_a_quiet_chat_runs_its_quiet_time_then_pauses_even_while_a_background_process_is_polled(home, e2b_local):
    # contract: L17
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}, pause_after_idle_seconds=QUIET),
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
        # A background process Hermes' poller reads every 2 s, then nothing from the chat.
        r["resumed"] = T("echo back")["output"]
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
    print(f"running after the last command: {result['plain_seconds']:.1f} s plain, "
          f"{result['background_seconds']:.1f} s with a polled background process "
          f"(setting {QUIET} s, grace {GRACE} s)")
    # Not before the setting (a pause counted from the last command), not long after it.
    assert QUIET - 1 <= result["plain_seconds"] <= QUIET + GRACE, result
    assert QUIET - 1 <= result["background_seconds"] <= QUIET + GRACE, result
    assert result["still_running"], "Hermes still tracks the frozen process"
