"""Header rules naming an E2B Secret through the SDK's own calls: `Secret.fill(name)` in a
rule's header value at `Sandbox.create`, the secret's value at the upstream, and one
`Secret.update` in force at the live sandbox's next request. The upstream is the plain-HTTP
recorder of test_network_transform on an address of its own."""

import json
import os

import pytest
from e2b import Sandbox

from conftest import LocalServer, _use
from test_network_transform import Upstream

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="e2b-local enforces network rules only as root (it refuses them otherwise)"
)

NAME = "api.secrets.test"
ADDRESS = "127.62.9.4"
FIRST = "conformance-secret-value-first"
SECOND = "conformance-secret-value-second"


@pytest.fixture(scope="module")
def secrets_server():
    srv = LocalServer(extra_args=["--add-host", f"{NAME}:{ADDRESS}"])
    mp = pytest.MonkeyPatch()
    _use(srv, mp)
    yield srv
    mp.undo()
    srv.stop()


def fetch(sbx, path):
    return sbx.commands.run(
        f"curl -sS -H 'X-Api-Key: stand-in' http://{NAME}{path} 2>&1 || true"
    ).stdout


def test_a_rule_naming_a_secret_sends_its_current_value(secrets_server, unique):
    # contract: X21
    try:
        from e2b import Secret
    except ImportError as error:
        pytest.skip(f"the installed e2b has no Secret API: {error}")
    name = f"key-{unique}"
    Secret.create(name, FIRST)
    upstream = Upstream(ADDRESS)
    placeholder = f"Key {Secret.fill(name)}"
    rules = {NAME: [{"transform": {"headers": {"X-Api-Key": placeholder}}}]}
    sbx = Sandbox.create(timeout=120, network={"rules": rules})
    try:
        assert fetch(sbx, "/a") == "seen"
        assert [seen["x-api-key"] for seen in upstream.seen] == [[f"Key {FIRST}"]]

        # The sandbox's rules hold the placeholder, never the value.
        network = json.loads(json.dumps(sbx.get_info().network))
        assert network.get("rules") == rules, network
        assert "secret-value" not in json.dumps(network)

        # One update of the secret, no sandbox touched: the next request has the new value.
        Secret.update(name, SECOND)
        upstream.seen.clear()
        assert fetch(sbx, "/b") == "seen"
        assert [seen["x-api-key"] for seen in upstream.seen] == [[f"Key {SECOND}"]]
    finally:
        Sandbox.kill(sbx.sandbox_id)
        upstream.close()
        Secret.destroy(name)
