"""Control plane: create, get_info, list, connect, set_timeout, pause, resume, kill."""

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, TimeoutException

PERSISTENT = {"on_timeout": {"action": "pause", "keep_memory": False}}


def test_create_echoes_metadata_and_lifecycle(server, unique):
    meta = {"scope": "a b/c", "team": "infra", "run": unique}
    sbx = Sandbox.create(timeout=120, metadata=meta, lifecycle=PERSISTENT)
    try:
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata == meta
        assert info.state == SandboxState.RUNNING
        assert info.lifecycle["on_timeout"] == "pause"
        assert info.lifecycle["auto_resume"] is False
        assert info.template_id == "base"
        assert info.end_at > info.started_at
    finally:
        sbx.kill()

    ephemeral = Sandbox.create(timeout=60, lifecycle={"on_timeout": "kill"})
    try:
        assert ephemeral.get_info().lifecycle["on_timeout"] == "kill"
    finally:
        ephemeral.kill()


def _collect(paginator):
    pages = []
    while paginator.has_next:
        pages.append(paginator.next_items())
    return pages


def test_list_filters_by_metadata_and_state_and_pages(server, unique):
    created = [
        Sandbox.create(timeout=300, metadata={"suite": unique, "scope": "a b/c", "i": str(i)})
        for i in range(5)
    ]
    other = Sandbox.create(timeout=300, metadata={"suite": "someone-else"})
    try:
        ids = {s.sandbox_id for s in created}
        pages = _collect(Sandbox.list(query=SandboxQuery(metadata={"suite": unique}), limit=2))
        assert [len(p) for p in pages] == [2, 2, 1]
        listed = [info.sandbox_id for page in pages for info in page]
        assert sorted(listed) == sorted(ids)  # every one once, nothing else
        assert other.sandbox_id not in listed

        # The double-encoded filter with a space and a slash in the value.
        pages = _collect(Sandbox.list(query=SandboxQuery(metadata={"suite": unique, "scope": "a b/c"}), limit=50))
        assert sorted(i.sandbox_id for p in pages for i in p) == sorted(ids)

        # State filter.
        assert created[0].pause()
        paused = _collect(
            Sandbox.list(query=SandboxQuery(metadata={"suite": unique}, state=[SandboxState.PAUSED]))
        )
        assert [i.sandbox_id for p in paused for i in p] == [created[0].sandbox_id]
        running = _collect(
            Sandbox.list(query=SandboxQuery(metadata={"suite": unique}, state=[SandboxState.RUNNING]), limit=3)
        )
        assert sorted(i.sandbox_id for p in running for i in p) == sorted(ids - {created[0].sandbox_id})
        both = [i for p in _collect(Sandbox.list(query=SandboxQuery(metadata={"suite": unique}))) for i in p]
        states = {i.sandbox_id: i.state for i in both}
        assert states[created[0].sandbox_id] == SandboxState.PAUSED
        assert len(states) == 5
    finally:
        for s in created + [other]:
            Sandbox.kill(s.sandbox_id)


def test_connect_extends_but_never_shortens(server):
    sbx = Sandbox.create(timeout=300)
    try:
        first = sbx.get_info().end_at
        Sandbox.connect(sbx.sandbox_id, timeout=30)
        assert sbx.get_info().end_at == first  # a shorter lease is ignored
        Sandbox.connect(sbx.sandbox_id, timeout=3600)
        longer = sbx.get_info().end_at
        assert (longer - first).total_seconds() > 3000
        sbx.connect(timeout=60)  # instance form, same rule
        assert sbx.get_info().end_at == longer
    finally:
        sbx.kill()


def test_set_timeout_can_shorten(server):
    sbx = Sandbox.create(timeout=3600)
    try:
        before = sbx.get_info().end_at
        sbx.set_timeout(60)
        after = sbx.get_info().end_at
        assert (before - after).total_seconds() > 3000
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_pause_twice_returns_false_then_connect_resumes_with_files(server, unique):
    sbx = Sandbox.create(timeout=300, lifecycle=PERSISTENT)
    try:
        sbx.files.write(f"keep/{unique}.txt", "kept across pause")
        assert sbx.pause() is True
        assert sbx.get_info().state == SandboxState.PAUSED
        assert sbx.pause() is False  # 409: already paused
        assert not sbx.is_running()

        resumed = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert resumed.get_info().state == SandboxState.RUNNING
        assert resumed.files.read(f"keep/{unique}.txt") == "kept across pause"
        assert resumed.commands.run(f"cat ~/keep/{unique}.txt").stdout == "kept across pause"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_kill_and_kill_again(server):
    sbx = Sandbox.create(timeout=300)
    assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False  # 404
    with pytest.raises(NotFoundException):
        sbx.get_info()
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, timeout=60)


def test_kill_of_a_paused_sandbox_deletes_it(server):
    sbx = Sandbox.create(timeout=300, lifecycle=PERSISTENT)
    assert sbx.pause() is True
    assert Sandbox.kill(sbx.sandbox_id) is True
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def _not_running_error():
    # 2.63 has SandboxNotRunningException (a TimeoutException); 2.46 raises the
    # TimeoutException itself for envd's 502 "The sandbox was not found".
    try:
        from e2b.exceptions import SandboxNotRunningException

        return SandboxNotRunningException
    except ImportError:
        return TimeoutException


def test_sandbox_not_running_after_kill(server):
    sbx = Sandbox.create(timeout=300)
    sbx.files.write("a.txt", "x")
    sbx.kill()
    error = _not_running_error()
    with pytest.raises(error):
        sbx.commands.run("echo hi")
    with pytest.raises(error):
        sbx.files.read("a.txt")
    with pytest.raises(error):
        sbx.files.exists("a.txt")
    assert sbx.is_running() is False


def test_paused_sandbox_is_not_running_for_envd(server):
    sbx = Sandbox.create(timeout=300, lifecycle=PERSISTENT)
    try:
        sbx.pause()
        with pytest.raises(_not_running_error()):
            sbx.commands.run("echo hi")
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_traffic_wakes_a_paused_sandbox_created_with_auto_resume(server):
    # contract: L19 — autoResume: the next request to the sandbox resumes it, memory kept.
    sbx = Sandbox.create(
        timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": True}
    )
    try:
        assert sbx.get_info().lifecycle["auto_resume"] is True
        sleeper = sbx.commands.run("sleep 600", background=True)
        assert sbx.pause()
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        # No connect: the command itself is the traffic that wakes it.
        assert sbx.commands.run("echo awake").stdout == "awake\n"
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
        assert sleeper.pid in [p.pid for p in sbx.commands.list()]
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_auto_resume_is_refused_with_a_filesystem_only_pause(server):
    # contract: L19 — a filesystem-only snapshot cannot be woken by traffic: refused by the
    # SDK where it checks (2.63.0), else by e2b-local's 400.
    from e2b.exceptions import InvalidArgumentException, SandboxException

    with pytest.raises((InvalidArgumentException, SandboxException)) as refused:
        Sandbox.create(
            timeout=60,
            lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}, "auto_resume": True},
        )
    assert "auto_resume" in str(refused.value) or "autoResume" in str(refused.value)


def test_a_repeated_idempotency_key_gets_the_first_creates_sandbox(server, unique):
    # contract: L20 — the SDK's idempotency_key (sent as Idempotency-Key).
    import inspect

    if "idempotency_key" not in inspect.signature(Sandbox.create).parameters:
        pytest.skip("this e2b version has no idempotency_key (2.63.0 has)")
    key = f"conformance-{unique}"
    first = Sandbox.create(timeout=60, idempotency_key=key, metadata={"run": unique})
    try:
        again = Sandbox.create(timeout=60, idempotency_key=key, metadata={"run": unique})
        assert again.sandbox_id == first.sandbox_id
        listed = Sandbox.list(query=SandboxQuery(metadata={"run": unique})).next_items()
        assert [s.sandbox_id for s in listed] == [first.sandbox_id]
    finally:
        Sandbox.kill(first.sandbox_id)


def test_started_after_includes_a_sandbox_started_at_that_time(server, unique):
    # The spec: "Return sandboxes started at or after this timestamp".
    sbx = Sandbox.create(timeout=60, metadata={"run": unique})
    try:
        started = sbx.get_info().started_at
        query = SandboxQuery(metadata={"run": unique}, started_after=started)
        assert [s.sandbox_id for s in Sandbox.list(query=query).next_items()] == [sbx.sandbox_id]
    finally:
        sbx.kill()


def test_the_mcp_gateway_is_refused_saying_why(server):
    # e2b-local cannot run E2B's MCP gateway: a clear 400, not "template not found".
    from e2b.exceptions import SandboxException

    with pytest.raises(SandboxException, match="does not serve E2B's MCP gateway"):
        Sandbox.create(timeout=60, mcp={"exa": {"apiKey": "not-a-real-key"}})
    with pytest.raises(SandboxException, match="does not serve E2B's MCP gateway"):
        Sandbox.create("mcp-gateway", timeout=60)
