"""The egress policy through a real Hermes against e2b-local (contracts X9, X10): a denied
destination fails from the terminal tool, an allowed one works, and a change made while
Hermes runs (`hermes e2b network`, or config.yaml edited) holds from its next command.

Destinations are listeners this test starts on 127.0.0.2 and 127.0.0.3 (127.0.0.1 is the
sandbox's own loopback); nothing else is ever contacted."""

from __future__ import annotations

import json
import socket
import threading
import uuid

import pytest

from conftest import assert_no_key, load_yaml
from test_cli import e2b
from test_environment import PRELUDE, run


class Destination:
    """A listener on a loopback address counting connections that delivered bytes."""

    def __init__(self, ip: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((ip, 0))
        self.sock.listen(16)
        self.ip, self.port = self.sock.getsockname()
        self.reached = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    if conn.recv(16):
                        with self._lock:
                            self.reached += 1
                except OSError:
                    pass

    def probe(self) -> str:
        """A terminal command that connects, sends a line and says `opened`."""
        return (f"exec 3<>/dev/tcp/{self.ip}/{self.port} && echo ping >&3 && exec 3>&- "
                f"&& echo opened")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def destinations():
    denied, allowed = Destination("127.0.0.2"), Destination("127.0.0.3")
    yield denied, allowed
    denied.close()
    allowed.close()


def profile(home, e2b_local, **settings):
    home.write_config(settings=e2b_local.settings(metadata={"test": uuid.uuid4().hex}, **settings),
                      terminal={"timeout": 60})
    home.write_key()


# contract: X9
def test_a_denied_destination_fails_from_the_terminal_tool_and_an_allowed_one_works(home, e2b_local, destinations):
    denied, allowed = destinations
    # Allow beats deny: 127.0.0.2/31 covers both listeners, 127.0.0.3 is allowed back.
    profile(home, e2b_local, deny_out=["127.0.0.2/31"], allow_out=[allowed.ip])
    result = run(home, f"""
        r = {{"denied": T({denied.probe()!r}, task_id="default"),
              "allowed": T({allowed.probe()!r}, task_id="default")}}
        from tools.terminal_tool_lifecycle import cleanup_vm
        cleanup_vm("default")
        finish(r)
    """)
    assert result["denied"]["exit_code"] != 0, result
    assert "opened" not in result["denied"]["output"]
    assert result["allowed"]["exit_code"] == 0, result
    assert "opened" in result["allowed"]["output"]
    assert denied.reached == 0
    assert allowed.reached == 1


# contract: X10
def test_a_change_holds_from_the_next_command_without_restarting_hermes(home, e2b_local, destinations):
    denied, _ = destinations
    profile(home, e2b_local)
    config = home.path / "config.yaml"
    result = run(home, f"""
        import subprocess, json as _json, os, urllib.request
        def rules():
            # What e2b-local reports the sandbox has (the update itself, enforcement aside).
            sid = T("echo $E2B_SANDBOX_ID", task_id="default")["output"].strip()
            req = urllib.request.Request({e2b_local.api_url!r} + "/sandboxes/" + sid,
                                         headers={{"X-API-Key": "e2b_test_rules"}})
            with urllib.request.urlopen(req, timeout=30) as resp:
                network = _json.loads(resp.read()).get("network") or {{}}
            return network.get("denyOut") or []
        r = {{}}
        r["before"] = T({denied.probe()!r}, task_id="default")
        # `hermes e2b network` from another process while this Hermes runs.
        cli = subprocess.run(["hermes", "e2b", "network", "--deny", {denied.ip!r}], capture_output=True, text=True)
        r["cli"] = [cli.returncode, cli.stdout, cli.stderr]
        r["after_cli"] = T({denied.probe()!r}, task_id="default")
        r["rules_after_cli"] = rules()
        # config.yaml edited (Hermes' own config writer): the list emptied again.
        from hermes_cli.plugins_state import save_plugin_setting
        save_plugin_setting("e2b", ("deny_out",), [])
        r["after_edit"] = T({denied.probe()!r}, task_id="default")
        r["rules_after_edit"] = rules()
        # Narrowed again by an edit alone: this Hermes updates the sandbox before the command.
        save_plugin_setting("e2b", ("deny_out",), [{denied.ip!r}])
        r["after_narrowing_edit"] = T({denied.probe()!r}, task_id="default")
        from tools.terminal_tool_lifecycle import cleanup_vm
        cleanup_vm("default")
        finish(r)
    """)
    assert result["before"]["exit_code"] == 0 and "opened" in result["before"]["output"], result
    code, out, err = result["cli"]
    assert code == 0, (out, err)
    assert "updated now to the profile's policy" in out, out
    # The running Hermes re-read the edited settings and updated the sandbox itself.
    assert result["rules_after_cli"] == [denied.ip], result
    assert result["rules_after_edit"] == [], result
    assert result["after_cli"]["exit_code"] != 0, result
    assert "opened" not in result["after_cli"]["output"]
    assert result["after_edit"]["exit_code"] == 0 and "opened" in result["after_edit"]["output"], result
    assert result["after_narrowing_edit"]["exit_code"] != 0, result
    assert "opened" not in result["after_narrowing_edit"]["output"]
    assert denied.reached == 2
    saved = load_yaml(config)["plugins"]["entries"]["e2b"]["settings"]
    assert saved["deny_out"] == [denied.ip]


# contract: X9
def test_network_command_shows_validates_and_doctor_shows_the_policy(home, e2b_local):
    profile(home, e2b_local, allow_out=["PyPI.org"], deny_out="0.0.0.0/0")
    shown = e2b(home, "network", "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["allow_out"] == ["pypi.org"]
    assert view["deny_out"] == ["0.0.0.0/0"]
    assert view["sandboxes"] == []

    refused = e2b(home, "network", "--deny", "example.com")
    assert refused.returncode == 1
    assert "deny_out" in refused.stderr and "example.com" in refused.stderr, refused.stderr
    # Nothing was written.
    assert load_yaml(home.path / "config.yaml")["plugins"]["entries"]["e2b"]["settings"]["deny_out"] == "0.0.0.0/0"

    changed = e2b(home, "network", "--clear", "--allow", "10.0.0.0/8")
    assert changed.returncode == 0, changed.stderr
    assert "Profile policy: allow 10.0.0.0/8" in changed.stdout, changed.stdout

    doctor = e2b(home, "doctor")
    assert "E2B egress policy: allow 10.0.0.0/8" in doctor.stdout, doctor.stdout
    assert_no_key(doctor.stdout, doctor.stderr)
