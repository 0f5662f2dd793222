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
    srv = LocalServer(extra_args=["--add-host", f"{NAME}:{ADDRESS}", "--add-host", f"{OTHER}:{OTHER_ADDRESS}"])
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
