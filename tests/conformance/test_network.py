"""Egress rules through the SDK's own calls: `network=` at create, `update_network`, and
the `network` of `get_info`, enforced on the sandbox's processes. Listeners of this test
on loopback addresses other than 127.0.0.1 stand in for the internet."""

import os
import socket
import threading

import pytest
from e2b import ALL_TRAFFIC, Sandbox

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="e2b-local enforces egress rules only as root (it refuses them otherwise)"
)


class Host:
    """Accepts connections on `ip`, records the first line of each and answers `ack`."""

    def __init__(self, ip, port=0):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, port))
        self.sock.listen()
        self.ip, self.port = self.sock.getsockname()
        self.seen = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(4096)
                self.seen.append(data)
                if data.startswith(b"GET "):
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nreached")
                else:
                    conn.sendall(b"ack\n")

    def close(self):
        self.sock.close()


def dial(sbx, host, text):
    """`ok` when the sandbox reached `host` (and it answered), else the error."""
    result = sbx.commands.run(
        f"(exec 3<>/dev/tcp/{host.ip}/{host.port} && printf '{text}\\n' >&3 && read -r ack <&3"
        f" && echo ok) 2>&1 || true"
    )
    return result.stdout.strip()


def test_create_with_rules_reaches_only_what_they_allow(server):
    allowed, denied = Host("127.62.0.2"), Host("127.62.0.3")
    sbx = Sandbox.create(
        timeout=120, network={"allow_out": ["127.62.0.2"], "deny_out": [ALL_TRAFFIC]}
    )
    try:
        assert dial(sbx, allowed, "a") == "ok"
        assert "Connection refused" in dial(sbx, denied, "d")
        assert allowed.seen == [b"a\n"] and denied.seen == []
        network = sbx.get_info().network
        assert network["allow_out"] == ["127.62.0.2"]
        assert network["deny_out"] == [ALL_TRAFFIC]
    finally:
        Sandbox.kill(sbx.sandbox_id)
        allowed.close()
        denied.close()


def test_update_network_replaces_the_rules_live(server):
    host = Host("127.62.1.2")
    sbx = Sandbox.create(timeout=120, network={"deny_out": [ALL_TRAFFIC]})
    try:
        assert "Connection refused" in dial(sbx, host, "before")
        sbx.update_network({"allow_out": ["127.62.1.0/24"], "deny_out": [ALL_TRAFFIC]})
        assert dial(sbx, host, "allowed") == "ok"
        assert sbx.get_info().network["allow_out"] == ["127.62.1.0/24"]
        # The class-method form, and replace semantics: an empty update clears every rule.
        Sandbox.update_network(sbx.sandbox_id, {"deny_out": ["127.62.1.2"]})
        assert "Connection refused" in dial(sbx, host, "denied")
        sbx.update_network({})
        assert dial(sbx, host, "cleared") == "ok"
        assert host.seen == [b"allowed\n", b"cleared\n"]
    finally:
        Sandbox.kill(sbx.sandbox_id)
        host.close()


def test_a_domain_rule_allows_by_host_header(server):
    http = Host("127.62.2.2", 80)
    sbx = Sandbox.create(
        timeout=120, network={"allow_out": ["*.allowed.test"], "deny_out": [ALL_TRAFFIC]}
    )
    try:
        curl = "curl -s -m 10 -H 'Host: {}' http://127.62.2.2/ || echo failed"
        assert sbx.commands.run(curl.format("api.allowed.test")).stdout == "reached"
        assert sbx.commands.run(curl.format("evil.test")).stdout.strip() == "failed"
        assert len(http.seen) == 1 and b"Host: api.allowed.test" in http.seen[0]
    finally:
        Sandbox.kill(sbx.sandbox_id)
        http.close()


def test_rules_e2b_local_cannot_take_are_refused_with_the_reason(server):
    with pytest.raises(Exception) as refused:
        Sandbox.create(timeout=60, network={"deny_out": ["example.com"]})
    assert "only in allowOut" in str(refused.value)
    sbx = Sandbox.create(timeout=60)
    try:
        with pytest.raises(Exception) as refused:
            sbx.update_network({"deny_out": ["example.com"]})
        assert "only in allowOut" in str(refused.value)
    finally:
        Sandbox.kill(sbx.sandbox_id)
