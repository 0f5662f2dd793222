"""The live E2B environments of this process, by task, and the turn checkpoints asked of
them: what the environment writes and the checkpoint commands read; and the checkpoint calls
both a live environment and the commands' scope stand-in make (``CheckpointCalls``).

Below both ``environment`` and ``checkpoints`` (it imports neither), so neither has to
import the other.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

_live: "dict[str, weakref.ref[Any]]" = {}
_live_lock = threading.Lock()
#: Per task: the (session, turn) whose checkpoint is taken or pending, and the pending label.
_turn_seen: dict[str, tuple[str, str]] = {}
_turn_pending: dict[str, str] = {}


class _Listeners:
    """Callables told of one kind of event, each once however often it is added; called
    outside the lock, so a listener may add or call others."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[Any], None]] = []

    def add(self, listener: Callable[[Any], None]) -> None:
        with _live_lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def call(self, subject: Any) -> None:
        with _live_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(subject)


#: Called with each environment once attached (a restarted Hermes' background processes wait
#: for their scope's environment to follow them again).
_attached = _Listeners()
#: Called with each background session whose live process ended, and with each environment
#: about to close (a subagent's fork kept for a process it handed off ends with them).
_ended = _Listeners()
_closing = _Listeners()


def register_environment(task_id: str, env: Any) -> None:
    """Called by each E2BEnvironment once attached: the slash commands and the tool find the
    session's sandbox through it."""
    with _live_lock:
        _live[task_id] = weakref.ref(env)


def on_attach(listener: Callable[[Any], None]) -> None:
    """``listener(env)`` is called each time an environment attaches (once per listener)."""
    _attached.add(listener)


def attached(env: Any) -> None:
    """Called by an environment once attached: tells the listeners. A listener's failure is
    its own (logged by it); the environment goes on."""
    _attached.call(env)


def on_process_end(listener: Callable[[Any], None]) -> None:
    """``listener(session)`` is called when a live background process has ended."""
    _ended.add(listener)


def process_ended(session: Any) -> None:
    """Called by a live process's reader once its session is finished."""
    _ended.call(session)


def on_closing(listener: Callable[[Any], None]) -> None:
    """``listener(env)`` is called when an environment is about to clean up."""
    _closing.add(listener)


def closing(env: Any) -> None:
    """Called by an environment at the start of its cleanup."""
    _closing.call(env)


def live_environments() -> dict[str, Any]:
    """The environments still open, by task."""
    with _live_lock:
        found = {task: ref() for task, ref in _live.items()}
    return {task: env for task, env in found.items() if env is not None and not getattr(env, "_closed", False)}


def request_turn(task_id: str, session_id: str, turn_id: str, label: str) -> bool:
    """Asks for one turn checkpoint of ``task_id`` for this (session, turn); False when this
    turn already asked."""
    if _turn_seen.get(task_id) == (session_id, turn_id):
        return False
    _turn_seen[task_id] = (session_id, turn_id)
    _turn_pending[task_id] = label
    return True


def take_pending_turn(task_id: str) -> Optional[str]:
    """The label of a turn checkpoint the hook asked for, once."""
    return _turn_pending.pop(task_id, None)


class CheckpointCalls:
    """The checkpoint calls the slash commands and the agent's tool make, on ``_native`` (a
    native Backend) with ``_settings`` (the plugin's settings): shared by a live environment
    and the scope stand-in the slash commands use when none is live."""

    _native: Any
    _settings: Any

    @property
    def turns_enabled(self) -> bool:
        return self._settings.turn_checkpoints > 0

    def checkpoint(self, label: Optional[str] = None, reason: str = "manual") -> dict:
        return self._native.checkpoint(label, reason=reason)

    def checkpoints(self) -> list:
        return self._native.checkpoints()

    def rollback(self, name: Optional[str] = None) -> dict:
        return self._native.rollback(name)

    def turn_checkpoints(self) -> list:
        return self._native.turn_checkpoints()

    def restore_turn(self, number: int) -> dict:
        return self._native.restore_turn(number, keep=max(1, self._settings.turn_checkpoints))
