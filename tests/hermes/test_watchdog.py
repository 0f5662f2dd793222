"""Every tool call ends (contract O7): no native call waits with the GIL held for the scope's
state, and a call that outlives its time plus ``watchdog_grace_seconds`` is ended by the
plugin's watchdog with an error naming the sandbox and what it waited for, the command it
started then being killed.

The stalls are made with e2b-local's ``hold`` fault: a request that stays unanswered until the
test releases it."""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest

from conftest import FAKE_KEY, assert_no_key
from test_cli import rest as admin
from test_native import NATIVE_PRELUDE


@pytest.fixture
def held(e2b_local):
    """Clears a hold a failing test left armed, so later tests are not stalled by it."""
    yield
    admin(e2b_local, "POST", "/_e2b_local/faults/clear")


def native_env(e2b_local, **settings):
    return {"SETTINGS": json.dumps(e2b_local.settings(metadata={"test": uuid.uuid4().hex}, **settings)),
            "KEY": FAKE_KEY}


def test_reading_the_sandbox_id_never_holds_the_gil_while_a_sync_runs(home, e2b_local):
    """contract: O7. The hang of issue 28, pinned: Hermes' execute_code polls from two threads;
    one finished starting its command and asked for the replaced sandbox while the other's
    admission held the scope's state and called back into Python (a sync hook). Waiting for
    that state with the GIL held deadlocked the whole process. Here the push hook itself waits
    for a second thread that reads ``take_replaced`` and ``sandbox_id``: it must get the GIL."""
    result = home.driver(NATIVE_PRELUDE + textwrap.dedent("""
        import threading, time
        class Blocking(Hooks):
            def __init__(self):
                super().__init__()
                self.reader = None
                self.reader_done = threading.Event()
            def push(self, transport, kind):
                super().push(transport, kind)
                if kind != "incremental" or self.reader is not None:
                    return
                def read():
                    b.take_replaced(); b.sandbox_id
                    self.reader_done.set()
                self.reader = threading.Thread(target=read)
                self.reader.start()
                # Lets the reader run (it needs the GIL this wait gives up) while this sync
                # holds the scope's state; it cannot finish before the sync does.
                self.reader.join(timeout=2)
        hooks = Blocking()
        b = backend(hooks)
        b.attach()
        started = time.monotonic()
        b.sync_state()
        synced_after = time.monotonic() - started
        finished = hooks.reader_done.wait(30)
        print("RESULT:" + json.dumps({"reader_ran": hooks.reader is not None, "finished": finished,
                                      "synced_after": synced_after, "sandbox": b.sandbox_id}))
        b.cleanup()
    """), extra_env=native_env(e2b_local), timeout=90)
    assert result["reader_ran"] is True
    assert result["finished"] is True, "the reader waited for the sync without the GIL, then ran"
    assert result["sandbox"]


def test_a_start_that_outlives_its_deadline_ends_and_its_command_is_killed(home, e2b_local, held):
    """contract: O7. The start request never answers: the call ends at its time plus the grace
    with an error naming the sandbox, the operation and what it waited for; when the start is
    finally answered, the command it started is killed (process group), as nobody waits for it."""
    result = home.driver(NATIVE_PRELUDE + textwrap.dedent("""
        import time, urllib.request
        def admin(path, body):
            request = urllib.request.Request(os.environ["API"] + path, data=json.dumps(body).encode(), method="POST",
                                             headers={"X-API-Key": "e2b_test_admin", "Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=30).read()
        b = backend(Hooks())
        sandbox = b.attach()["sandbox_id"]
        b.sync_state()
        admin("/_e2b_local/faults/hold", {"skip": 0, "scope": "envd", "pathPrefix": "/process.Process/Start"})
        r, w = os.pipe()
        started = time.monotonic()
        try:
            b.run("exec sleep 600 # o7-late-marker", fd=w, timeout_seconds=1, deadline=b.call_deadline(1))
            error = None
        except _native.E2BError as e:
            error = {"type": type(e).__name__, "text": str(e)}
        waited = time.monotonic() - started
        os.close(r)
        # Answered now: the command starts, and the watchdog's late handler kills it.
        admin("/_e2b_local/faults/release", {"answer": "continue"})
        r2, w2 = os.pipe()
        probe = b.run("for i in $(seq 200); do pgrep -f o7-late-[m]arker >/dev/null || { echo gone; exit 0; }; "
                      "sleep 0.1; done; echo still-running", fd=w2, timeout_seconds=60)
        seen = read_all(r2); probe.wait(60)
        print("RESULT:" + json.dumps({"sandbox": sandbox, "error": error, "waited": waited, "seen": seen}))
        b.cleanup()
    """), extra_env={**native_env(e2b_local, watchdog_grace_seconds=2), "API": e2b_local.api_url}, timeout=120)
    assert result["error"] is not None, "the held start ended the call"
    assert result["error"]["type"] == "StalledError"
    text = result["error"]["text"]
    assert "E2B start command stalled for sandbox " + result["sandbox"] in text
    assert "held by `start command`" in text, text
    assert "Hint:" in text and "watchdog" in text
    # 1 s of its own plus the 2 s grace; the sandbox's late answer does not prolong it.
    assert 2.5 <= result["waited"] < 3 + 5
    assert result["seen"] == "gone\n", "the command started after its call ended was killed"
    assert_no_key(text)


def test_a_terminal_command_whose_state_sync_stalls_ends_naming_it(home, e2b_local, held):
    """contract: O7. Through Hermes' terminal tool: the writer's sync before the command (outside
    Hermes' own wait bound) hangs on an upload that is never answered. The tool call ends soon
    after its time plus the grace, its text names the sandbox, the stalled step and the sync
    that held the scope; Hermes' retries fail fast meanwhile; once the upload is answered, the
    next command runs."""
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}, watchdog_grace_seconds=2),
                      terminal={"timeout": 3})
    home.write_key()
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("# v1\n")
    out = home.driver(textwrap.dedent("""
        import json, time, urllib.request
        from hermes_cli.env_loader import load_hermes_dotenv
        load_hermes_dotenv()
        from hermes_cli.plugins import discover_plugins
        discover_plugins()
        import tools.terminal_tool as tt
        from pathlib import Path
        import os
        def admin(path, body):
            request = urllib.request.Request(os.environ["API"] + path, data=json.dumps(body).encode(), method="POST",
                                             headers={"X-API-Key": "e2b_test_admin", "Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=30).read()
        def T(command):
            return json.loads(tt.terminal_tool(command, task_id="t1"))
        r = {"first": T("echo first")}
        Path(os.environ["HERMES_HOME"], "skills", "demo", "SKILL.md").write_text("# v2\\n")
        admin("/_e2b_local/faults/hold", {"skip": 0, "scope": "envd", "pathPrefix": "/files"})
        started = time.monotonic()
        r["stalled"] = T("echo second")
        r["waited"] = time.monotonic() - started
        admin("/_e2b_local/faults/release", {"answer": "continue"})
        r["after"] = T("cat ~/.hermes/skills/demo/SKILL.md")
        print("RESULT:" + json.dumps(r))
    """), extra_env={"API": e2b_local.api_url, "HERMES_FORCE_FILE_SYNC": "1"}, timeout=180)
    assert out["first"]["output"] == "first"
    stalled = out["stalled"]
    text = json.dumps(stalled)
    assert stalled.get("exit_code") != 0 and "second" not in stalled.get("output", "")
    assert "E2B sync state stalled for sandbox " in text, text
    assert "held by `sync state`" in text and "Hermes' state hooks (sync)" in text, text
    # Its 3 s plus the 2 s grace, then Hermes' three retries: each fails within the 2 s a
    # call waits behind a stalled one, after Hermes' own 2 + 4 + 8 s backoff.
    assert out["waited"] < 3 + 2 + 3 * 2 + 14 + 10, out["waited"]
    assert out["after"]["output"] == "# v2", "the sync finished once answered; commands run again"
    assert_no_key(text)
