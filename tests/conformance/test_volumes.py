"""E2B volumes through the official SDK's `Volume` against e2b-local (contract L21): create,
connect, list, destroy; the content API (directories, files, stat, metadata, removal) with
the volume's token; and volumes mounted into sandboxes at create, where the sandbox's
commands and files API see the same files as the content API, across sandboxes and after
the sandbox is gone. Both pinned SDKs have `Volume`; an SDK without it skips."""

import os
import urllib.error
import urllib.request

import pytest

from conftest import API_KEY


def volume_api():
    try:
        from e2b import Volume
        from e2b.exceptions import VolumeException
    except ImportError as error:
        import e2b

        version = getattr(e2b, "__version__", "this version")
        pytest.skip(f"the installed e2b ({version}) has no Volume API: {error}")
    return Volume, VolumeException


def raw(url, method, path, body=None, headers=None):
    """One request outside the SDK: (status, body bytes)."""
    request = urllib.request.Request(
        f"{url}{path}",
        data=body,
        method=method,
        headers=headers or {},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_create_connect_list_and_destroy(server, unique):
    Volume, VolumeException = volume_api()
    name = f"vol-{unique}"
    volume = Volume.create(name)
    assert volume.name == name
    assert volume.token, "create answers the content token"
    listed = {v.volume_id: v.name for v in Volume.list()}
    assert listed.get(volume.volume_id) == name
    again = Volume.connect(volume.volume_id)
    assert again.name == name and again.token == volume.token
    # A taken name is refused; so is one E2B's pattern refuses.
    with pytest.raises(VolumeException):
        Volume.create(name)
    with pytest.raises(Exception):
        Volume.create("no spaces allowed")
    assert Volume.destroy(volume.volume_id) is True
    assert Volume.destroy(volume.volume_id) is False
    assert volume.volume_id not in {v.volume_id for v in Volume.list()}


def test_files_and_directories_through_the_content_api(server, unique):
    Volume, _ = volume_api()
    from e2b.exceptions import NotFoundException

    volume = Volume.create(f"files-{unique}")
    try:
        made = volume.make_dir("/a/b", force=True)
        assert made.name == "b" and made.path == "/a/b"
        assert made.type.value == "directory" if hasattr(made.type, "value") else made.type == "directory"
        volume.write_file("/a/b/hello.txt", "hello volume")
        assert volume.read_file("/a/b/hello.txt") == "hello volume"
        payload = bytes(range(256)) * 4096
        info = volume.write_file("/a/bin.dat", payload)
        assert info.size == len(payload)
        assert volume.read_file("/a/bin.dat", format="bytes") == payload
        assert b"".join(volume.read_file("/a/bin.dat", format="stream")) == payload
        names = [entry.name for entry in volume.list("/a")]
        assert names == ["b", "bin.dat"]
        deep = [entry.path for entry in volume.list("/", depth=3)]
        assert "/a/b/hello.txt" in deep
        assert volume.exists("/a/b/hello.txt")
        assert not volume.exists("/nope")
        updated = volume.update_metadata("/a/b/hello.txt", mode=0o640)
        assert updated.mode == 0o640
        # `..` stops at the volume's root: nothing of the host is reachable.
        assert volume.read_file("/../../a/b/hello.txt") == "hello volume"
        with pytest.raises(NotFoundException):
            volume.read_file("/../../etc/hostname")
        volume.remove("/a/b")
        assert not volume.exists("/a/b/hello.txt")
        with pytest.raises(NotFoundException):
            volume.remove("/a/b")
    finally:
        Volume.destroy(volume.volume_id)


def test_without_force_an_existing_file_is_kept(server, unique):
    Volume, VolumeException = volume_api()
    volume = Volume.create(f"keep-{unique}")
    try:
        volume.write_file("/f.txt", "first")
        with pytest.raises(VolumeException):
            volume.write_file("/f.txt", "second", force=False)
        assert volume.read_file("/f.txt") == "first"
        volume.write_file("/f.txt", "second", force=True)
        assert volume.read_file("/f.txt") == "second"
    finally:
        Volume.destroy(volume.volume_id)


def test_the_content_api_wants_the_volumes_own_token(server, unique):
    Volume, _ = volume_api()
    mine = Volume.create(f"mine-{unique}")
    other = Volume.create(f"other-{unique}")
    try:
        mine.write_file("/secret.txt", "mine")
        path = f"/volumecontent/{mine.volume_id}/file?path=/secret.txt"
        status, _ = raw(server.api_url, "GET", path)
        assert status == 401
        status, _ = raw(server.api_url, "GET", path, headers={"Authorization": f"Bearer {other.token}"})
        assert status == 401
        # The team's API key is not a volume token either.
        status, _ = raw(server.api_url, "GET", path, headers={"Authorization": f"Bearer {API_KEY}"})
        assert status == 401
        status, body = raw(server.api_url, "GET", path, headers={"Authorization": f"Bearer {mine.token}"})
        assert (status, body) == (200, b"mine")
    finally:
        Volume.destroy(mine.volume_id)
        Volume.destroy(other.volume_id)


def test_a_mounted_volume_is_shared_by_sandboxes_and_outlives_them(server, unique):
    Volume, _ = volume_api()
    from e2b import Sandbox

    volume = Volume.create(f"shared-{unique}")
    volume.write_file("/from-api.txt", "written through the content API")
    first = Sandbox.create(timeout=120, volume_mounts={"/home/user/data": volume})
    try:
        got = first.commands.run("cat /home/user/data/from-api.txt")
        assert got.stdout == "written through the content API"
        first.commands.run("echo from-sandbox > /home/user/data/made.txt")
        first.files.write("/home/user/data/sub/by-files.txt", "by the files API")
        listed = Sandbox.get_info(first.sandbox_id).volume_mounts
        pairs = [(m["name"], m["path"]) if isinstance(m, dict) else (m.name, m.path) for m in listed]
        assert pairs == [(volume.name, "/home/user/data")]
    finally:
        Sandbox.kill(first.sandbox_id)
    # The sandbox is gone; its files in the volume are not.
    assert volume.read_file("/made.txt") == "from-sandbox\n"
    assert volume.read_file("/sub/by-files.txt") == "by the files API"
    # Mounted by name elsewhere in a second sandbox, beside one under /tmp.
    second = Sandbox.create(timeout=120, volume_mounts={"/tmp/vol": volume.name})
    try:
        got = second.commands.run("cat /tmp/vol/made.txt /tmp/vol/sub/by-files.txt")
        assert got.stdout == "from-sandbox\nby the files API"
        # Outside the mount, the sandbox's own home has none of the volume's files.
        assert not second.files.exists("/home/user/made.txt")
    finally:
        Sandbox.kill(second.sandbox_id)
    Volume.destroy(volume.volume_id)


def test_a_mount_under_mnt_hides_nothing_of_the_host(server, unique):
    Volume, _ = volume_api()
    from e2b import Sandbox

    if not server_isolates(server):
        pytest.skip("this host gives e2b-local no mount namespace: volumes mount only in home and /tmp")
    volume = Volume.create(f"mnt-{unique}")
    point = f"/mnt/data-{unique}"
    sbx = Sandbox.create(timeout=120, volume_mounts={point: volume})
    try:
        sbx.commands.run(f"echo under-mnt > {point}/x.txt")
        assert volume.read_file("/x.txt") == "under-mnt\n"
        assert sbx.files.read(f"{point}/x.txt") == "under-mnt\n"
        # The sandbox's /mnt is a fresh tmpfs holding only the mount point, and the host's
        # /mnt never saw it.
        assert sbx.commands.run("ls -A /mnt").stdout.split() == [point.rsplit("/", 1)[1]]
        assert not os.path.exists(point)
    finally:
        Sandbox.kill(sbx.sandbox_id)
        Volume.destroy(volume.volume_id)


def test_bad_mounts_are_refused_naming_why(server, unique):
    Volume, _ = volume_api()
    from e2b import Sandbox

    volume = Volume.create(f"bad-{unique}")
    try:
        for path, reason in [
            ("/etc", "below"),
            ("/home/user", "not over it"),
        ]:
            with pytest.raises(Exception) as caught:
                Sandbox.create(timeout=60, volume_mounts={path: volume})
            assert reason in str(caught.value), str(caught.value)
        with pytest.raises(Exception) as caught:
            Sandbox.create(timeout=60, volume_mounts={"/tmp/x": f"missing-{unique}"})
        assert "no volume" in str(caught.value)
    finally:
        Volume.destroy(volume.volume_id)


def test_a_deleted_volume_fails_the_next_command_naming_it(server, unique):
    Volume, _ = volume_api()
    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import CommandExitException

    if not server_isolates(server):
        pytest.skip("path mapping links the mount point; nothing is bound at each command")
    volume = Volume.create(f"gone-{unique}")
    sbx = Sandbox.create(timeout=120, volume_mounts={"/home/user/v": volume})
    try:
        Volume.destroy(volume.volume_id)
        with pytest.raises(Exception) as caught:
            sbx.commands.run("ls /home/user/v")
        assert not isinstance(caught.value, CommandExitException)
        assert f"volume '{volume.name}'" in str(caught.value), str(caught.value)
    finally:
        Sandbox.kill(sbx.sandbox_id)


def server_isolates(server):
    """Whether e2b-local runs commands in mount namespaces (its admin route says)."""
    return server.admin("isolation")["mode"] == "mount-namespace"


@pytest.fixture(scope="module")
def path_mapping_server():
    """A server without mount namespaces, where mount points are symlinks."""
    from conftest import LocalServer, _use

    srv = LocalServer(extra_args=["--isolation", "path-mapping"])
    mp = pytest.MonkeyPatch()
    _use(srv, mp)
    yield srv
    mp.undo()
    srv.stop()


def test_without_a_namespace_a_mount_in_the_home_still_shares_files(path_mapping_server, unique):
    Volume, _ = volume_api()
    from e2b import Sandbox

    volume = Volume.create(f"linked-{unique}")
    sbx = Sandbox.create(timeout=120, volume_mounts={"/home/user/data": volume})
    try:
        sbx.commands.run("echo linked > ~/data/x.txt")
        assert volume.read_file("/x.txt") == "linked\n"
        volume.write_file("/y.txt", "from the API")
        assert sbx.files.read("/home/user/data/y.txt") == "from the API"
        with pytest.raises(Exception) as caught:
            Sandbox.create(timeout=60, volume_mounts={"/mnt/data": volume})
        assert "without a mount namespace" in str(caught.value)
    finally:
        Sandbox.kill(sbx.sandbox_id)
        Volume.destroy(volume.volume_id)


def test_an_upload_that_breaks_off_leaves_the_old_file_whole(server, unique):
    Volume, _ = volume_api()
    import socket
    from urllib.parse import urlparse

    volume = Volume.create(f"torn-{unique}")
    try:
        volume.write_file("/keep.txt", "the whole old file")
        target = urlparse(server.api_url)
        with socket.create_connection((target.hostname, target.port), timeout=30) as conn:
            conn.sendall(
                (
                    f"PUT /volumecontent/{volume.volume_id}/file?path=/keep.txt&force=true HTTP/1.1\r\n"
                    f"Host: {target.netloc}\r\nAuthorization: Bearer {volume.token}\r\n"
                    "Content-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n"
                ).encode()
                + b"only the start"
            )
            conn.shutdown(socket.SHUT_WR)
            # The server answers (or closes) once it sees the body end early.
            conn.recv(4096)
        assert volume.read_file("/keep.txt") == "the whole old file"
        assert [entry.name for entry in volume.list("/")] == ["keep.txt"], "no partial upload left"
    finally:
        Volume.destroy(volume.volume_id)
