"""Fixtures: an `e2b-local serve` process and the official E2B SDK pointed at it.

The binary comes from $E2B_LOCAL_BIN (scripts/conformance sets it). Each server is
started with --exit-on-stdin-eof, so it dies with this test process even if the
fixture's teardown never runs.
"""

import json
import os
import subprocess
import time
import urllib.request
import uuid

import pytest

API_KEY = "e2b_conformance_key"

# The code-interpreter SDK needs e2b >= 2.55.1: scripts/conformance installs it beside the
# newer pinned e2b only, and asserts there that these tests ran.
try:
    import e2b_code_interpreter  # noqa: F401
except ImportError:
    collect_ignore = ["test_code_interpreter.py", "test_code_interpreter_charts.py"]


class LocalServer:
    """One running `e2b-local serve`: its URL and its admin routes."""

    def __init__(self, state_dir=None, extra_args=()):
        binary = os.environ.get("E2B_LOCAL_BIN")
        if not binary or not os.path.exists(binary):
            raise RuntimeError("E2B_LOCAL_BIN must name the e2b-local binary (run scripts/conformance)")
        args = [binary, "serve", "--listen", "127.0.0.1:0", "--exit-on-stdin-eof"]
        if state_dir is not None:
            args += ["--state-dir", str(state_dir)]
        args += list(extra_args)
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        lines = {}
        while "E2B_API_URL" not in lines or "E2B_SANDBOX_URL" not in lines:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"e2b-local exited early with {self.proc.wait()}")
            key, _, value = line.strip().partition("=")
            lines[key] = value
        self.api_url = lines["E2B_API_URL"]
        self.sandbox_url = lines["E2B_SANDBOX_URL"]

    def env(self):
        return {
            "E2B_API_KEY": API_KEY,
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.sandbox_url,
            # The volume content API is served on the same port.
            "E2B_VOLUME_API_URL": self.api_url,
        }

    def admin(self, path, body=None):
        """POSTs (or GETs without a body) to /_e2b_local/<path>; returns parsed JSON or None."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.api_url}/_e2b_local/{path}",
            data=data,
            method="GET" if body is None else "POST",
            headers={"X-API-Key": API_KEY, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return json.loads(text) if text else None

    def advance_clock(self, seconds):
        return self.admin("clock/advance", {"seconds": seconds})

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.returncode == 0, f"e2b-local exited with {self.proc.returncode}"


def _use(server, monkeypatch_env):
    for key, value in server.env().items():
        monkeypatch_env.setenv(key, value)


@pytest.fixture(scope="session")
def server():
    srv = LocalServer()
    mp = pytest.MonkeyPatch()
    _use(srv, mp)
    yield srv
    mp.undo()
    srv.stop()


@pytest.fixture(scope="module")
def own_server():
    """A server for tests that move the clock, so other tests' leases are unaffected."""
    srv = LocalServer()
    mp = pytest.MonkeyPatch()
    _use(srv, mp)
    yield srv
    mp.undo()
    srv.stop()


@pytest.fixture
def unique():
    return uuid.uuid4().hex[:12]


@pytest.fixture
def sandbox(server):
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=300)
    yield sbx
    Sandbox.kill(sbx.sandbox_id)


def wait_for(predicate, what, timeout=30.0):
    """Polls `predicate` (for state that settles asynchronously, never as a timing check)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
