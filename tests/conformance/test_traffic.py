"""The traffic access token of a sandbox created with `allow_public_traffic: False`, as
the SDK exposes it (`Sandbox.traffic_access_token`), required on the sandbox's own ports."""

import json
import urllib.error
import urllib.request

from e2b import Sandbox


def _to_port(server, sandbox_id, port, token=None):
    """GETs port `port` of the sandbox through e2b-local; returns (status, parsed body)."""
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}
    if token is not None:
        headers["e2b-traffic-access-token"] = token
    request = urllib.request.Request(f"{server.sandbox_url}/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def test_a_private_sandbox_hands_out_its_traffic_token(server):
    # contract: X6 — as on E2B: a token per sandbox, 403 on its own ports without it.
    sbx = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    try:
        token = sbx.traffic_access_token
        assert isinstance(token, str) and len(token) == 32
        status, body = _to_port(server, sbx.sandbox_id, 3000)
        assert status == 403
        assert "Token header 'e2b-traffic-access-token' is missing" in body["message"]
        status, body = _to_port(server, sbx.sandbox_id, 3000, "wrong")
        assert status == 403
        assert "is invalid" in body["message"]
        status, body = _to_port(server, sbx.sandbox_id, 3000, token)
        assert status == 502
        assert body["message"] == "The sandbox is running but port is not open"
        # envd's own port needs no traffic token: the SDK's calls work as before.
        assert sbx.commands.run("echo ok").stdout == "ok\n"
        assert Sandbox.connect(sbx.sandbox_id).traffic_access_token == token
        other = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
        try:
            assert other.traffic_access_token not in (None, token)
        finally:
            Sandbox.kill(other.sandbox_id)
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_public_sandbox_has_no_traffic_token(sandbox, server):
    # contract: X6 — allow_public_traffic absent: nothing changes.
    assert sandbox.traffic_access_token is None
    status, body = _to_port(server, sandbox.sandbox_id, 3000)
    assert status == 502
    assert body["message"] == "The sandbox is running but port is not open"
