"""envd Process List and Connect: the SDK's `commands.list` and `commands.connect`."""

import pytest
from e2b import CommandExitException
from e2b.exceptions import NotFoundException


def test_commands_list_shows_a_running_command_and_connect_reattaches(sandbox, unique):
    gate = f"/tmp/go-{unique}"
    script = f"echo first; while [ ! -f {gate} ]; do sleep 0.05; done; echo second; exit 4"
    handle = sandbox.commands.run(script, background=True, envs={"MARK": unique}, timeout=0)

    listed = {p.pid: p for p in sandbox.commands.list()}
    assert handle.pid in listed
    info = listed[handle.pid]
    assert info.cmd == "/bin/bash"
    assert info.args[-1] == script
    assert info.envs.get("MARK") == unique

    handle.disconnect()
    attached = sandbox.commands.connect(handle.pid, timeout=0)
    assert attached.pid == handle.pid
    sandbox.files.write(gate, "go")
    with pytest.raises(CommandExitException) as ended:
        attached.wait()
    assert ended.value.exit_code == 4
    # Connect delivers the output from the moment it attaches.
    assert "second\n" in ended.value.stdout

    assert handle.pid not in [p.pid for p in sandbox.commands.list()]


def test_connect_to_an_unknown_pid_is_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(4_000_000)
