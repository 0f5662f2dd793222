"""Snapshots and forks through the official SDK's own calls: create_snapshot, list_snapshots,
delete_snapshot, Sandbox.create from a snapshot, fork. e2b 2.46 has none of these; each
test skips, naming the missing method, where the installed SDK lacks it."""

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxNotFoundException


def need(*methods):
    missing = [m for m in methods if not hasattr(Sandbox, m)]
    if missing:
        import e2b

        version = getattr(e2b, "__version__", "this version")
        pytest.skip(f"the installed e2b ({version}) has no Sandbox.{', Sandbox.'.join(missing)}")


def _all(paginator):
    items = []
    pages = 0
    while paginator.has_next:
        items.extend(paginator.next_items())
        pages += 1
    return items, pages


def test_create_snapshot_with_and_without_a_name(sandbox, unique):
    need("create_snapshot", "delete_snapshot")
    unnamed = sandbox.create_snapshot()
    assert unnamed.snapshot_id.endswith(":default")
    assert unnamed.names == []
    name = f"snap-{unique}"
    named = Sandbox.create_snapshot(sandbox.sandbox_id, name=name)
    assert named.snapshot_id == f"local/{name}:default"
    assert named.names == [f"local/{name}:default"]
    # The source is untouched: still running under its id.
    assert sandbox.is_running()
    assert Sandbox.delete_snapshot(unnamed.snapshot_id) is True
    assert Sandbox.delete_snapshot(named.snapshot_id) is True


def test_list_snapshots_all_by_sandbox_and_by_name_with_paging(sandbox, unique):
    need("create_snapshot", "list_snapshots", "delete_snapshot")
    other = Sandbox.create(timeout=300)
    taken = []
    try:
        taken = [sandbox.create_snapshot() for _ in range(3)]
        taken.append(sandbox.create_snapshot(name=f"listed-{unique}"))
        theirs = other.create_snapshot()
        taken.append(theirs)
        ours = {s.snapshot_id for s in taken if s is not theirs}

        everything, _ = _all(Sandbox.list_snapshots())
        assert {s.snapshot_id for s in taken} <= {s.snapshot_id for s in everything}

        mine, pages = _all(Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id, limit=2))
        assert pages == 2
        assert {s.snapshot_id for s in mine} == ours
        assert len(mine) == len(ours)  # each once
        # The instance form filters by its own sandbox too.
        via_instance, _ = _all(sandbox.list_snapshots(limit=3))
        assert {s.snapshot_id for s in via_instance} == ours

        by_name, _ = _all(Sandbox.list_snapshots(name=f"listed-{unique}"))
        assert [s.snapshot_id for s in by_name] == [f"local/listed-{unique}:default"]
        assert by_name[0].names == [f"local/listed-{unique}:default"]
        nothing, _ = _all(Sandbox.list_snapshots(name=f"listed-{unique}-does-not-exist"))
        assert nothing == []
    finally:
        for snapshot in taken:
            Sandbox.delete_snapshot(snapshot.snapshot_id)
        other.kill()


def test_delete_snapshot_is_true_then_false(sandbox):
    need("create_snapshot", "delete_snapshot")
    snapshot = sandbox.create_snapshot()
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False


def test_a_sandbox_from_a_snapshot_has_its_files_and_is_independent(sandbox, unique):
    need("create_snapshot", "delete_snapshot")
    sandbox.files.make_dir("/home/user/app")
    sandbox.files.write("/home/user/app/config.json", '{"env": "test"}')
    sandbox.files.write("/home/user/app/data.txt", "important data")
    snapshot = sandbox.create_snapshot(name=f"from-{unique}")
    copies = []
    try:
        # By id and by bare name alike.
        for template in (snapshot.snapshot_id, f"from-{unique}"):
            copy = Sandbox.create(template, timeout=300)
            copies.append(copy)
            assert copy.files.read("/home/user/app/config.json") == '{"env": "test"}'
            assert copy.files.read("/home/user/app/data.txt") == "important data"
            assert copy.get_info().template_id != "base"
        copies[0].files.write("/home/user/app/data.txt", "changed in one copy")
        sandbox.files.write("/home/user/app/config.json", "changed in the source")
        assert copies[1].files.read("/home/user/app/data.txt") == "important data"
        assert copies[1].files.read("/home/user/app/config.json") == '{"env": "test"}'
        assert sandbox.files.read("/home/user/app/data.txt") == "important data"
    finally:
        for copy in copies:
            copy.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_fork_two_with_the_sources_files_and_the_source_untouched(sandbox):
    need("fork")
    sandbox.files.write("/home/user/state.txt", "state before fork")
    before = sandbox.get_info()
    forks = sandbox.fork(count=2, timeout=60)
    assert len(forks) == 2
    started = [f for f in forks if isinstance(f, Sandbox)]
    try:
        assert len(started) == 2, forks
        ids = {f.sandbox_id for f in started}
        assert len(ids) == 2 and sandbox.sandbox_id not in ids
        for fork in started:
            assert fork.is_running()
            assert fork.files.read("/home/user/state.txt") == "state before fork"
        started[0].files.write("/home/user/state.txt", "modified in a fork")
        assert started[1].files.read("/home/user/state.txt") == "state before fork"
        assert sandbox.files.read("/home/user/state.txt") == "state before fork"
        after = sandbox.get_info()
        assert sandbox.is_running()
        assert after.end_at == before.end_at
    finally:
        for fork in started:
            fork.kill()


def test_fork_of_a_missing_sandbox_raises_not_found(server):
    need("fork")
    gone = Sandbox.create(timeout=60)
    gone.kill()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(gone.sandbox_id)


def test_template_exists_knows_the_built_in_templates_and_named_snapshots(sandbox, unique):
    # The SDK's Template.exists (GET /templates/aliases/{alias}).
    from e2b import Template

    assert Template.exists("base") is True
    assert Template.exists("code-interpreter-v1") is True
    assert Template.exists(f"nothing-{unique}") is False
    need("create_snapshot", "delete_snapshot")
    name = f"exists-{unique}"
    assert Template.exists(name) is False
    snapshot = Sandbox.create_snapshot(sandbox.sandbox_id, name=name)
    assert Template.exists(name) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Template.exists(name) is False
