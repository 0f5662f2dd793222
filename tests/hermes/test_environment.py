"""Hermes' own tools running in an e2b-local sandbox through the plugin: terminal, file
tools, execute_code, skills sync, cleanup paths, the prompt probe. No LLM: the tool
functions are called directly, the way the agent loop calls them."""

from __future__ import annotations

import json
import textwrap
import urllib.request
import uuid

import pytest

from conftest import FAKE_KEY, assert_no_key

#: Prepended to environment drivers: load the profile's .env the way the CLI does, capture
#: every log record (checked for the key), discover plugins.
PRELUDE = """
import json, logging, io
_log = io.StringIO()
_handler = logging.StreamHandler(_log)
_handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
logging.getLogger().addHandler(_handler)
logging.getLogger().setLevel(logging.DEBUG)
from hermes_cli.env_loader import load_hermes_dotenv
load_hermes_dotenv()
from hermes_cli.plugins import discover_plugins
discover_plugins()
import tools.terminal_tool as tt
def T(command, **kwargs):
    kwargs.setdefault("task_id", "t1")
    return json.loads(tt.terminal_tool(command, **kwargs))
def finish(result):
    print("RESULT:" + json.dumps({"result": result, "log": _log.getvalue()}))
"""


def sandboxes(server, tag):
    """The sandboxes e2b-local holds for this test (by the test's metadata tag)."""
    request = urllib.request.Request(f"{server.api_url}/v2/sandboxes?state=running,paused",
                                     headers={"X-API-Key": "e2b_test_listing"})
    with urllib.request.urlopen(request, timeout=30) as response:
        listed = json.loads(response.read())
    return [s for s in listed if (s.get("metadata") or {}).get("test") == tag]


@pytest.fixture
def configured(home, e2b_local):
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), terminal={"timeout": 60})
    home.write_key()
    return home, tag


def run(home, body, **kwargs):
    out = home.driver(PRELUDE + textwrap.dedent(body), **kwargs)
    assert_no_key(out["log"], json.dumps(out["result"]))
    return out["result"]


def test_terminal_output_exit_codes_cwd_and_no_key_inside(configured, e2b_local):
    home, tag = configured
    result = run(home, """
        r = {"requirements": tt.check_terminal_requirements()}
        r["hello"] = T("echo hello; whoami")
        r["cd"] = T("mkdir -p /home/user/x && cd /home/user/x")
        r["after_cd"] = T("pwd; exit 3")
        r["opt"] = T("cd /opt")
        r["after_opt"] = T("pwd")
        r["key_inside"] = T("env | grep -c E2B_API_KEY || true")
        finish(r)
    """)
    assert result["requirements"] is True
    assert result["hello"]["output"] == "hello\nuser"
    assert result["hello"]["exit_code"] == 0
    # contract 3.6: Hermes sends "/root" after a /home/... cd; the plugin keeps the real cwd.
    assert result["after_cd"]["output"] == "/home/user/x"
    assert result["after_cd"]["exit_code"] == 3
    assert result["after_opt"]["output"] == "/opt"
    # contract X1: the key never enters the sandbox environment.
    assert result["key_inside"]["output"].strip() == "0"
    assert len(sandboxes(e2b_local, tag)) == 1


def test_timeout_kills_the_command_not_the_sandbox(configured):
    home, _ = configured
    result = run(home, """
        r = {}
        # Hermes' own background path (process registry, nohup in the sandbox).
        r["bg"] = T("sh -c 'echo $$ > /home/user/bg.pid; exec sleep 3600'", background=True)
        r["slow"] = T("sleep 30", timeout=2)
        r["bg_alive"] = T("kill -0 $(cat /home/user/bg.pid) && echo alive")
        r["next"] = T("echo still here")
        finish(r)
    """)
    assert result["slow"]["exit_code"] == 124
    assert "timed out" in result["slow"]["output"]
    # contract L6: kill by pid; the background process and the sandbox survive.
    assert result["bg_alive"]["output"] == "alive"
    assert result["next"]["output"] == "still here"


def test_large_output_is_bounded_by_hermes_collector(configured):
    home, _ = configured
    result = run(home, """
        r = T("head -c 10485760 /dev/zero | tr '\\\\0' a; echo")
        finish({"len": len(r["output"]), "total": r.get("output_total_chars"), "rc": r["exit_code"]})
    """)
    # contract O1: streamed into Hermes' bounded collector, not accumulated.
    assert result["rc"] == 0
    assert result["len"] < 200_000
    assert result["total"] >= 10 * 1024 * 1024


def test_file_tools_and_execute_code_share_the_terminal_sandbox(configured, e2b_local):
    home, tag = configured
    result = run(home, """
        from tools.file_tools import write_file_tool, read_file_tool, patch_tool
        from tools.code_execution_tool import execute_code
        r = {}
        r["write"] = json.loads(write_file_tool("/home/user/notes.txt", "alpha\\nbeta\\n", task_id="t1"))
        r["patch"] = json.loads(patch_tool(mode="replace", path="/home/user/notes.txt", old_string="beta", new_string="gamma", task_id="t1"))
        r["read"] = json.loads(read_file_tool("/home/user/notes.txt", task_id="t1"))
        r["cat"] = T("cat /home/user/notes.txt")
        r["code"] = json.loads(execute_code("print(open('/home/user/notes.txt').read().split())", task_id="t1"))
        finish(r)
    """)
    assert result["patch"]["success"] is True
    assert "gamma" in result["read"]["content"]
    assert result["cat"]["output"] == "alpha\ngamma"
    assert "['alpha', 'gamma']" in result["code"]["output"]
    assert len(sandboxes(e2b_local, tag)) == 1, "one sandbox for terminal, files and code"


def test_skill_is_pushed_on_bring_up_and_pulled_back_at_cleanup(configured):
    home, _ = configured
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("# demo v1\n")
    result = run(home, """
        from tools.terminal_tool_lifecycle import cleanup_vm
        r = {}
        r["pushed"] = T("cat /home/user/.hermes/skills/demo/SKILL.md")
        r["edit"] = T("echo '# demo v2 (edited in the sandbox)' > /home/user/.hermes/skills/demo/SKILL.md")
        cleanup_vm("default")
        finish(r)
    """)
    assert result["pushed"]["output"] == "# demo v1"
    # contract S12: the teardown pull brings the sandbox's edit back to the host.
    assert skill.read_text() == "# demo v2 (edited in the sandbox)\n"


def test_commands_and_file_writes_land_under_the_sandbox_users_real_home(home, e2b_local):
    # contract: L13 — e2b-local's `agent-home` template gives its user the home /home/agent.
    tag = uuid.uuid4().hex
    settings = e2b_local.settings(metadata={"test": tag})
    settings["template"] = "agent-home"
    home.write_config(settings=settings, terminal={"timeout": 60})
    home.write_key()
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("# demo v1\n")
    result = run(home, """
        from tools.file_tools import write_file_tool
        from tools.terminal_tool_lifecycle import cleanup_vm
        from hermes_e2b.provider import E2BProvider
        r = {}
        r["pwd"] = T("pwd; printf '%s\\\\n' \\"$HOME\\"")
        r["write"] = json.loads(write_file_tool("/home/agent/notes.txt", "alpha\\n", task_id="t1"))
        r["cat"] = T("cat notes.txt; test -e /home/user && echo user-home-exists || echo no-user-home")
        r["pushed"] = T("cat ~/.hermes/skills/demo/SKILL.md")
        r["cache_base"] = E2BProvider(None).cache_path_base
        r["edit"] = T("echo '# demo v2 (edited under /home/agent)' > ~/.hermes/skills/demo/SKILL.md")
        cleanup_vm("default")
        finish(r)
    """)
    assert result["pwd"]["output"] == "/home/agent\n/home/agent"
    assert "error" not in result["write"], result["write"]
    assert result["cat"]["output"] == "alpha\nno-user-home"
    assert result["pushed"]["output"] == "# demo v1"
    assert result["cache_base"] == "/home/agent/.hermes"
    # The teardown pull names state by its real path, and Hermes maps it back to the host.
    assert skill.read_text() == "# demo v2 (edited under /home/agent)\n"


def test_sandbox_arbitration_commits_the_push_and_keeps_its_record_outside_the_state(home, e2b_local):
    # contract: C8, C10 — with writer_arbitration: sandbox, Hermes' own sync stages into the
    # record's directory and the commit lands it; the record lives beside ~/.hermes, not in it.
    settings = e2b_local.settings(metadata={"test": uuid.uuid4().hex})
    settings["writer_arbitration"] = "sandbox"
    home.write_config(settings=settings, terminal={"timeout": 60})
    home.write_key()
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("# demo v1\n")
    result = run(home, """
        from tools.terminal_tool_lifecycle import cleanup_vm
        r = {}
        r["pushed"] = T("cat /home/user/.hermes/skills/demo/SKILL.md")
        r["record"] = T("cat /home/user/.hermes.writer/record")
        r["staging"] = T("ls -A /home/user/.hermes.writer/staging 2>/dev/null | wc -l")
        r["in_state"] = T("ls -A /home/user/.hermes | grep -c writer || true")
        r["edit"] = T("echo '# demo v2 (edited in the sandbox)' > /home/user/.hermes/skills/demo/SKILL.md")
        cleanup_vm("default")
        finish(r)
    """)
    assert result["pushed"]["output"] == "# demo v1"
    assert result["record"]["output"].startswith("v1 1 "), result["record"]
    assert result["staging"]["output"] == "0", "the commit moved the staged push into place"
    assert result["in_state"]["output"] == "0"
    # The writer still held the record at teardown, so its pull ran.
    assert skill.read_text() == "# demo v2 (edited in the sandbox)\n"


def test_persistent_cleanup_leaves_the_sandbox_and_ephemeral_kills_it(configured, e2b_local):
    home, tag = configured
    run(home, """
        from tools.terminal_tool_lifecycle import cleanup_vm, is_persistent_env
        T("echo up")
        r = {"persistent": is_persistent_env("default")}
        cleanup_vm("default")
        finish(r)
    """)
    # contract: L3, L16 — never killed; its state on the host, it is paused at close.
    assert [s["state"] for s in sandboxes(e2b_local, tag)] == ["paused"], "persistent: paused, never killed"

    tag2 = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag2}),
                      terminal={"timeout": 60, "container_persistent": False})
    result = run(home, """
        from tools.terminal_tool_lifecycle import cleanup_vm
        r = {"up": T("echo up", task_id="eph-1")}
        r["during"] = 1
        cleanup_vm("eph-1")
        finish(r)
    """, extra_env={"TERMINAL_CONTAINER_PERSISTENT": "false"})
    assert result["up"]["output"] == "up"
    assert sandboxes(e2b_local, tag2) == [], "ephemeral: killed at cleanup (L4)"


def test_prompt_probe_creates_and_kills_a_short_lived_sandbox(configured, e2b_local):
    home, tag = configured
    result = run(home, """
        from agent import prompt_builder
        finish({"probe": prompt_builder._probe_remote_backend("e2b")})
    """)
    assert result["probe"], "the probe reports the sandbox's system"
    assert sandboxes(e2b_local, tag) == [], "probe sandboxes are killed at cleanup (L11)"


def test_a_missing_key_is_a_degraded_creation_not_a_crash(home, e2b_local):
    home.write_config(settings=e2b_local.settings())
    result = run(home, """
        r = T("echo hi")
        r["requirements"] = tt.check_terminal_requirements()
        finish(r)
    """)
    assert result["requirements"] is False, "the terminal tool is not offered without a key"
    assert result["status"] == "degraded"
    assert "no E2B API key for this profile" in result["reason"]


def test_idle_reaper_pulls_state_and_leaves_the_persistent_sandbox(configured, e2b_local):
    home, tag = configured
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("v1\n")
    result = run(home, """
        from tools.terminal_tool_lifecycle import _cleanup_inactive_envs
        T("echo v2 > /home/user/.hermes/skills/demo/SKILL.md")
        for key in list(tt._last_activity):
            tt._last_activity[key] -= 10_000
        _cleanup_inactive_envs(300)
        finish({"left": sorted(tt._active_environments)})
    """)
    assert result["left"] == [], "the reaper evicted the idle environment"
    assert skill.read_text() == "v2\n", "the reaper's cleanup pulled state back (L7)"
    # contract: L16 — the reaper's cleanup leaves no running time behind: paused, not killed.
    assert [s["state"] for s in sandboxes(e2b_local, tag)] == ["paused"]


def test_atexit_pulls_state_back(configured):
    home, _ = configured
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("v1\n")
    run(home, """
        T("echo from-sandbox > /home/user/.hermes/skills/demo/SKILL.md")
        finish({})
        # the interpreter exits normally here: Hermes' atexit handler cleans up (L8)
    """)
    assert skill.read_text() == "from-sandbox\n"


def test_next_process_recovers_a_lost_pull_and_quarantines_a_conflict(configured):
    home, _ = configured
    skill = home.path / "skills" / "demo" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("host v1\n")
    first = home.python(PRELUDE + textwrap.dedent("""
        import os, sys
        T("echo sandbox-edit > /home/user/.hermes/skills/demo/SKILL.md")
        T("mkdir -p /home/user/.hermes/skills/fresh && echo made-in-sandbox > /home/user/.hermes/skills/fresh/SKILL.md")
        sys.stdout.flush()
        os._exit(0)  # a hard exit: no cleanup, no teardown pull
    """))
    assert first.returncode == 0, first.stderr
    assert skill.read_text() == "host v1\n"
    # Meanwhile the host changed its copy too: a genuine conflict.
    skill.write_text("host v2\n")
    result = run(home, """
        finish({"sandbox": T("cat /home/user/.hermes/skills/demo/SKILL.md")["output"]})
    """)
    # contract S11: a sandbox-only file is restored in place ...
    assert (home.path / "skills" / "fresh" / "SKILL.md").read_text() == "made-in-sandbox\n"
    # ... a conflicting one is parked, the host copy wins and is pushed.
    assert skill.read_text() == "host v2\n"
    parked = [p for p in (home.path / "cache" / "e2b-recovered").rglob("SKILL.md")]
    assert [p.read_text() for p in parked] == ["sandbox-edit\n"]
    assert result["sandbox"] == "host v2"


def test_two_processes_on_one_profile_one_writer_one_reader(configured):
    home, _ = configured
    import subprocess, sys
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent("""
            import sys
            T("echo writer-up")
            env = tt._active_environments["default"]
            print("ROLE:" + env._native.attach()["role"], flush=True)
            sys.stdin.readline()  # hold the writer role until the test says so
        """)],
        env=home.env(), cwd=home.path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        role_line = writer.stdout.readline()
        assert role_line.strip() == "ROLE:writer", role_line
        result = run(home, """
            r = {"out": T("echo reader-ran")}
            r["role"] = tt._active_environments["default"]._native.attach()["role"]
            finish(r)
        """)
        # contracts C1, C2: one writer; a second session runs commands as a reader.
        assert result["role"] == "reader"
        assert result["out"]["output"] == "reader-ran"
    finally:
        writer.stdin.close()
        writer.wait(timeout=120)


#: Driver for the L10 test. At the moment the exception reaches the caller (first thing in the
#: `except` block) it observes the server (the sandbox's status) and the host (whether a fresh
#: handle can take the scope's writer lock: the backend's is an open-file-description lock,
#: which a record lock taken by this same process conflicts with).
L10_DRIVER = """
import fcntl, os, urllib.error, urllib.request
EXC = {exc}
TASK = {task!r}
API = os.environ["L10_API_URL"]
LATENCY_MS = 1500
T("echo up", task_id=TASK)
env = tt._active_environments[TASK]
sandbox_id = env.sandbox_id
lock_path = os.path.join(os.environ["HERMES_HOME"], "cache", "e2b", env._native.scope_digest() + ".writer.lock")

def on_server():
    request = urllib.request.Request(f"{{API}}/sandboxes/{{sandbox_id}}", headers={{"X-API-Key": "e2b_test_listing"}})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return [response.status, json.loads(response.read()).get("state")]
    except urllib.error.HTTPError as error:
        return [error.code, None]

def admin(path, body):
    request = urllib.request.Request(f"{{API}}/_e2b_local/{{path}}", data=json.dumps(body).encode(), method="POST",
                                     headers={{"X-API-Key": "e2b_test_listing", "Content-Type": "application/json"}})
    urllib.request.urlopen(request, timeout=30).close()

def writer_lock_free():
    # The writer's role is its scope's byte of the directory's writers.lock (an
    # open-file-description lock, which a record lock of this very process conflicts with).
    if not os.path.exists(lock_path):
        return "no lock file"
    byte = int(os.path.basename(lock_path)[:16], 16) >> 2
    with open(os.path.join(os.path.dirname(lock_path), "writers.lock"), "rb+") as handle:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte, os.SEEK_SET)
        except OSError:
            return False
        fcntl.lockf(handle, fcntl.LOCK_UN, 1, byte, os.SEEK_SET)
        return True

pulls = []
def interrupting_sync_back():
    pulls.append(TASK)
    raise EXC
# The teardown pull is Hermes' FileSyncManager.sync_back, called from the native pull hook.
env._hooks.manager.sync_back = interrupting_sync_back
before = {{"server": on_server(), "lock_free": writer_lock_free()}}
# Every sandbox request (not the admin ones) now waits LATENCY_MS on the server before it is
# served: a kill still in flight when the exception arrives is then still pending when the
# check below (sent with the latency cleared) is answered.
admin("faults/latency", {{"ms": LATENCY_MS}})
try:
    env.cleanup()
    at_raise = None
except BaseException as error:
    # The lock first: it is the instant check (a flock); then the server.
    at_raise = {{"lock_free": writer_lock_free()}}
    admin("faults/clear", {{}})
    at_raise.update(server=on_server(), type=type(error).__name__)
finally:
    admin("faults/clear", {{}})
try:
    again = env._native.cleanup()["repeated"]
except BaseException as error:
    again = type(error).__name__
finish({{"sandbox_id": sandbox_id, "before": before, "at_raise": at_raise, "pulls": pulls, "again": again}})
"""


@pytest.mark.parametrize("mode", ["persistent", "ephemeral"])
@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "SystemExit", "GeneratorExit"])
def test_control_exceptions_in_the_teardown_pull_surface_after_release_or_kill(home, e2b_local, mode, exc):
    # contract: L10 (held back until the mandatory release / kill is done, then raised again)
    tag = uuid.uuid4().hex
    persistent = mode == "persistent"
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}),
                      terminal={"timeout": 60, "container_persistent": persistent})
    home.write_key()
    task = "default" if persistent else "l10-eph"
    extra = {"L10_API_URL": e2b_local.api_url}
    if not persistent:
        extra["TERMINAL_CONTAINER_PERSISTENT"] = "false"
    result = run(home, L10_DRIVER.format(exc=exc, task=task), extra_env=extra)
    assert result["before"]["server"] == [200, "running"]
    at_raise = result["at_raise"]
    assert at_raise is not None, f"{exc} raised in the pull never reached the caller"
    assert at_raise["type"] == exc, "the same exception is raised again"
    if persistent:
        assert result["before"]["lock_free"] is False, "the writer holds the scope's lock until cleanup"
        assert at_raise["lock_free"] is True, "the writer lease was released before the re-raise"
        assert at_raise["server"] == [200, "running"], "a persistent sandbox is never killed (L3)"
        assert [s["sandboxID"] for s in sandboxes(e2b_local, tag)] == [result["sandbox_id"]]
    else:
        assert result["before"]["lock_free"] == "no lock file", "ephemeral sandboxes take no writer lock"
        assert at_raise["server"] == [404, None], "the ephemeral sandbox was killed before the re-raise"
        assert sandboxes(e2b_local, tag) == []
    assert result["pulls"] == [task], "the exception was raised inside the one teardown pull"
    assert result["again"] is True, "cleanup had completed: a second one is a repeat (L7)"
