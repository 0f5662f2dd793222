"""Credentials the sandbox never holds, through a real Hermes against e2b-local (contracts X16,
X17): with ``credentials`` set and the values in the profile's ``.env``, the agent's
``printenv``, every process's environ and a search of the sandbox's files show only the
stand-in, while the sandbox's E2B network rules (read back from e2b-local) carry the real
header for the listed hosts only; the CLI, the doctor and errors never print a value, though
E2B's detail hands the rules back.

Values are shaped like no known secret, so only the mechanism under test can keep them out
(Hermes' own redaction of secret-shaped text would hide a leak of a ``ghp_`` token)."""

from __future__ import annotations

import json
import urllib.request
import uuid

from conftest import assert_no_key
from test_cli import e2b
from test_environment import run

GITHUB_VALUE = "plaingithubvalue5c81"
OPENAI_VALUE = "plainopenaivalue93d2"
#: A provider key Hermes strips from a sandbox's environment that no credential names: it must
#: stay stripped.
ANTHROPIC_VALUE = "plainanthropicvalue7e44"
VALUES = (GITHUB_VALUE, OPENAI_VALUE, ANTHROPIC_VALUE)

CREDENTIALS = {
    "GITHUB_TOKEN": {"hosts": ["api.github.com"]},
    # A provider key Hermes strips: its stand-in must still reach the sandbox.
    "OPENAI_API_KEY": {"hosts": ["api.openai.com"], "header": "x-api-key", "format": "{value}"},
}


def profile(home, e2b_local, **settings):
    home.write_config(settings=e2b_local.settings(metadata={"test": uuid.uuid4().hex}, **settings),
                      terminal={"timeout": 60})
    home.write_key()
    with open(home.path / ".env", "a", encoding="utf-8") as env:
        env.write(f"GITHUB_TOKEN={GITHUB_VALUE}\nOPENAI_API_KEY={OPENAI_VALUE}\n"
                  f"ANTHROPIC_API_KEY={ANTHROPIC_VALUE}\n")


def no_value(*texts: str) -> None:
    for text in texts:
        for value in VALUES:
            assert value not in text, text


def pattern(value: str) -> str:
    """A grep pattern matching ``value`` whose own text does not hold it."""
    return f"{value[:5]}[{value[5]}]{value[6:]}"


def network_of(e2b_local, sandbox_id: str) -> dict:
    """What e2b-local's detail says the sandbox's network is (rules verbatim, as E2B)."""
    request = urllib.request.Request(f"{e2b_local.api_url}/sandboxes/{sandbox_id}",
                                     headers={"X-API-Key": "e2b_test_detail"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read()).get("network") or {}


# contract: X16
def test_the_sandbox_sees_only_stand_ins_and_its_rules_carry_the_real_headers(home, e2b_local):
    profile(home, e2b_local, credentials=CREDENTIALS)
    result = run(home, """
        r = {}
        r["env"] = T("printenv GITHUB_TOKEN; printenv OPENAI_API_KEY; "
                     "printenv ANTHROPIC_API_KEY || echo no-anthropic", task_id="default")
        r["proc"] = T("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\\\0' '\\\\n' | "
                      "grep -E '^(GITHUB_TOKEN|OPENAI_API_KEY|ANTHROPIC_API_KEY)=' | sort -u; "
                      "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\\\0' ' '", task_id="default")
        # A file the agent writes from its environment, then a search of the sandbox's files
        # (the patterns are written so that no command line holds a value).
        r["files"] = T("env > $HOME/env-dump.txt; "
                       "grep -rIl -e '" + %r + "' -e '" + %r + "' $HOME /tmp /etc 2>/dev/null; "
                       "grep -c e2b-stand-in- $HOME/env-dump.txt", task_id="default")
        r["sid"] = T("echo $E2B_SANDBOX_ID", task_id="default")["output"].strip()
        from tools.terminal_tool_lifecycle import cleanup_vm
        cleanup_vm("default")
        finish(r)
    """ % (pattern(GITHUB_VALUE), pattern(OPENAI_VALUE)))
    no_value(json.dumps(result))
    env = result["env"]["output"].split()
    assert env[0].startswith("e2b-stand-in-") and env[1].startswith("e2b-stand-in-"), result
    assert env[0] != env[1], "a stand-in per variable"
    assert env[2] == "no-anthropic", "a key Hermes strips and no credential names stays out"
    proc = result["proc"]["output"]
    assert f"GITHUB_TOKEN={env[0]}" in proc and f"OPENAI_API_KEY={env[1]}" in proc, proc
    files = result["files"]["output"].split()
    assert files == ["2"], f"no file with a value; the dump holds the two stand-ins: {files}"

    network = network_of(e2b_local, result["sid"])
    rules = network.get("rules") or {}
    assert sorted(rules) == ["api.github.com", "api.openai.com"], network
    assert rules["api.github.com"] == [{"transform": {"headers": {"Authorization": f"Bearer {GITHUB_VALUE}"}}}]
    assert rules["api.openai.com"] == [{"transform": {"headers": {"x-api-key": OPENAI_VALUE}}}]

    # The listing, the network view, the status and the doctor name no value, though
    # e2b-local's detail returns them.
    shown = e2b(home, "credentials", "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert {c["name"]: c["has_value"] for c in view["credentials"]} == {"GITHUB_TOKEN": True, "OPENAI_API_KEY": True}
    [sandbox] = [s for s in view["sandboxes"] if s["sandbox_id"] == result["sid"]]
    assert sandbox["headers"] == {"api.github.com": ["Authorization"], "api.openai.com": ["x-api-key"]}
    outputs = [shown, e2b(home, "credentials"), e2b(home, "network"), e2b(home, "network", "--json"),
               e2b(home, "status"), e2b(home, "doctor")]
    for proc in outputs:
        no_value(proc.stdout, proc.stderr)
        assert_no_key(proc.stdout, proc.stderr)
    doctor = outputs[-1].stdout
    assert "E2B credentials: GITHUB_TOKEN for api.github.com; OPENAI_API_KEY for api.openai.com" in doctor, doctor


# contract: X16
def test_a_missing_value_runs_nothing_and_says_which_variable_and_file(home, e2b_local):
    profile(home, e2b_local, credentials={"MISSING_TOKEN": {"hosts": ["api.example.test"]}})
    result = run(home, """
        r = T("echo ran", task_id="default")
        finish(r)
    """)
    assert "ran" not in result["output"], result
    text = json.dumps(result)
    assert "MISSING_TOKEN" in text and ".env" in text, result
    shown = e2b(home, "credentials")
    assert shown.returncode != 0
    assert "MISSING_TOKEN" in shown.stdout and "NO VALUE" in shown.stdout, shown.stdout
    doctor = e2b(home, "doctor")
    assert "no value for MISSING_TOKEN" in doctor.stdout, doctor.stdout


# contract: X17
def test_a_bad_credentials_setting_names_the_setting_and_the_variable(home, e2b_local):
    profile(home, e2b_local, credentials={"GITHUB_TOKEN": {"hosts": ["*.github.com"]}})
    doctor = e2b(home, "doctor")
    said = doctor.stdout + doctor.stderr
    assert doctor.returncode != 0
    assert "credentials" in said and "GITHUB_TOKEN" in said and "*.github.com" in said, said
    no_value(doctor.stdout, doctor.stderr)
