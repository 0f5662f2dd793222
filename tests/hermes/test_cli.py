"""`hermes e2b` (status, list, rm, pull, doctor) through a real `hermes` process against
e2b-local: its argv, its exit code, its output. Sessions that make sandboxes are Hermes'
own terminal tool in a driver subprocess, as in test_environment.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import FAKE_KEY, NETWORK_GUARD, assert_no_key
from test_environment import PRELUDE


def rest(server, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.api_url}{path}", data=data, method=method,
                                     headers={"X-API-Key": "e2b_test_listing", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def tagged(server, tag):
    listed = rest(server, "GET", "/v2/sandboxes?state=running,paused")
    return [s for s in listed if (s.get("metadata") or {}).get("test") == tag]


def e2b(home, *args, extra_env=None):
    """`hermes e2b ARGS` in the profile; the key appears in neither stream (X1)."""
    proc = home.hermes("e2b", *args, extra_env=extra_env)
    assert_no_key(proc.stdout, proc.stderr)
    return proc


def logs_hold_no_key(home):
    """Hermes' log files of the profile (agent.log, errors.log) never hold the key (X1)."""
    logs = list(Path(home.path).rglob("*.log"))
    assert logs, "Hermes wrote no log file to check"
    for path in logs:
        assert FAKE_KEY not in path.read_text(errors="replace"), path


class Session:
    """A Hermes process whose terminal tool attached (the writer on this host) and holds on
    until stopped; `sandbox_id` is what the sandbox says its id is."""

    def __init__(self, home, command="true", chat=None):
        # `chat`: the command runs in that gateway chat's session context (Hermes'
        # HERMES_SESSION_KEY), so each chat has a scope, and a sandbox, of its own.
        script = NETWORK_GUARD + PRELUDE + textwrap.dedent(f"""
            import sys
            from gateway.session_context import clear_session_vars, set_session_vars
            import tools.terminal_tool as terminal
            from tools.terminal_tool_lifecycle import cleanup_vm
            chat = {chat!r}
            tokens = chat and set_session_vars(platform="telegram", chat_id=chat,
                                               session_key=f"agent:main:telegram:dm:{{chat}}")
            r = T({command!r} + "; echo SANDBOX=$E2B_SANDBOX_ID")
            print("READY " + json.dumps(r), flush=True)
            sys.stdin.read()
            if chat:
                for key in list(terminal._active_environments):
                    cleanup_vm(key)
                clear_session_vars(tokens)
            else:
                cleanup_vm("default")
        """)
        self.proc = subprocess.Popen([sys.executable, "-c", script], env=home.env(), cwd=home.path,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise AssertionError(f"session did not start: {line!r} {self.proc.stderr.read()}")
        output = json.loads(line[len("READY "):])["output"]
        self.sandbox_id = output.rsplit("SANDBOX=", 1)[1].strip()

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)

    def crash(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def profile(home, e2b_local):
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), terminal={"timeout": 60})
    home.write_key()
    return home, tag


# contract: I7
def test_status_and_list_show_this_profiles_sandbox(profile, e2b_local, tmp_path):
    home, tag = profile
    session = Session(home)
    session.stop()

    status = e2b(home, "status")
    assert status.returncode == 0, status.stderr
    assert session.sandbox_id in status.stdout
    assert "template base, persistent, internet-allowed secure" in status.stdout
    assert "writer free; clean; prepared" in status.stdout
    assert "last recovery:" in status.stdout and "none recorded" not in status.stdout.split("last recovery:")[1].splitlines()[0]

    listed = json.loads(e2b(home, "list", "--json").stdout)
    assert [entry["sandbox_id"] for entry in listed] == [session.sandbox_id]
    entry = listed[0]
    assert entry["owner"] == "this-profile" and entry["host"]["writer"] == "free"
    assert entry["host"]["task_id"]

    # Another profile sees nothing of this one's unless it asks for --all, and then marked.
    other = type(home)(tmp_path / "other-home")
    other.write_config(settings=e2b_local.settings(metadata={"test": tag}))
    other.write_key()
    assert json.loads(e2b(other, "list", "--json").stdout) == []
    everything = json.loads(e2b(other, "list", "--all", "--json").stdout)
    assert {e["sandbox_id"]: e["owner"] for e in everything}[session.sandbox_id] == "other-profile"
    line = e2b(other, "list", "--all").stdout
    assert f"{session.sandbox_id}" in line and "[other-profile" in line
    refused = e2b(other, "rm", session.sandbox_id, "--yes", "--force")
    assert refused.returncode == 1 and "another profile owns it" in refused.stdout
    assert len(tagged(e2b_local, tag)) == 1
    logs_hold_no_key(home)


# contract: I8
def test_rm_duplicates_keeps_the_newest(profile, e2b_local):
    home, tag = profile
    session = Session(home)
    session.stop()
    (first,) = tagged(e2b_local, tag)
    for _ in range(2):
        rest(e2b_local, "POST", "/sandboxes", {"templateID": "base", "metadata": first["metadata"], "timeout": 600})
    sandboxes = tagged(e2b_local, tag)
    assert len(sandboxes) == 3
    newest = max(sandboxes, key=lambda s: (s["startedAt"], s["sandboxID"]))["sandboxID"]

    status = e2b(home, "status").stdout
    assert status.count("DUPLICATE: sessions use " + newest) == 2

    unconfirmed = e2b(home, "rm", "--duplicates")
    assert unconfirmed.returncode == 2
    assert "This kills, for good:" in unconfirmed.stdout and f"sessions use {newest}" in unconfirmed.stdout
    assert len(tagged(e2b_local, tag)) == 3, "nothing killed without --yes"

    done = e2b(home, "rm", "--duplicates", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": killed") == 2
    assert [s["sandboxID"] for s in tagged(e2b_local, tag)] == [newest]
    again = e2b(home, "rm", "--duplicates", "--yes")
    assert again.returncode == 0 and "Nothing to remove." in again.stdout


# contract: I8
def test_rm_paused_selects_by_age_and_task_and_a_dry_run_kills_nothing(profile, e2b_local):
    home, tag = profile
    for chat in ("1", "2"):
        Session(home, chat=chat).stop()
    listed = json.loads(e2b(home, "list", "--json").stdout)
    assert [e["state"] for e in listed] == ["paused", "paused"], listed
    (task_1, id_1), (task_2, id_2) = sorted((e["host"]["task_id"], e["sandbox_id"]) for e in listed)

    dry = e2b(home, "rm", "--paused", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("Would kill, for good (--dry-run: nothing killed):"), dry.stdout
    for task, sandbox in ((task_1, id_1), (task_2, id_2)):
        assert f"  {sandbox} ({task}, last use " in dry.stdout, dry.stdout
    assert len(tagged(e2b_local, tag)) == 2, "a dry run kills nothing"

    # Paused a moment ago: a day's age takes neither, with or without --dry-run.
    assert json.loads(e2b(home, "rm", "--paused", "--older-than", "1d", "--dry-run", "--json").stdout) == []
    aged = e2b(home, "rm", "--paused", "--older-than", "1d", "--yes")
    assert aged.returncode == 0 and aged.stdout.strip() == "Nothing to remove.", aged.stdout
    assert len(tagged(e2b_local, tag)) == 2

    planned = json.loads(e2b(home, "rm", "--paused", "--task", task_2, "--dry-run", "--json").stdout)
    assert [(p["sandbox_id"], p["action"]) for p in planned] == [(id_2, "kill")], planned
    unconfirmed = e2b(home, "rm", "--paused", "--task", task_2)
    assert unconfirmed.returncode == 2 and "This kills, for good:" in unconfirmed.stdout
    assert id_2 in unconfirmed.stdout and id_1 not in unconfirmed.stdout
    done = e2b(home, "rm", "--paused", "--task", task_2, "--yes")
    assert done.returncode == 0 and done.stdout.strip() == f"{id_2}: killed", done.stdout
    assert [s["sandboxID"] for s in tagged(e2b_local, tag)] == [id_1]

    wrong = e2b(home, "rm", "--paused", "--older-than", "soon")
    assert wrong.returncode == 1 and "is not a duration" in wrong.stderr, wrong.stderr
    mixed = e2b(home, "rm", "--duplicates", "--older-than", "1d")
    assert mixed.returncode == 2 and "add --paused" in mixed.stderr, mixed.stderr
    assert [s["sandboxID"] for s in tagged(e2b_local, tag)] == [id_1]


# contract: I8
def test_rm_of_a_sandbox_a_live_writer_holds_is_refused(profile, e2b_local):
    home, tag = profile
    session = Session(home)
    try:
        status = e2b(home, "status").stdout
        assert f"writer held by pid {session.proc.pid}" in status
        refused = e2b(home, "rm", session.sandbox_id, "--yes")
        assert refused.returncode == 1
        assert f"{session.sandbox_id}: refused: a live session on this host (pid {session.proc.pid})" in refused.stdout
        assert len(tagged(e2b_local, tag)) == 1
    finally:
        session.stop()
    removed = e2b(home, "rm", session.sandbox_id, "--yes", "--json")
    assert removed.returncode == 0
    assert json.loads(removed.stdout) == [{"sandbox_id": session.sandbox_id, "outcome": "killed", "detail": None}]
    assert tagged(e2b_local, tag) == []
    gone = e2b(home, "rm", session.sandbox_id, "--yes")
    assert gone.returncode == 0 and f"{session.sandbox_id}: already gone" in gone.stdout
    logs_hold_no_key(home)


# contract: I8
def test_pull_recovers_what_a_crashed_session_left(profile, e2b_local):
    home, _ = profile
    session = Session(home, "mkdir -p ~/.hermes/skills/left && echo remote > ~/.hermes/skills/left/SKILL.md")
    task = json.loads(e2b(home, "list", "--json").stdout)[0]["host"]["task_id"]
    busy = e2b(home, "pull", "--task", task)
    assert busy.returncode == 1 and f"pid {session.proc.pid}" in busy.stderr
    session.crash()  # no teardown pull: the skill is only in the sandbox
    skill = Path(home.path) / "skills" / "left" / "SKILL.md"
    assert not skill.exists()
    pulled = e2b(home, "pull", "--task", task, "--json")
    assert pulled.returncode == 0, pulled.stderr
    assert json.loads(pulled.stdout)["restored"] == 1
    assert skill.read_text() == "remote\n"
    missing = e2b(home, "pull", "--task", "no-such-task")
    assert missing.returncode == 1 and "this scope has no sandbox" in missing.stderr


def test_doctor_rows_inside_a_simulated_container(profile, e2b_local):
    home, tag = profile
    container = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    rows = json.loads(e2b(home, "doctor", "--json", extra_env=container).stdout)
    by_check = {row["check"]: row for row in rows}
    assert by_check["E2B API key"]["ok"] is True
    assert by_check["E2B endpoint"]["ok"] is True and e2b_local.api_url in by_check["E2B endpoint"]["detail"]
    assert by_check["E2B host locking"]["ok"] is True
    live = e2b(home, "doctor", "--live", extra_env=container)
    assert live.returncode == 0, live.stdout + live.stderr
    for step in ("create", "check template", "kill"):
        assert f"ok    E2B live: {step}: " in live.stdout
    assert tagged(e2b_local, tag) == [], "the probe sandbox is gone"

    home.write_key("")
    missing = e2b(home, "doctor", extra_env=container)
    assert missing.returncode == 1 and "FAIL  E2B API key" in missing.stdout
    logs_hold_no_key(home)


#: The state the progress test pulls: large enough that a pull takes visible time.
BIG_MIB = 200


def run_on_pty(home, *args, timeout=300):
    """`hermes ARGS` with a pseudo-terminal as stdout and stderr; returns (rc, output)."""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "hermes"), *args], env=home.env(), cwd=home.path,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    rc = proc.wait(timeout=30)
    return rc, b"".join(chunks).decode(errors="replace")


def test_pull_of_a_large_state_shows_progress_on_a_terminal_only(profile, e2b_local):
    home, _ = profile
    session = Session(home, f"mkdir -p ~/.hermes/skills/big && head -c {BIG_MIB}M /dev/urandom > ~/.hermes/skills/big/blob.bin")
    task = json.loads(e2b(home, "list", "--json").stdout)[0]["host"]["task_id"]
    session.crash()

    rc, shown = run_on_pty(home, "e2b", "pull", "--task", task)
    assert rc == 0, shown
    assert "E2B state recovery" in shown and "MiB" in shown, shown
    # The bar counts the snapshot's bytes up to (a little over: tar headers) the whole state.
    shown_mib = [float(m) for m in re.findall(r"([0-9]+\.[0-9]) MiB", shown)]
    assert max(shown_mib) >= BIG_MIB, shown
    assert "1 restored" in shown
    assert (Path(home.path) / "skills" / "big" / "blob.bin").stat().st_size == BIG_MIB << 20

    piped = e2b(home, "pull", "--task", task)
    assert piped.returncode == 0
    assert piped.stdout.strip() == f"Pulled task {task}: 0 restored, 1 unchanged, 0 quarantined, 0 skipped."
    assert "MiB" not in piped.stdout + piped.stderr


def write_activity(home, entry, started, ended=None):
    """This host's activity record of `entry`'s scope, in the format writer-lease's
    ScopeActivity reads (`<scope>.activity` in the profile's cache/e2b), as the backend writes
    it around each command."""
    lines = ["hermes-e2b activity v1", f"sandbox: {entry['sandbox_id']}", f"started: {int(started * 1000)}"]
    if ended is not None:
        lines.append(f"ended: {int(ended * 1000)}")
    path = Path(home.path) / "cache" / "e2b" / f"{entry['scope']}.activity"
    path.write_text("\n".join(lines) + "\n")


def list_rows(home):
    """`hermes e2b list` as (header line, sandbox lines)."""
    shown = e2b(home, "list")
    assert shown.returncode == 0, shown.stderr
    header, *lines = shown.stdout.splitlines()
    return header, lines


# contract: I9
def test_list_shows_each_sessions_state_last_use_and_idle_time_most_recent_first(profile, e2b_local):
    import time

    home, _ = profile
    first = Session(home, chat="1")
    first.stop()
    second = Session(home, chat="2")
    second.stop()
    again = Session(home, chat="1")  # chat 1's session used again, after chat 2's; it stays attached
    try:
        assert again.sandbox_id == first.sandbox_id != second.sandbox_id
        listed = json.loads(e2b(home, "list", "--json").stdout)
        assert [e["sandbox_id"] for e in listed] == [first.sandbox_id, second.sandbox_id], listed
        alpha, beta = listed
        tasks = [e["host"]["task_id"] for e in listed]
        assert all(tasks) and tasks[0] != tasks[1], tasks
        for entry in listed:
            # The fields list printed before stay; the new ones come beside them.
            for key in ("sandbox_id", "state", "template", "mode", "scope", "owner", "started_at",
                        "lease_left_seconds", "duplicate_of", "host"):
                assert key in entry, key
        # Chat 2's session stopped: its state pulled, its sandbox was paused at close (L16).
        assert alpha["state"] == "running" and alpha["paused_at"] is None
        assert beta["state"] == "paused", beta
        for entry in listed:
            # The backend records each command's start and end on this host.
            assert entry["last_used_source"] == "host" and entry["running_command"] is False
            assert 0 <= entry["idle_seconds"] <= 120, entry
        assert alpha["idle_seconds"] < beta["idle_seconds"], (alpha, beta)
        assert alpha["last_used_at"] > beta["last_used_at"]

        header, rows = list_rows(home)
        assert header.split() == ["SESSION", "STATE", "LAST", "USE", "IDLE", "SANDBOX", "TEMPLATE", "MODE", "LEASE"]
        assert [row.split()[0] for row in rows] == tasks
        # One line per sandbox, aligned: each column starts where its header does; a last use
        # this host recorded has no `~` (which marks one estimated from E2B's lease end).
        for row, entry in zip(rows, listed):
            assert row.index(entry["sandbox_id"]) == header.index("SANDBOX"), (header, row)
            assert row[header.index("STATE"):].startswith(entry["state"] + " ")
            assert row[header.index("LAST USE"):].startswith("20")
        assert rows[0][header.index("LEASE"):].startswith("lease ")

        # This host's record of alpha's last command: started a moment ago, not ended, and a
        # session on this host holds alpha, so the command runs now.
        now = time.time()
        write_activity(home, alpha, started=now - 3, ended=now - 30)
        busy = json.loads(e2b(home, "list", "--json").stdout)[0]
        assert busy["sandbox_id"] == alpha["sandbox_id"]
        assert busy["running_command"] is True and busy["idle_seconds"] is None
        assert busy["last_used_source"] == "host" and abs(busy["running_since"] - (now - 3)) < 1
        assert "running a command" in list_rows(home)[1][0]
    finally:
        again.stop()

    # The session is gone: the record's command is not running any more; alpha was last used
    # when it started.
    after = {e["sandbox_id"]: e for e in json.loads(e2b(home, "list", "--json").stdout)}
    assert after[alpha["sandbox_id"]]["running_command"] is False
    assert after[alpha["sandbox_id"]]["last_used_source"] == "host"
    assert 3 <= after[alpha["sandbox_id"]]["idle_seconds"] <= 120

    # A paused sandbox (beta, paused at its session's close) says when it paused, and its
    # last use is no later.
    listed = json.loads(e2b(home, "list", "--json").stdout)
    assert [e["sandbox_id"] for e in listed] == [alpha["sandbox_id"], beta["sandbox_id"]]
    paused = listed[1]
    assert paused["state"] == "paused" and paused["paused_at"] is not None
    assert paused["last_used_at"] <= paused["paused_at"] and paused["idle_seconds"] >= beta["idle_seconds"]
    assert paused["lease_left_seconds"] is None
    header, rows = list_rows(home)
    assert rows[1].split()[:2] == [tasks[1], "paused"] and " paused 20" in rows[1], rows[1]
    logs_hold_no_key(home)
