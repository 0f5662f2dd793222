"""What a new user reads when the setup is wrong (contract O5, O6), through a real Hermes:
`hermes doctor`, the terminal tool and `hermes e2b`. Every message names the real cause, the
file to fix, and a next step that works everywhere (`hermes e2b doctor`; Hermes' own doctor
hides plugin rows inside containers). The profile lives outside ~/.hermes on purpose."""

from __future__ import annotations

import json
import os
import re
import subprocess

from conftest import VENV_BIN, assert_no_key
from test_cli import e2b
from test_environment import run


def doctor_rows(home):
    """The real `hermes doctor` output, and its E2B rows as (mark, name, detail)."""
    proc = home.doctor()
    assert_no_key(proc.stdout, proc.stderr)
    names = "native core|plugin|API key|settings|endpoint|API access|writer arbitration|egress policy|setting"
    rows = re.findall(rf"^\s*(✓|✗|⚠)\s+(E2B (?:{names}))\s+(.*)$", proc.stdout, re.MULTILINE)
    assert rows, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, rows


def e2b_doctor(home):
    proc = e2b(home, "doctor", "--json")
    return {row["check"]: row for row in json.loads(proc.stdout)}


# contract: O5
def test_an_empty_key_names_this_profiles_env_file_in_doctor_and_in_the_terminal_tool(home, e2b_local):
    home.write_config(settings=e2b_local.settings())
    (home.path / ".env").write_text("E2B_API_KEY=\n")
    env_file = str(home.path / ".env")
    out, rows = doctor_rows(home)
    key_row = next(detail for _, name, detail in rows if name.startswith("E2B API key"))
    assert env_file in key_row and "`hermes e2b doctor`" in key_row, key_row
    assert "~/.hermes" not in out
    # Hermes repeats a failing row in its summary with "(" and ")" stripped from both ends: no
    # line of the doctor may be left with an opening bracket it never closes.
    for line in out.splitlines():
        if env_file in line:
            assert line.count("(") == line.count(")"), line
    assert "no E2B API key" in e2b_doctor(home)["E2B API key"]["detail"]

    result = run(home, """
        finish(T("echo hi"))
    """)
    assert result["status"] == "degraded" and "traceback" not in result, result
    assert result["reason"] == f"no E2B API key for this profile: E2B_API_KEY is missing or empty in {env_file}"
    assert result["retry_hint"].startswith(f"add the line E2B_API_KEY=e2b_... to {env_file}")
    assert result["retry_hint"].endswith("then run `hermes e2b doctor`")
    # The doctor row says the same, in the same words.
    assert result["reason"] in key_row


# contract: O5, O6
def test_a_terminal_timeout_the_backend_cannot_use_is_refused_once_naming_the_setting(home, e2b_local):
    home.write_config(settings=e2b_local.settings(), terminal={"timeout": -1})
    home.write_key()
    config = str(home.path / "config.yaml")
    _, rows = doctor_rows(home)
    settings = [(mark, detail) for mark, name, detail in rows if name.startswith("E2B settings")]
    assert len(settings) == 1 and settings[0][0] == "✗", rows
    assert f"terminal.timeout in {config} is -1" in settings[0][1]
    assert "positive number of seconds" in settings[0][1]
    assert "terminal.timeout" in e2b_doctor(home)["E2B settings"]["detail"]

    result = run(home, """
        import time
        started = time.monotonic()
        r = T("echo hi")
        r["retried"] = "retrying" in _log.getvalue()
        r["seconds"] = time.monotonic() - started
        finish(r)
    """)
    assert result["status"] == "degraded" and "traceback" not in result, result
    assert result["retried"] is False, "a configuration error is not retried"
    assert result["reason"].startswith(f"Hermes setting terminal.timeout in {config} is -1: "
                                       "the E2B backend needs a positive number of seconds")
    assert "deadline must be" not in json.dumps(result)
    assert result["retry_hint"].startswith(f"fix terminal.timeout in {config}")


# contract: O5, O6
def test_an_invalid_plugin_setting_is_a_clear_error_and_has_its_own_doctor_row(home, e2b_local):
    home.write_config(settings=e2b_local.settings(lease_seconds=-5))
    home.write_key()
    config = str(home.path / "config.yaml")
    _, rows = doctor_rows(home)
    names = [name for _, name, _ in rows]
    assert not any(name.startswith("E2B endpoint") for name in names), "settings are not the endpoint"
    settings = [(mark, detail) for mark, name, detail in rows if name.startswith("E2B settings")]
    assert len(settings) == 1 and settings[0][0] == "✗", rows
    assert f"E2B setting lease_seconds (plugins.entries.e2b.settings in {config}) is invalid: must be between" in settings[0][1]

    result = run(home, """
        finish(T("echo hi"))
    """)
    assert "traceback" not in result and "Traceback" not in json.dumps(result), result
    assert result["status"] == "degraded", result
    assert result["reason"].startswith(f"E2B setting lease_seconds (plugins.entries.e2b.settings in {config}) "
                                       "is invalid: must be between")
    assert result["reason"].endswith("not -5")
    assert result["retry_hint"].startswith(f"fix plugins.entries.e2b.settings.lease_seconds in {config}")


# contract: O6
def test_doctor_tool_availability_shows_no_broken_looking_e2b_toolset(home, e2b_local):
    home.write_config(settings=e2b_local.settings())
    home.write_key()
    proc = home.doctor()
    assert "Tool Availability" in proc.stdout, proc.stdout[-3000:]
    assert not re.search(r"^\s*⚠\s+e2b\b", proc.stdout, re.MULTILINE), proc.stdout
    assert "system dependency not met" not in "".join(
        line for line in proc.stdout.splitlines() if re.search(r"\be2b\b", line))


# contract: O6
def test_hermes_e2b_says_when_there_is_nothing_and_stops_quietly_on_a_closed_pipe(home, e2b_local):
    home.write_config(settings=e2b_local.settings(metadata={"test": "nothing-here"}))
    home.write_key()
    empty = e2b(home, "list")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.strip() == "No E2B sandboxes for this profile (--all: every profile's)."

    for command in (["network"], ["list"], ["doctor"], ["status"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first byte (`| head -0`)
        try:
            proc = subprocess.run([str(VENV_BIN / "hermes"), "e2b", *command], env=home.env(), stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=120, cwd=home.path)
        finally:
            os.close(write)
        assert "Broken pipe" not in proc.stderr and "Errno 32" not in proc.stderr, (command, proc.stderr)
        assert "Traceback" not in proc.stderr, (command, proc.stderr)
        assert proc.returncode == 141, (command, proc.returncode, proc.stderr)
