"""The native module on its own (no Hermes tool layer): the command handle, kill by pid,
deferred Ctrl-C during cleanup, ownership of the pipe."""

from __future__ import annotations

import textwrap
import uuid

import pytest

from conftest import FAKE_KEY, assert_no_key

NATIVE_PRELUDE = """
import json, os
from hermes_e2b import _native
class Hooks:
    def __init__(self): self.calls = []
    def push(self, transport, kind): self.calls.append(("push", kind, transport.remote_hermes_home))
    def pull(self, transport): self.calls.append(("pull",))
def backend(hooks, mode="persistent", task_id="t"):
    settings = _native.Settings(json.loads(os.environ["SETTINGS"]))
    return _native.Backend(settings, profile_home=os.environ["HERMES_HOME"], task_id=task_id, mode=mode,
                           lifetime_seconds=300, key_resolver=lambda: os.environ["KEY"], hooks=hooks, host_only=[])
def read_all(fd):
    chunks = []
    with os.fdopen(fd, "rb") as f:
        while True:
            b = f.read(65536)
            if not b: break
            chunks.append(b)
    return b"".join(chunks).decode()
"""


def native(home, body, **kwargs):
    return home.driver(NATIVE_PRELUDE + textwrap.dedent(body), **kwargs)


@pytest.fixture
def native_env(home, e2b_local):
    import json

    settings = e2b_local.settings(metadata={"test": uuid.uuid4().hex})
    return {"SETTINGS": json.dumps(settings), "KEY": FAKE_KEY}


def test_command_streams_into_the_pipe_and_kill_hits_only_that_pid(home, native_env):
    result = native(home, """
        hooks = Hooks()
        b = backend(hooks)
        r, w = os.pipe()
        cmd = b.run("echo out; echo err >&2; exit 7", fd=w, timeout_seconds=30, login=False)
        out = read_all(r)
        code = cmd.wait()
        r2, w2 = os.pipe()
        slow = b.run("sleep 600", fd=w2, timeout_seconds=900, login=False)
        still_running = slow.wait(0.2)
        slow.kill()
        killed = slow.wait(60)
        read_all(r2)
        r3, w3 = os.pipe()
        after = b.run("echo alive", fd=w3, timeout_seconds=30, login=True)
        alive = read_all(r3); after.wait()
        report = b.cleanup()
        print("RESULT:" + json.dumps({"out": out, "code": code, "has_pid": hasattr(cmd, "pid"),
              "sandbox_pid": cmd.sandbox_pid > 0, "still_running": still_running, "killed": killed,
              "termination": slow.termination, "alive": alive, "hooks": hooks.calls, "report": report,
              "again": b.cleanup()["repeated"]}))
    """, extra_env=native_env)
    # stdout and stderr are separate pipes in the sandbox: both reach our one pipe, in an
    # order the sandbox does not fix.
    assert sorted(result["out"].splitlines(keepends=True)) == ["err\n", "out\n"]
    assert result["code"] == 7
    assert result["has_pid"] is False and result["sandbox_pid"] is True
    assert result["still_running"] is None
    assert result["termination"] == "killed"
    assert result["alive"] == "alive\n", "the sandbox survives a command kill (L6)"
    assert result["hooks"][0] == ["push", "initial", "/home/user/.hermes"]
    assert ["pull"] in result["hooks"]
    # Pulled, and no one else uses it: paused at close, its slot and cost freed (L16).
    assert result["report"]["sandbox"] == "paused" and result["report"]["pull"] == "pulled"
    assert result["again"] is True, "cleanup is idempotent (L7)"


def test_ctrl_c_inside_the_teardown_pull_is_deferred_then_reraised(home, native_env):
    # contract: L10 (the interrupt surfaces only after the mandatory release completed)
    result = native(home, """
        class Interrupting(Hooks):
            def pull(self, transport):
                self.calls.append(("pull",))
                raise KeyboardInterrupt
        hooks = Interrupting()
        b = backend(hooks)
        # A command, so the cleanup has something to pull (L16).
        r, w = os.pipe(); c = b.run("true", fd=w, timeout_seconds=30, login=False); read_all(r); c.wait()
        try:
            b.cleanup(); raised = False
        except KeyboardInterrupt:
            raised = True
        after = b.cleanup()
        try:
            r, w = os.pipe(); b.run("true", fd=w, timeout_seconds=5, login=False); closed = False
        except _native.BackendClosedError:
            closed = True
        print("RESULT:" + json.dumps({"raised": raised, "repeated": after["repeated"], "closed": closed}))
    """, extra_env=native_env)
    assert result["raised"] is True
    assert result["repeated"] is True, "the cleanup completed before the interrupt surfaced"
    assert result["closed"] is True


def test_errors_are_typed_and_never_carry_the_key(home, native_env):
    result = native(home, """
        b = _native.Backend(_native.Settings({"api_url": "http://127.0.0.1:9", "sandbox_url": "http://127.0.0.1:9"}),
                            profile_home=os.environ["HERMES_HOME"], task_id="t", mode="persistent",
                            lifetime_seconds=300, key_resolver=lambda: os.environ["KEY"], hooks=Hooks(), host_only=[])
        try:
            b.attach(); text = None; typed = None
        except _native.E2BError as e:
            text, typed = str(e), type(e).__name__
        try:
            _native.Backend(_native.Settings({}), profile_home="/tmp", task_id="t", mode="sometimes",
                            lifetime_seconds=1, key_resolver=lambda: None, hooks=Hooks(), host_only=[]); bad = None
        except ValueError as e:
            bad = str(e)
        print("RESULT:" + json.dumps({"text": text, "typed": typed, "bad": bad}))
    """, extra_env=native_env)
    assert result["text"].startswith("E2B "), result["text"]
    assert "timeout" not in result["text"].lower()
    assert_no_key(result["text"])
    assert "mode must be" in result["bad"]
