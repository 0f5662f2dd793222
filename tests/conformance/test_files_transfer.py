"""/files beyond plain bytes through the SDK's documented calls: gzip both ways, file
metadata, symlink entries, and a secure sandbox's access token and signed URLs."""

import gzip
import hashlib
import json
import urllib.error
import urllib.request

import pytest
from e2b import FileType, Sandbox


def _text(n):
    return "".join(f"line {i} of a compressible file\n" for i in range(n))


def test_gzip_write_and_read(sandbox, unique):
    content = _text(20_000)
    info = sandbox.files.write(f"gz-{unique}/a.txt", content, gzip=True)
    assert info.path == f"/home/user/gz-{unique}/a.txt"
    # The file holds the decoded bytes, not the gzip stream.
    digest = sandbox.commands.run(f"sha256sum ~/gz-{unique}/a.txt").stdout.split()[0]
    assert digest == hashlib.sha256(content.encode()).hexdigest()
    assert sandbox.files.read(f"gz-{unique}/a.txt", gzip=True) == content
    assert sandbox.files.read(f"gz-{unique}/a.txt", format="bytes", gzip=True) == content.encode()
    assert b"".join(sandbox.files.read(f"gz-{unique}/a.txt", format="stream", gzip=True)) == content.encode()
    # Several files with gzip go one octet-stream request each.
    infos = sandbox.files.write_files(
        [{"path": f"gz-{unique}/b.txt", "data": "bee"}, {"path": f"gz-{unique}/c.bin", "data": bytes(range(256))}],
        gzip=True,
    )
    assert [i.name for i in infos] == ["b.txt", "c.bin"]
    assert sandbox.files.read(f"gz-{unique}/c.bin", format="bytes") == bytes(range(256))


def test_gzip_download_is_coded_on_the_wire(sandbox, unique):
    content = _text(5_000)
    sandbox.files.write(f"wire-{unique}.txt", content)
    # download_url is the SDK's own (signed for a secure sandbox); urllib does not decode.
    request = urllib.request.Request(sandbox.download_url(f"wire-{unique}.txt"), headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        coded = response.read()
    assert len(coded) < len(content)
    assert gzip.decompress(coded).decode() == content


def test_metadata_written_with_a_file_comes_back(sandbox, unique):
    info = sandbox.files.write(f"meta-{unique}.txt", "m", metadata={"Owner": "alice", "stage": "draft 1"})
    assert info.metadata == {"owner": "alice", "stage": "draft 1"}
    assert sandbox.files.get_info(f"meta-{unique}.txt").metadata == {"owner": "alice", "stage": "draft 1"}
    listed = {e.name: e for e in sandbox.files.list("/home/user")}
    assert listed[f"meta-{unique}.txt"].metadata == {"owner": "alice", "stage": "draft 1"}
    # The same map on every file of a multi-file upload.
    infos = sandbox.files.write_files(
        [{"path": f"meta-{unique}/x", "data": "1"}, {"path": f"meta-{unique}/y", "data": "2"}],
        metadata={"batch": "7"},
    )
    assert [i.metadata for i in infos] == [{"batch": "7"}, {"batch": "7"}]
    assert sandbox.files.get_info(f"meta-{unique}/y").metadata == {"batch": "7"}
    # Overwriting without metadata clears it; a file never given any has none.
    assert sandbox.files.write(f"meta-{unique}.txt", "again").metadata is None
    assert sandbox.files.get_info(f"meta-{unique}.txt").metadata is None
    # The rename keeps it (it lives on the file).
    renamed = sandbox.files.rename(f"meta-{unique}/x", f"meta-{unique}/z")
    assert renamed.metadata == {"batch": "7"}


def test_symlink_entries_report_their_target(sandbox, unique):
    base = f"/home/user/ln-{unique}"
    sandbox.files.write(f"{base}/dir/real.txt", "r")
    sandbox.commands.run(
        f"cd {base} && ln -s dir/real.txt file-link && ln -s {base}/dir dir-link && ln -s nowhere dangling"
    )
    link = sandbox.files.get_info(f"{base}/file-link")
    assert link.symlink_target == f"{base}/dir/real.txt"
    assert link.type == FileType.FILE
    assert link.permissions.startswith("L")
    assert sandbox.files.get_info(f"{base}/dir-link").type == FileType.DIR
    by_name = {e.name: e for e in sandbox.files.list(base)}
    assert by_name["dir-link"].symlink_target == f"{base}/dir"
    assert by_name["dir"].symlink_target is None
    # A dangling link has no type, so the SDK leaves it out of lists (as with envd).
    assert "dangling" not in by_name
    dangling = sandbox.files.get_info(f"{base}/dangling")
    assert dangling.symlink_target == f"{base}/dangling"
    assert dangling.type is None


def _status(request):
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _multipart(name, data):
    boundary = "conformance-boundary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_a_secure_sandbox_requires_its_token_and_honours_signed_urls(server, unique):
    sbx = Sandbox.create(timeout=300)  # secure by default in the SDK
    try:
        # The SDK got a token and sends it: its own calls work.
        sbx.files.write(f"sec-{unique}.txt", "secret")
        assert sbx.commands.run("echo ok").stdout == "ok\n"
        # envd without the token: 401 with envd's words.
        plain = urllib.request.Request(
            f"{sbx.envd_api_url}/process.Process/List",
            data=b"{}",
            method="POST",
            headers={"Content-Type": "application/json", "E2b-Sandbox-Id": sbx.sandbox_id},
        )
        status, body = _status(plain)
        assert status == 401
        assert "please provide a valid access token" in json.loads(body)["message"]
        # Signed URLs need no header: download, and upload as the docstring says (multipart POST).
        status, body = _status(urllib.request.Request(sbx.download_url(f"sec-{unique}.txt")))
        assert (status, body) == (200, b"secret")
        data, content_type = _multipart("ignored", b"uploaded by url")
        upload = urllib.request.Request(
            sbx.upload_url(f"up-{unique}.txt"), data=data, method="POST", headers={"Content-Type": content_type}
        )
        assert _status(upload)[0] == 200
        assert sbx.files.read(f"up-{unique}.txt") == "uploaded by url"
        # A read URL is not a write URL; a tampered one is nothing.
        as_write = urllib.request.Request(
            sbx.download_url(f"up-{unique}.txt"), data=data, method="POST", headers={"Content-Type": content_type}
        )
        status, body = _status(as_write)
        assert (status, json.loads(body)["message"]) == (401, "invalid signature")
        tampered = sbx.download_url(f"sec-{unique}.txt").replace("signature=v1_", "signature=v1_x")
        assert _status(urllib.request.Request(tampered))[0] == 401
        # Connecting again hands out the same token.
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.files.read(f"sec-{unique}.txt") == "secret"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_an_insecure_sandbox_needs_no_token(server, unique):
    # SDK 2.46 sends secure=False and gets no token; 2.63 ignores it and gets one. Either way
    # the SDK's own calls work, and only a sandbox with a token refuses a bare request.
    sbx = Sandbox.create(timeout=300, secure=False)
    try:
        sbx.files.write(f"open-{unique}.txt", "open")
        assert sbx.files.read(f"open-{unique}.txt") == "open"
        bare = urllib.request.Request(
            f"{sbx.envd_api_url}/process.Process/List",
            data=b"{}",
            method="POST",
            headers={"Content-Type": "application/json", "E2b-Sandbox-Id": sbx.sandbox_id},
        )
        expected = 200 if sbx._envd_access_token is None else 401
        assert _status(bare)[0] == expected
    finally:
        Sandbox.kill(sbx.sandbox_id)


@pytest.mark.parametrize("bad", [{"k": "caf\u00e9"}, {"bad key": "v"}])
def test_metadata_the_sdk_refuses_never_reaches_the_server(sandbox, unique, bad):
    from e2b.exceptions import InvalidArgumentException

    with pytest.raises(InvalidArgumentException):
        sandbox.files.write(f"bad-{unique}.txt", "x", metadata=bad)


# Last in the file: own_server points the SDK at a server of its own from here on.
def test_signed_urls_expire(own_server, unique):
    sbx = Sandbox.create(timeout=600)
    try:
        sbx.files.write(f"exp-{unique}.txt", "until then")
        url = sbx.download_url(f"exp-{unique}.txt", use_signature_expiration=120)
        assert "signature_expiration=" in url
        assert _status(urllib.request.Request(url)) == (200, b"until then")
        own_server.advance_clock(300)
        status, body = _status(urllib.request.Request(url))
        assert (status, json.loads(body)["message"]) == (401, "signature is already expired")
    finally:
        Sandbox.kill(sbx.sandbox_id)
