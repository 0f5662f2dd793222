"""envd Filesystem RPCs and /files through the SDK."""

import os

import pytest
from e2b import FileType
from e2b.exceptions import NotFoundException


def test_write_files_many_nested_in_one_call_then_read(sandbox, unique):
    entries = [{"path": f"deep/{unique}/d{i % 4}/sub/f{i}.txt", "data": f"content {i}"} for i in range(30)]
    entries.append({"path": f"/home/user/abs-{unique}/bin.dat", "data": bytes(range(256))})
    entries.append({"path": f"/tmp/{unique}/t.txt", "data": "in tmp"})
    infos = sandbox.files.write_files(entries)
    assert len(infos) == len(entries)
    assert infos[0].path == f"/home/user/deep/{unique}/d0/sub/f0.txt"
    for i in range(30):
        assert sandbox.files.read(f"/home/user/deep/{unique}/d{i % 4}/sub/f{i}.txt") == f"content {i}"
    assert sandbox.files.read(f"abs-{unique}/bin.dat", format="bytes") == bytes(range(256))
    assert sandbox.files.read(f"/tmp/{unique}/t.txt") == "in tmp"
    # Files written through /files belong to the sandbox user.
    owner = sandbox.commands.run(f"stat -c %U ~/deep/{unique}/d0/sub/f0.txt").stdout.strip()
    assert owner == "user"


def test_single_write_and_read_formats(sandbox, unique):
    info = sandbox.files.write(f"one-{unique}.txt", "hello\n")
    assert info.path == f"/home/user/one-{unique}.txt"
    assert sandbox.files.read(f"one-{unique}.txt") == "hello\n"
    assert sandbox.files.read(f"one-{unique}.txt", format="bytes") == b"hello\n"
    assert b"".join(sandbox.files.read(f"one-{unique}.txt", format="stream")) == b"hello\n"
    assert sandbox.commands.run(f"cat ~/one-{unique}.txt").stdout == "hello\n"
    with pytest.raises(NotFoundException):
        sandbox.files.read(f"missing-{unique}.txt")


def test_exists_list_make_dir(sandbox, unique):
    base = f"/home/user/ls-{unique}"
    assert sandbox.files.exists(base) is False
    assert sandbox.files.make_dir(f"{base}/a/b") is True
    assert sandbox.files.make_dir(f"{base}/a/b") is False  # already exists
    sandbox.files.write(f"{base}/a/file.txt", "12345")
    assert sandbox.files.exists(f"{base}/a/file.txt") is True

    top = sandbox.files.list(base)
    assert [(e.name, e.type) for e in top] == [("a", FileType.DIR)]
    entries = sandbox.files.list(f"{base}/a")
    by_name = {e.name: e for e in entries}
    assert set(by_name) == {"b", "file.txt"}
    assert by_name["file.txt"].type == FileType.FILE
    assert by_name["file.txt"].size == 5
    assert by_name["file.txt"].path == f"{base}/a/file.txt"
    deep = sandbox.files.list(base, depth=3)
    assert {e.path for e in deep} == {f"{base}/a", f"{base}/a/b", f"{base}/a/file.txt"}
    info = sandbox.files.get_info(f"{base}/a/file.txt")
    assert info.size == 5 and info.owner == "user"


def test_remove_and_rename(sandbox, unique):
    sandbox.files.write(f"mv-{unique}/src.txt", "moving")
    moved = sandbox.files.rename(f"mv-{unique}/src.txt", f"mv-{unique}/dst/renamed.txt")
    assert moved.path == f"/home/user/mv-{unique}/dst/renamed.txt"
    assert sandbox.files.exists(f"mv-{unique}/src.txt") is False
    assert sandbox.files.read(f"mv-{unique}/dst/renamed.txt") == "moving"

    sandbox.files.remove(f"mv-{unique}/dst/renamed.txt")
    assert sandbox.files.exists(f"mv-{unique}/dst/renamed.txt") is False
    sandbox.files.remove(f"mv-{unique}")
    assert sandbox.files.exists(f"mv-{unique}") is False
    with pytest.raises(NotFoundException):
        sandbox.files.rename(f"mv-{unique}/nothing", "elsewhere")


def test_tmp_is_private_to_the_sandbox(server, sandbox, unique):
    from e2b import Sandbox

    sandbox.commands.run(f"echo mine > /tmp/private-{unique}")
    other = Sandbox.create(timeout=120)
    try:
        assert other.files.exists(f"/tmp/private-{unique}") is False
        assert other.commands.run(f"ls /tmp/private-{unique} 2>/dev/null || echo absent").stdout == "absent\n"
    finally:
        other.kill()
    assert sandbox.files.read(f"/tmp/private-{unique}") == "mine\n"
    assert not os.path.exists(f"/tmp/private-{unique}")  # not the host's /tmp


def test_file_like_data_uses_the_streaming_upload(sandbox, unique):
    import io

    payload = os.urandom(3 * 1024 * 1024)
    info = sandbox.files.write(f"stream-{unique}/blob.bin", io.BytesIO(payload))
    assert info.path == f"/home/user/stream-{unique}/blob.bin"
    assert sandbox.files.read(f"stream-{unique}/blob.bin", format="bytes") == payload
    size = sandbox.commands.run(f"stat -c %s ~/stream-{unique}/blob.bin").stdout.strip()
    assert size == str(len(payload))
