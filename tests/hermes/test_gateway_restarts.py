"""A gateway restarted under the account's limit (issue 34; contracts L15, L16): a real
`hermes gateway run` (api_server platform, scripted model) serves three times as many chats
as e2b-local's `--max-running` lets run, and is restarted five times in a row, after a crash
(SIGKILL: its sandboxes still running on their leases) and cleanly (SIGTERM). After every
restart every chat, old and new, is served in its own sandbox with its files, the limit is
never passed, and no shutdown logs an ERROR."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from agent_harness import Gateway, NetGuard, agent_config, write_agent_config
from conftest import LocalServer, assert_no_key
from scripted_model import Reply, ToolCall, scripted_model  # noqa: F401 - fixture
from test_first_contact import limits

LIMIT = 3
CHATS = 3 * LIMIT
#: The bound stated for one chat's turn after a restart: well above a resume's cost, well
#: below the leases (300 s) a predecessor's sandboxes would otherwise hold their slots for.
TURN_BOUND_SECONDS = 60


@pytest.fixture
def limited():
    server = LocalServer("--max-running", str(LIMIT))
    yield server
    server.stop()


@pytest.fixture
def guard(tmp_path: Path) -> NetGuard:
    return NetGuard(tmp_path / "netguard")


class RunningSampler(threading.Thread):
    """Samples e2b-local's count of running sandboxes until stopped; keeps the highest."""

    def __init__(self, server: LocalServer) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.highest = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.highest = max(self.highest, limits(self.server)["running"])
            self.samples += 1
            self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


def test_every_chat_is_served_after_each_restart_under_the_limit(home, limited, scripted_model, guard):
    # contract: L15, L16
    tag = uuid.uuid4().hex
    short = tag[:8]
    settings = limited.settings(metadata={"test": tag}, slot_wait_seconds=TURN_BOUND_SECONDS)
    write_agent_config(home, agent_config(scripted_model, settings))
    home.write_key()
    chats = [f"chat-{n}-{short}" for n in range(CHATS)]

    def turn(gateway: Gateway, life: int, n: int, results: dict) -> None:
        marker = f"L{life}C{n}-{tag[:12]}"
        # The first life writes each chat's mark; every later one reads it back.
        command = f"echo {chats[n]} > ~/mark; cat ~/mark" if life == 0 else "cat ~/mark"
        scripted_model.register(marker, [ToolCall("terminal", {"command": command}), Reply(f"done {marker}")])
        started = time.monotonic()
        reply = gateway.chat(f"turn {marker}", session_id=chats[n], timeout=TURN_BOUND_SECONDS * 3)
        took = time.monotonic() - started
        result = scripted_model.tool_result(marker, 0)
        results[n] = {"reply": reply, "expected": f"done {marker}", "seconds": took,
                      "output": result.get("output") if isinstance(result, dict) else result}

    def serve_all(gateway: Gateway, life: int) -> dict:
        results: dict = {}
        # Three chats at a time: as many as may run at once.
        for first in range(0, CHATS, LIMIT):
            threads = [threading.Thread(target=turn, args=(gateway, life, n, results))
                       for n in range(first, first + LIMIT)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(TURN_BOUND_SECONDS * 4)
        return results

    sampler = RunningSampler(limited)
    sampler.start()
    gateway = Gateway(home, guard)
    lives = ["first", "sigkill", "sigterm", "sigkill", "sigterm", "sigkill"]
    slowest = 0.0
    try:
        for life, how in enumerate(lives):
            if life > 0:
                if how == "sigkill":
                    assert gateway.kill() == -signal.SIGKILL
                else:
                    rc = gateway.stop(signal.SIGTERM)
                    assert rc in (0, 1), f"SIGTERM exit code {rc}\n{gateway.tail()}"
            gateway.start()
            results = serve_all(gateway, life)
            assert sorted(results) == list(range(CHATS)), f"life {life} ({how}): {results}\n{gateway.tail()}"
            for n, result in results.items():
                assert result["reply"] == result["expected"], (life, how, n, result)
                assert result["output"].strip() == chats[n], (life, how, n, result)
                assert result["seconds"] < TURN_BOUND_SECONDS, (life, how, n, result)
                slowest = max(slowest, result["seconds"])
        rc = gateway.stop(signal.SIGTERM)
        assert rc in (0, 1), f"SIGTERM exit code {rc}\n{gateway.tail()}"
    finally:
        gateway.close()
        sampler.stop()
    print(f"slowest turn after a restart: {slowest:.1f} s; highest running count: {sampler.highest} "
          f"({sampler.samples} samples)")
    assert sampler.samples > 0 and sampler.highest <= LIMIT, sampler.highest
    # No shutdown or teardown logged an ERROR (a pull the limit defers is one INFO line).
    errors = [line for line in gateway.log_lines() if " ERROR " in line and ("E2B" in line or "e2b" in line)]
    assert errors == [], "\n".join(errors)
    assert guard.attempts() == [], f"Hermes tried to leave loopback:\n{guard.stacks()}"
    assert_no_key("\n".join(gateway.log_lines()), json.dumps(scripted_model.requests))
