"""Lease expiry driven by the admin clock route (on its own server)."""

import pytest
from e2b import Sandbox, SandboxState
from e2b.exceptions import NotFoundException


def test_auto_pause_at_lease_end_keeps_files_and_drops_processes(own_server, unique):
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}})
    try:
        sbx.files.write(f"state-{unique}.txt", "survives")
        sbx.commands.run("sleep 600", background=True, timeout=0)
        assert len(sbx.commands.list()) == 1

        own_server.advance_clock(30)
        assert sbx.get_info().state == SandboxState.RUNNING
        own_server.advance_clock(31)
        assert sbx.get_info().state == SandboxState.PAUSED
        assert sbx.is_running() is False

        Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert sbx.get_info().state == SandboxState.RUNNING
        assert sbx.files.read(f"state-{unique}.txt") == "survives"
        assert sbx.commands.list() == []  # a filesystem-only pause keeps no process
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_kill_lifecycle_at_lease_end_removes_the_sandbox(own_server):
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": "kill"})
    sbx.files.write("x.txt", "gone soon")
    own_server.advance_clock(61)
    with pytest.raises(NotFoundException):
        sbx.get_info()
    assert Sandbox.kill(sbx.sandbox_id) is False
    assert sbx.sandbox_id not in [i.sandbox_id for i in Sandbox.list().next_items()]


def test_set_timeout_then_expiry(own_server):
    sbx = Sandbox.create(timeout=3600)
    sbx.set_timeout(10)
    own_server.advance_clock(11)
    with pytest.raises(NotFoundException):
        sbx.get_info()
