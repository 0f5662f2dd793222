"""What Hermes hears after a fault it or the plugin recovered from (issue 14, item 7): a
teardown pull that failed once and succeeded on Hermes' own retry is reported as pulled and
logs nothing; a sandbox that was gone and got replaced reaches Hermes' `_mark_recreated()`
once. Real Hermes, real e2b-local, faults injected through e2b-local's admin routes."""

from __future__ import annotations

import textwrap

from test_environment import configured, run  # noqa: F401 - the fixture is used by name

#: Prepended to the drivers below: e2b-local's admin routes.
ADMIN = """
import os, urllib.request
API = os.environ["E2B_LOCAL_API_URL"]
def admin(path, body):
    request = urllib.request.Request(f"{API}/_e2b_local/{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"X-API-Key": "e2b_test_listing", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
def requests():
    request = urllib.request.Request(f"{API}/_e2b_local/requests", headers={"X-API-Key": "e2b_test_listing"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())
"""


def records(log, logger, levels):
    """The captured log lines of `logger` at one of `levels` (PRELUDE's format)."""
    found = []
    for line in log.splitlines():
        name, _, rest = line.partition(" ")
        if name == logger and rest.split(" ", 1)[0] in levels:
            found.append(line)
    return found


def test_a_teardown_pull_retried_by_hermes_after_a_failure_is_reported_pulled_and_logs_no_error(configured, e2b_local):
    # contract: S12 (the pull Hermes' FileSyncManager retried delivered the state; only the
    # final outcome is reported)
    home, _ = configured
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("v1\n")
    result = run(home, ADMIN + textwrap.dedent("""
        T("echo v2 > /home/user/.hermes/skills/demo/SKILL.md")
        env = tt._active_environments["default"]
        starts_before = requests()["routes"].get("Process/Start", 0)
        # The teardown pull begins with the command that makes the tar: its first Start fails.
        admin("faults/fail", {"count": 1, "status": 503, "scope": "envd", "pathPrefix": "/process.Process/Start"})
        mark = len(_log.getvalue())
        try:
            report = env._native.cleanup()
        finally:
            admin("faults/clear", {})
        starts = requests()["routes"].get("Process/Start", 0) - starts_before
        finish({"report": report, "starts": starts, "cleanup_log": _log.getvalue()[mark:]})
    """), extra_env={"E2B_LOCAL_API_URL": e2b_local.api_url})
    log = result["cleanup_log"]
    retried = records(log, "tools.environments.file_sync", {"WARNING"})
    assert any("attempt 1 failed" in line for line in retried), f"Hermes did not retry the pull:\n{log}"
    assert result["starts"] >= 2, "the failed Start and the retry's Start both reached the server"
    assert result["report"]["pull"] == "pulled", result["report"]
    assert result["report"]["pull_error"] is None
    assert skill.read_text() == "v2\n", "the retried pull brought the sandbox's edit back"
    complaints = records(log, "hermes_e2b", {"WARNING", "ERROR", "CRITICAL"})
    assert complaints == [], "the first attempt's failure was still reported:\n" + "\n".join(complaints)


def test_a_replaced_sandbox_marks_the_environment_recreated_once(configured, e2b_local):
    # contract: L1 (a gone sandbox is let go and the next use attaches afresh; Hermes is told)
    home, tag = configured
    result = run(home, ADMIN + textwrap.dedent("""
        T("echo up")
        env = tt._active_environments["default"]
        marks = []
        hermes_mark = env._mark_recreated
        def counting_mark():
            marks.append(env._native.sandbox_id)
            hermes_mark()
        env._mark_recreated = counting_mark
        first = env.sandbox_id
        r = {"first": first, "steady": T("echo steady"), "marks_before": list(marks)}
        admin(f"sandboxes/{first}/vanish", {})
        # The first use after the vanish finds the sandbox gone and attaches a new one.
        r["first_after"] = T("echo after-the-vanish")
        r["next"] = T("echo again")
        r["second"] = env.sandbox_id
        r["marks"] = marks
        finish(r)
    """), extra_env={"E2B_LOCAL_API_URL": e2b_local.api_url})
    assert result["marks_before"] == [], "no replacement, no notice"
    assert "environment_recreated" not in result["steady"]
    assert result["second"] != result["first"], "the gone sandbox was replaced"
    assert result["marks"] == [result["second"]], "Hermes' _mark_recreated ran exactly once, for the new sandbox"
    # Hermes folds the flag into the result of the command served by the new sandbox, once.
    assert result["first_after"]["output"] == "after-the-vanish"
    assert result["first_after"].get("environment_recreated"), result["first_after"]
    assert "environment_recreated" not in result["next"], "the notice is given once"


def test_a_replaced_sandbox_gets_the_hosts_state_again(configured, e2b_local):
    # contract: S2 (a bring-up pushes the state in full). Hermes' FileSyncManager diffs by mtime
    # against what it pushed before; without forgetting that, the replacement got nothing.
    # Found by the campaign: `scripts/campaign --seed 2 --cycles 30 --hermes-python ... --hermes-share 1`.
    home, _ = configured
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("host v1\n")
    result = run(home, ADMIN + textwrap.dedent("""
        r = {"before": T("cat ~/.hermes/skills/demo/SKILL.md")}
        env = tt._active_environments["default"]
        first = env.sandbox_id
        admin(f"sandboxes/{first}/vanish", {})
        r["after"] = T("cat ~/.hermes/skills/demo/SKILL.md || echo NOSTATE")
        r["replaced"] = env.sandbox_id != first
        finish(r)
    """), extra_env={"E2B_LOCAL_API_URL": e2b_local.api_url})
    assert result["before"]["output"] == "host v1"
    assert result["replaced"] is True
    assert result["after"]["output"] == "host v1", result["after"]
