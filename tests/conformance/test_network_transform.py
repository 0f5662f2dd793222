"""Header rules (`network.rules`: per-domain transforms that set headers on the sandbox's
outgoing requests) through the SDK's own calls: at create, in `update_network`, and in
`get_info`. The upstream is a plain-HTTP service on a test address, named for every
sandbox by e2b-local's `--add-host`; what it records is what left the sandbox."""

import json
import os
import socket
import threading

import pytest
from e2b import Sandbox

from conftest import LocalServer, _use

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="e2b-local enforces network rules only as root (it refuses them otherwise)"
)

NAME = "api.rules.test"
OTHER = "other.rules.test"
ADDRESS = "127.62.9.2"
OTHER_ADDRESS = "127.62.9.3"
# A relying party of workload tokens (`iam`): an STS stand-in.
STS = "sts.rules.test"
STS_ADDRESS = "127.62.9.6"


class Upstream:
    """Answers every HTTP/1.1 request on `ip`:80 with 200 and records its headers."""

    def __init__(self, ip):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, 80))
        self.sock.listen()
        self.seen = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        with conn, conn.makefile("rb") as reader:
            while True:
                line = reader.readline()
                if not line:
                    return
                headers = {}
                while True:
                    header = reader.readline()
                    if header in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = header.decode("latin-1").partition(":")
                    headers.setdefault(name.strip().lower(), []).append(value.strip())
                self.seen.append(headers)
                body = b"seen"
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n" + body)

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def rules_server():
    srv = LocalServer(
        extra_args=[
            "--add-host", f"{NAME}:{ADDRESS}",
            "--add-host", f"{OTHER}:{OTHER_ADDRESS}",
            "--add-host", f"{STS}:{STS_ADDRESS}",
        ]
    )
    mp = pytest.MonkeyPatch()
    _use(srv, mp)
    yield srv
    mp.undo()
    srv.stop()


def rules(value):
    return {NAME: [{"transform": {"headers": {"X-Api-Key": value}}}]}


def fetch(sbx, name, path):
    result = sbx.commands.run(
        f"curl -sS -H 'X-Api-Key: stand-in' http://{name}{path} http://{name}{path}/again 2>&1 || true"
    )
    return result.stdout


def test_rules_at_create_and_in_update_network_set_the_header_for_their_domain_only(rules_server):
    # contract: X13
    upstream, other = Upstream(ADDRESS), Upstream(OTHER_ADDRESS)
    sbx = Sandbox.create(timeout=120, network={"rules": rules("real-one")})
    try:
        # Two requests on one kept-alive connection: both carry the rule's value, replacing
        # the client's.
        assert fetch(sbx, NAME, "/a") == "seenseen"
        assert [seen["x-api-key"] for seen in upstream.seen] == [["real-one"], ["real-one"]]
        # A domain without rules gets what the client sent.
        assert fetch(sbx, OTHER, "/b") == "seenseen"
        assert [seen["x-api-key"] for seen in other.seen] == [["stand-in"], ["stand-in"]]

        # The rules as the SDK reads them back.
        network = sbx.get_info().network
        assert json.loads(json.dumps(network.get("rules"))) == rules("real-one"), network

        # An update is in force for the next request.
        sbx.update_network({"rules": rules("real-two")})
        upstream.seen.clear()
        assert fetch(sbx, NAME, "/c") == "seenseen"
        assert [seen["x-api-key"] for seen in upstream.seen] == [["real-two"], ["real-two"]]

        # No rules any more: nothing is set.
        sbx.update_network({})
        upstream.seen.clear()
        assert fetch(sbx, NAME, "/d") == "seenseen"
        assert [seen["x-api-key"] for seen in upstream.seen] == [["stand-in"], ["stand-in"]]
    finally:
        Sandbox.kill(sbx.sandbox_id)
        upstream.close()
        other.close()


def _b64json(part):
    import base64

    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def test_a_workload_token_is_minted_per_request_and_never_held_by_the_sandbox(rules_server):
    # contract: X25
    try:
        from e2b import Secret
    except ImportError:
        pytest.skip("this e2b has no Secret.iam_token")
    if not hasattr(Secret, "iam_token"):
        pytest.skip("this e2b has no Secret.iam_token (workload identity)")
    import urllib.request

    sts = Upstream(STS_ADDRESS)
    placeholder = "${e2b.identity.tokens.aws}"
    sbx = Sandbox.create(
        timeout=120,
        iam={"tokens": {"aws": Secret.iam_token(audience="sts.amazonaws.com", token_type="JWT-SVID")}},
        network={"rules": {STS: [{"transform": {"headers": {"Authorization": f"Bearer {placeholder}"}}}]}},
    )
    try:
        assert fetch(sbx, STS, "/assume") == "seenseen"
        tokens = [seen["authorization"][0].removeprefix("Bearer ") for seen in sts.seen]
        assert len(tokens) == 2 and tokens[0] != tokens[1], "a fresh token per request"
        with urllib.request.urlopen(f"{rules_server.api_url}/.well-known/jwks.json", timeout=30) as r:
            keys = json.loads(r.read())["keys"]
        for token in tokens:
            header, claims, signature = token.split(".")
            assert _b64json(header)["alg"] == "ES256"
            assert _b64json(header)["kid"] in [key["kid"] for key in keys]
            claims = _b64json(claims)
            assert claims["sub"] == f"spiffe://e2b-local/sandbox/{sbx.sandbox_id}"
            assert claims["aud"] == ["sts.amazonaws.com"]
            assert claims["iss"] == rules_server.api_url
            assert claims["exp"] - claims["iat"] == 300
            assert signature
        # The sandbox itself never sees a token: not in its environment, not in a file
        # it could read, only the placeholder its rule names.
        env = sbx.commands.run("env").stdout
        assert not any(token in env for token in tokens)
        # A rule naming a token the create did not register sends nothing: a 502 naming it.
        sbx.update_network({"rules": {STS: [{"transform": {"headers": {"X": "${e2b.identity.tokens.gcp}"}}}]}})
        sts.seen.clear()
        out = sbx.commands.run(f"curl -sS -o /dev/null -w '%{{http_code}}' http://{STS}/x || true").stdout
        assert out == "502" and sts.seen == []
    finally:
        Sandbox.kill(sbx.sandbox_id)
        sts.close()


def test_iam_tokens_e2b_would_refuse_are_refused(rules_server):
    # contract: X25
    for tokens, why in [
        ({"aws": {"audience": "x", "tokenType": "OIDC"}}, "JWT-SVID"),
        ({"aws": {"audience": "", "tokenType": "JWT-SVID"}}, "audience"),
    ]:
        request = urllib_request(rules_server, {"templateID": "base", "iam": {"tokens": tokens}})
        status, body = request
        assert status == 400 and why in body, body


def urllib_request(server, body):
    import urllib.error
    import urllib.request

    from conftest import API_KEY

    request = urllib.request.Request(
        f"{server.api_url}/sandboxes",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"X-API-Key": API_KEY, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
