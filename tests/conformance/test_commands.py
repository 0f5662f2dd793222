"""envd Process: streaming run, exit codes, background commands, kill by pid, users."""

import pytest
from e2b import CommandExitException
from e2b.exceptions import TimeoutException

from conftest import wait_for


def test_run_streams_chunks_while_the_command_runs(sandbox, unique):
    gate = f"/tmp/gate-{unique}"
    out, err = [], []

    def on_stdout(chunk):
        out.append(chunk)
        if "ready" in chunk:
            # The command blocks until this file exists: the chunk must have arrived
            # while it was still running, not buffered until its end.
            sandbox.files.write(gate, "go")

    cmd = (
        f"echo ready; echo warn >&2; "
        f"for i in $(seq 600); do [ -f {gate} ] && break; sleep 0.05; done; "
        f"[ -f {gate} ] && echo released"
    )
    result = sandbox.commands.run(cmd, on_stdout=on_stdout, on_stderr=err.append)
    assert result.exit_code == 0
    assert "".join(out) == "ready\nreleased\n"
    assert len(out) >= 2
    assert "".join(err) == "warn\n"
    assert result.stdout == "ready\nreleased\n"
    assert result.stderr == "warn\n"


def test_nonzero_exit_raises_command_exit_exception(sandbox):
    with pytest.raises(CommandExitException) as info:
        sandbox.commands.run("echo oops >&2; exit 3")
    assert info.value.exit_code == 3
    assert info.value.stderr == "oops\n"


def test_envs_cwd_and_users(sandbox):
    result = sandbox.commands.run('echo "$FOO"; pwd', envs={"FOO": "bar baz"}, cwd="/tmp")
    assert result.stdout == "bar baz\n/tmp\n"
    assert sandbox.commands.run("whoami; echo $HOME").stdout == "user\n/home/user\n"
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"
    with pytest.raises(CommandExitException):
        sandbox.commands.run("cd /root")
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"


def test_large_output_arrives_complete(sandbox):
    result = sandbox.commands.run("head -c 3000000 /dev/zero | tr '\\0' 'a'; echo")
    assert len(result.stdout) == 3_000_001
    assert set(result.stdout.strip()) == {"a"}


def test_background_command_killed_by_pid_while_another_survives(sandbox, unique):
    victim = sandbox.commands.run(f"sleep 300 # victim {unique}", background=True, timeout=0)
    survivor = sandbox.commands.run(f"sleep 300 # survivor {unique}", background=True, timeout=0)
    assert victim.pid != survivor.pid
    pids = {p.pid for p in sandbox.commands.list()}
    assert {victim.pid, survivor.pid} <= pids

    assert sandbox.commands.kill(victim.pid) is True
    with pytest.raises(CommandExitException) as info:
        victim.wait()
    assert info.value.exit_code == -1

    wait_for(lambda: victim.pid not in {p.pid for p in sandbox.commands.list()}, "victim to leave the list")
    assert survivor.pid in {p.pid for p in sandbox.commands.list()}
    assert sandbox.commands.run("echo still fine").stdout == "still fine\n"

    assert survivor.kill() is True
    assert sandbox.commands.kill(victim.pid) is False  # not found any more


def test_kill_of_unknown_pid_returns_false(sandbox):
    assert sandbox.commands.kill(999_999) is False


def test_command_timeout_raises(sandbox):
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)


def test_connect_to_a_running_command(sandbox, unique):
    gate = f"/tmp/connect-{unique}"
    handle = sandbox.commands.run(
        f"for i in $(seq 600); do [ -f {gate} ] && break; sleep 0.05; done; echo done-{unique}",
        background=True,
        timeout=0,
    )
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid)
    sandbox.files.write(gate, "go")
    result = again.wait()
    assert result.exit_code == 0
    assert f"done-{unique}" in result.stdout


def test_stdin_send_and_close(sandbox):
    handle = sandbox.commands.run("cat", background=True, stdin=True, timeout=0)
    sandbox.commands.send_stdin(handle.pid, "line one\n")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert result.stdout == "line one\n"


def test_kill_sandbox_while_command_is_running(server):
    # contract: O3 — as on E2B, a sandbox killed (or paused) under a running command takes
    # envd's stream with it: the stream breaks off without an end event, the SDK's health
    # probe finds the sandbox gone and says it was killed or reached its end of life.
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=300)
    cmd = sbx.commands.run("sleep 60", background=True)

    sbx.kill()

    with pytest.raises(TimeoutException) as info:
        cmd.wait()
    assert "sandbox was killed or reached its end of life" in str(info.value)


def test_pause_while_command_is_running_breaks_its_stream(server):
    # contract: O3 — a pause ends envd's streams the same way (the sandbox is not running).
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=300)
    try:
        cmd = sbx.commands.run("sleep 60", background=True)
        sbx.pause()
        with pytest.raises(TimeoutException) as info:
            cmd.wait()
        assert "sandbox was killed or reached its end of life" in str(info.value)
    finally:
        Sandbox.kill(sbx.sandbox_id)
