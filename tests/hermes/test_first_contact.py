"""First contact (issue 22, items 2 and 3): what a Hermes user sees when the key is refused,
the account is at its concurrency limit, the template does not exist, the endpoint cannot be
reached, its certificate is not trusted or it is too slow; through Hermes' terminal tool and
through `hermes doctor` / `hermes e2b doctor`. Real Hermes, real e2b-local, faults injected
through e2b-local's admin routes. Each message names its operation once, carries one hint,
and never the key (contracts O5, O6, X1)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import REPO, assert_no_key
from test_environment import run

#: What turns the doctor's live access check on in a test (conftest keeps it off).
LIVE = {"HERMES_E2B_DOCTOR_OFFLINE": ""}
TLS_FIXTURES = REPO / "crates" / "e2b-client" / "tests" / "tls"


def admin(server, path: str, body: dict) -> None:
    request = urllib.request.Request(f"{server.api_url}/_e2b_local/{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"X-API-Key": "e2b_test_listing",
                                                             "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def refuse(server, status: int, message: str, count: int = 20) -> None:
    """The next control-plane requests answer `status` with E2B's own `message`."""
    admin(server, "faults/fail", {"count": count, "status": status, "scope": "rest", "pathPrefix": "/v2/sandboxes",
                                  "shouldRetry": False, "message": message})


@pytest.fixture
def profile(home, e2b_local):
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), terminal={"timeout": 60})
    home.write_key()
    yield home
    admin(e2b_local, "faults/clear", {})


def closed_port_url() -> str:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    return f"http://127.0.0.1:{port}"


def hermes_doctor(home, extra_env=None) -> str:
    """The E2B rows of the real `hermes doctor` (as in test_plugin: Hermes skips plugin
    backends when it thinks it runs in a container, so that check is pretended away)."""
    proc = home.doctor({**LIVE, **(extra_env or {})})
    assert_no_key(proc.stdout, proc.stderr)
    rows = "\n".join(line for line in proc.stdout.splitlines() if "E2B" in line)
    assert "E2B native core" in rows, proc.stdout[-3000:] + proc.stderr[-3000:]
    return rows


def e2b_doctor(home, extra_env=None):
    proc = home.hermes("e2b", "doctor", extra_env={**LIVE, **(extra_env or {})})
    assert_no_key(proc.stdout, proc.stderr)
    return proc


def access_line(text: str) -> str:
    lines = [line for line in text.splitlines() if "E2B API access" in line]
    assert len(lines) == 1, text
    return lines[0]


def terminal(home, extra_env=None) -> dict:
    """One command through Hermes' terminal tool; the tool's JSON answer."""
    return run(home, """
        finish(T("echo hi"))
    """, extra_env=extra_env)


def assert_actionable(result: dict, operation: str, hint: str) -> str:
    """Hermes' degraded answer: the reason names `operation` once, the retry hint is ours."""
    assert result["status"] == "degraded", result
    reason, retry_hint = result["reason"], result["retry_hint"]
    assert reason.count(operation) == 1, reason
    assert "Hint" not in reason, "the hint is Hermes' retry_hint, said once"
    assert hint in retry_hint, retry_hint
    assert_no_key(json.dumps(result))
    return reason


def test_doctor_says_the_key_is_accepted(profile, e2b_local):
    # contract: O6
    rows = hermes_doctor(profile)
    line = access_line(rows)
    assert f"the key is accepted by {e2b_local.api_url}" in line, rows
    assert "✗" not in line, line
    cli = e2b_doctor(profile)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert access_line(cli.stdout).startswith(f"ok    E2B API access: the key is accepted by {e2b_local.api_url} ("), cli.stdout
    print("hermes doctor (E2B rows):\n" + rows + "\n\nhermes e2b doctor:\n" + cli.stdout)


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key(profile, e2b_local, status):
    # contract: O5, O6
    refuse(e2b_local, status, "Invalid API key, please visit https://e2b.dev/docs/api-key")
    result = terminal(profile)
    reason = assert_actionable(result, "list sandboxes", "check E2B_API_KEY in this profile's .env")
    assert f"HTTP {status}" in reason and "`hermes e2b doctor`" in result["retry_hint"]

    rows = hermes_doctor(profile)
    line = access_line(rows)
    assert "✗" in line and f"HTTP {status}" in line, rows
    assert line.count("list sandboxes") == 1 and line.count("Hint: ") == 1, line
    assert "check E2B_API_KEY" in line, line
    cli = e2b_doctor(profile)
    assert cli.returncode == 1
    line = access_line(cli.stdout)
    assert line.startswith("FAIL  E2B API access: E2B list sandboxes failed: HTTP") and "Hint: E2B refused the API key" in line
    print(f"hermes doctor (E2B rows), HTTP {status}:\n" + rows + "\n\nhermes e2b doctor:\n" + cli.stdout)


def limits(server, body=None) -> dict:
    """e2b-local's limit of concurrently running sandboxes (GET, or POST `body`)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.api_url}/_e2b_local/limits", data=data,
                                     method="GET" if body is None else "POST",
                                     headers={"X-API-Key": "e2b_test_listing", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_the_concurrency_limit_says_how_many_run_and_what_to_do(profile, e2b_local):
    # contract: O5, L14
    tag = uuid.uuid4().hex
    profile.write_config(settings=e2b_local.settings(metadata={"test": tag}, slot_wait_seconds=2),
                         terminal={"timeout": 60, "container_persistent": False})
    # e2b-local's account limit at 0: every create is refused with E2B's own answer, and
    # this process has no sandbox of its own to pause, so the command waits its 2 s.
    limits(e2b_local, {"maxRunning": 0})
    try:
        result = terminal(profile, extra_env={"TERMINAL_CONTAINER_PERSISTENT": "false"})
    finally:
        limits(e2b_local, {"maxRunning": None})
    reason = assert_actionable(result, "E2B create failed", "the plugin pauses this process's idle sandboxes")
    assert "limit of concurrently running sandboxes is reached (" in reason and " running now)" in reason, reason
    assert "0 other sandbox(es) of this process run" in reason and "waited 2 s for a slot" in reason, reason
    assert "HTTP 429: you have reached the maximum number of concurrent E2B sandboxes (0)" in reason, reason
    assert "`max_running`" in result["retry_hint"] and "`slot_wait_seconds`" in result["retry_hint"]


def test_a_template_that_does_not_exist(profile, e2b_local):
    # contract: O5 — e2b-local answers 404 for an unknown template as E2B does.
    profile.write_config(settings=e2b_local.settings(template="no-such-template"), terminal={"timeout": 60})
    result = terminal(profile)
    reason = assert_actionable(result, "E2B create failed", "the `template` setting")
    assert "HTTP 404: template 'no-such-template' not found" in reason, reason
    # `hermes e2b doctor --live` stops at its create step, which carries the same one hint.
    live = profile.hermes("e2b", "doctor", "--live")
    assert live.returncode == 1, live.stdout + live.stderr
    (create,) = [line for line in live.stdout.splitlines() if line.startswith("FAIL  E2B live: create")]
    assert "HTTP 404: template 'no-such-template' not found" in create, create
    assert create.count("Hint: ") == 1 and "the `template` setting" in create, create
    assert_no_key(live.stdout, live.stderr)


def test_an_unreachable_endpoint_is_named(home):
    # contract: O5, O6
    url = closed_port_url()
    home.write_config(settings={"api_url": url, "sandbox_url": url}, terminal={"timeout": 60})
    home.write_key()
    result = terminal(home)
    reason = assert_actionable(result, "list sandboxes", f"{url} could not be reached")
    assert f"could not connect ({url})" in reason, reason

    rows = hermes_doctor(home)
    line = access_line(rows)
    assert "✗" in line and f"{url} could not be reached" in line, rows
    cli = e2b_doctor(home)
    assert cli.returncode == 1
    assert access_line(cli.stdout).startswith("FAIL  E2B API access: E2B list sandboxes failed: could not connect")
    print("hermes doctor (E2B rows), unreachable:\n" + rows + "\n\nhermes e2b doctor:\n" + cli.stdout)


@pytest.fixture
def untrusted_tls_server():
    """An HTTPS server on loopback whose certificate no trusted CA signed (e2b-client's
    tls_trust fixtures); every handshake fails at the client."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS_FIXTURES / "server.pem", TLS_FIXTURES / "server-key.pem")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(connection, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()
    thread.join(timeout=10)


def test_an_untrusted_certificate_is_told_from_an_unreachable_host(home, untrusted_tls_server):
    # contract: O6
    url = untrusted_tls_server
    home.write_config(settings={"api_url": url, "sandbox_url": url}, terminal={"timeout": 60})
    home.write_key()
    # No extra CA: SSL_CERT_FILE is not set for the child.
    rows = hermes_doctor(home, extra_env={"SSL_CERT_DIR": str(Path(home.path) / "no-certs")})
    line = access_line(rows)
    assert "✗" in line and f"the TLS certificate of {url} is not trusted" in line, rows
    assert "could not be reached" not in line, line
    result = terminal(home)
    assert_actionable(result, "list sandboxes", "SSL_CERT_FILE")


def test_a_slow_endpoint_names_the_deadline(profile, e2b_local):
    # contract: O6 — the doctor's check gives up at its own short deadline, and says which.
    admin(e2b_local, "faults/latency", {"ms": 7000})
    try:
        rows = hermes_doctor(profile)
    finally:
        admin(e2b_local, "faults/latency", {"ms": 0})
    line = access_line(rows)
    assert "✗" in line and "deadline exceeded after 5.000s" in line, rows
    assert "within the 5 s request deadline" in line, line
