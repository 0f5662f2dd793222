"""Where the plugin's settings come from besides config.yaml (issue 14, item 7): E2B's own
endpoint variables in Hermes' environment, and keys under ``plugins.entries.e2b.settings``
the plugin does not know (warned about once, and shown by ``hermes doctor``)."""

from __future__ import annotations

import json
import uuid

from conftest import assert_no_key
from test_environment import run, sandboxes


def test_e2b_endpoint_variables_alone_reach_e2b_local(home, e2b_local):
    # No endpoint settings at all: only the variables the E2B SDKs honour point at e2b-local.
    tag = uuid.uuid4().hex
    home.write_config(settings={"metadata": {"test": tag}}, terminal={"timeout": 60})
    home.write_key()
    extra = {"E2B_API_URL": e2b_local.api_url, "E2B_SANDBOX_URL": e2b_local.sandbox_url}
    result = run(home, """
        from agent.terminal_env_registry import get_provider
        r = {"hello": T("echo hello-from-env-endpoints"), "doctor": get_provider("e2b").doctor_checks()}
        finish(r)
    """, extra_env=extra)
    assert result["hello"]["output"] == "hello-from-env-endpoints"
    assert result["hello"]["exit_code"] == 0
    assert len(sandboxes(e2b_local, tag)) == 1, "the command ran in a sandbox of this e2b-local"
    endpoint = next(row for row in result["doctor"] if row[1] == "E2B endpoint")
    assert endpoint[0] is True
    assert e2b_local.api_url in endpoint[2] and "from E2B_* environment variables" in endpoint[2]


UNKNOWN_KEY_DRIVER = """
    import json, logging
    records = []
    class H(logging.Handler):
        def emit(self, r): records.append((r.name, r.levelname, r.getMessage()))
    logger = logging.getLogger("hermes_e2b"); logger.addHandler(H()); logger.setLevel(logging.INFO)
    from hermes_cli.env_loader import load_hermes_dotenv
    load_hermes_dotenv()
    from hermes_cli.plugins import discover_plugins
    discover_plugins()
    from agent.terminal_env_registry import get_provider
    p = get_provider("e2b")
    # Every entry point re-reads the settings; the warning still comes once per key.
    checks = [p.check_requirements(), p.probe(), p.check_requirements()]
    rows = p.doctor_checks() + p.doctor_checks()
    print("RESULT:" + json.dumps({"records": records, "rows": rows, "checks": checks}))
"""


def test_an_unknown_setting_is_warned_once_with_the_nearest_key(home):
    home.write_config(settings={"lease_secs": 60, "template": "base"})
    home.write_key()
    result = home.driver(UNKNOWN_KEY_DRIVER)
    warnings = [r for r in result["records"] if "lease_secs" in r[2]]
    assert len(warnings) == 1, result["records"]
    name, level, message = warnings[0]
    assert (name, level) == ("hermes_e2b", "WARNING")
    assert "did you mean lease_seconds?" in message
    # An unknown key is not fatal: the backend stays usable with the default lease.
    assert result["checks"][0] is True and result["checks"][1][0] == "ready"
    setting_rows = [row for row in result["rows"] if row[1] == "E2B settings"]
    assert setting_rows and all(row[0] is False for row in setting_rows)
    assert "lease_secs" in setting_rows[0][2] and "did you mean lease_seconds?" in setting_rows[0][2]
    assert_no_key(json.dumps(result))


def test_hermes_doctor_names_the_unknown_key_and_the_suggestion(home):
    home.write_config(settings={"lease_secs": 60})
    home.write_key()
    proc = home.doctor()
    out = proc.stdout
    line = next((l for l in out.splitlines() if "E2B setting" in l), None)
    assert line is not None, out[-3000:] + proc.stderr[-3000:]
    assert "lease_secs" in line and "did you mean lease_seconds?" in line
    assert_no_key(proc.stdout, proc.stderr)
