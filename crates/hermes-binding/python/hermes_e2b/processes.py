"""Hermes' background processes as live processes (contract O9). An adapter only: the
process, its stream, stdin, terminal, signals and what survives a pause are the native
core's (``agent-sandbox``'s ``live``); this puts them where Hermes' process registry looks.

On every remote backend Hermes starts ``terminal(background=true)`` with ``nohup`` and a log
file that a poller thread reads with a command every 2 s (``spawn_via_env``); stdin and
``pty=true`` exist only locally. For an environment of this backend the spawn
(``tools/terminal_tool_background.py::_spawn``, which gets ``pty``) starts a live process
instead, tracked by Hermes' own registry with a reader thread as its local processes are
(``_track_started``): the output reaches the session as it is written, so ``poll``,
``log``, ``wait``, ``notify_on_complete`` and ``watch_patterns`` are Hermes' own over it.
The registry's stdin operations and its kill go to the live process for such a session
(``write_stdin``, ``close_stdin``, ``_signal_kill``, wrapped on the one registry instance).
A restarted Hermes recovers the sandbox processes its checkpoint lists, following each once
its scope's environment attaches (``recover_from_checkpoint``); a gateway's watcher of a
live process looks every quarter second (in memory, no request), so a completion starts the
chat's next turn at once. Anything else goes to Hermes' own code, unchanged.
"""

from __future__ import annotations

import codecs
import contextvars
import json
import logging
import sys
import threading
import time
from typing import Any, Optional

from . import live

logger = logging.getLogger("hermes_e2b")

#: Why background processes use Hermes' own poller on this host (None: live processes are
#: installed). Read by ``hermes e2b doctor``.
_unsupported: Optional[str] = "the plugin was not registered"

#: The terminal Hermes gives its local PTYs: 30 rows, 120 columns.
PTY_SIZE = (30, 120)

#: How often a gateway's watcher of a live process looks at it (in memory).
LIVE_WATCH_INTERVAL = 0.25

#: What is attached to a session of Hermes' registry.
_LIVE = "_hermes_e2b_live"
_PTY = "_hermes_e2b_pty"

#: Recovered sessions waiting for their scope's environment, by task.
_pending: dict[str, list[Any]] = {}
_pending_lock = threading.Lock()


def unsupported() -> Optional[str]:
    """Why this host's background processes use Hermes' own poller (None when they are live)."""
    return _unsupported


def _registry() -> Any:
    from tools.process_registry import process_registry

    return process_registry


def install() -> None:
    """Wraps the spawn, the registry's stdin operations and kill, and its recovery, where this
    Hermes has every piece they use; otherwise records why not."""
    global _unsupported
    try:
        import tools.terminal_tool_background as background
        registry = _registry()
    except ImportError as error:
        _unsupported = f"this Hermes has no background-process registry to run live ({error})"
        return
    if not callable(getattr(background, "_spawn", None)):
        _unsupported = "this Hermes' tools/terminal_tool_background.py has no _spawn"
        return
    needed = ("_new_session", "_track_started", "_finish_exited", "write_stdin", "close_stdin",
              "_signal_kill", "recover_from_checkpoint", "get")
    missing = [name for name in needed if not callable(getattr(registry, name, None))]
    if missing:
        _unsupported = f"this Hermes' process registry has no {', '.join(missing)}"
        return
    if getattr(background._spawn, "_hermes_e2b_original", None) is None:
        original_spawn = background._spawn

        def _spawn(process_registry: Any, *, env: Any, env_type: str, **kwargs: Any) -> Any:
            # What this spawn does not know (another Hermes' routing, say) keeps Hermes' own.
            unknown = set(kwargs) - _SPAWN_PARAMETERS
            if env_type == "local" or not getattr(env, "live_tools", False) or unknown:
                return original_spawn(process_registry, env=env, env_type=env_type, **kwargs)
            return spawn(process_registry, env=env, **kwargs)

        _spawn._hermes_e2b_original = original_spawn  # type: ignore[attr-defined]
        _spawn.__wrapped__ = original_spawn  # type: ignore[attr-defined]
        background._spawn = _spawn
    if getattr(registry.write_stdin, "_hermes_e2b_original", None) is None:
        _wrap(registry, "write_stdin", _write_stdin)
        _wrap(registry, "close_stdin", _close_stdin)
        _wrap(registry, "_signal_kill", _signal_kill)
        _wrap(registry, "recover_from_checkpoint", _recover_from_checkpoint)
    live.on_attach(_follow_pending)
    _watch_gateway()
    _unsupported = None


def _wrap(registry: Any, name: str, replacement: Any) -> None:
    """Puts ``replacement(original, *args)`` on the registry instance as ``name``."""
    original = getattr(registry, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return replacement(original, *args, **kwargs)

    wrapped._hermes_e2b_original = original  # type: ignore[attr-defined]
    setattr(registry, name, wrapped)


def _live_of(session: Any) -> Any:
    return getattr(session, _LIVE, None) if session is not None else None


def is_live(session_id: str) -> bool:
    """Whether Hermes' session ``session_id`` is one of this backend's live processes."""
    session = _registry().get(session_id)
    return session is not None and (_live_of(session) is not None or getattr(session, "_hermes_e2b_pending", False))


# --- spawn --------------------------------------------------------------------------------

#: The parameters of Hermes' ``_spawn`` (past the registry, ``env`` and ``env_type``) that
#: ``spawn`` takes.
_SPAWN_PARAMETERS = frozenset({"command", "cwd", "effective_task_id", "task_id", "session_key", "effective_pty",
                               "persist_on_release"})


def spawn(process_registry: Any, *, env: Any, command: str, cwd: Optional[str], effective_task_id: str,
          task_id: Optional[str], session_key: str, effective_pty: bool, persist_on_release: bool = False) -> Any:
    """Hermes' ``_spawn`` for this backend: a live process tracked as a session of Hermes'
    registry; a failure to start is a finished session, as Hermes' own spawn reports it."""
    session = process_registry._new_session(
        command, effective_task_id, task_id or effective_task_id, session_key, cwd, env_ref=env,
        pid_scope="sandbox", persist_on_release=persist_on_release)
    # As Hermes' local spawns: unbuffered Python output, and on a terminal no pager.
    variables = {"PYTHONUNBUFFERED": "1"}
    if effective_pty:
        variables.update(TERM="xterm-256color", GIT_PAGER="cat", PAGER="cat")
    try:
        process = env.start_live(session.id, command, cwd=cwd, env=variables,
                                 terminal=PTY_SIZE if effective_pty else None)
    except Exception as error:  # noqa: BLE001 - reported as Hermes reports a failed start
        session.mark_exited(-1, "failed_start", "failed_start")
        session.output_buffer = f"Failed to start: {error}"
        with process_registry._lock:
            process_registry._prune_if_needed()
        return session
    session.pid = process.sandbox_pid
    setattr(session, _LIVE, process)
    setattr(session, _PTY, bool(effective_pty))
    process_registry._track_started(session, _reader, f"proc-live-{session.id}")
    _watch_gateway()
    return session


def _ingest(registry: Any, session: Any, text: str) -> None:
    ingest = getattr(registry, "_ingest_output", None)
    if callable(ingest):
        ingest(session, text, unless_exited=True)
        return
    if session.append_output_if_running(text):
        registry._check_watch_patterns(session, text)


def _reader(session: Any) -> None:
    """The session's reader thread: the live process's output into Hermes' session as it
    arrives (watch patterns, the desktop's stream), then its end."""
    registry = _registry()
    process = _live_of(session)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while True:
            chunk = process.read()
            if chunk is None:
                break
            text = decoder.decode(chunk)
            if text:
                _ingest(registry, session, text)
    except Exception as error:  # noqa: BLE001 - the end below tells what is known
        logger.warning("hermes-e2b: reading background process %s failed: %s", session.id, error)
    tail = decoder.decode(b"", final=True)
    if tail:
        _ingest(registry, session, tail)
    end = process.end or {"kind": "detached"}
    kind = end.get("kind")
    if kind == "exited":
        registry._finish_exited(session, int(end.get("exit_code") or 0))
    elif kind == "killed":
        registry._finish_exited(session, -1)
    elif kind == "lost":
        reason = end.get("reason") or "its sandbox is gone"
        _ingest(registry, session, f"\n[hermes-e2b: the process was lost: {reason}]\n")
        registry._finish_exited(session, -1, reason="lost", source="backend_lost")
    else:
        # Not followed any more (this process's environment was cleaned up); it may still run
        # in the sandbox, and a restarted Hermes follows it again.
        logger.debug("hermes-e2b: background process %s is no longer followed", session.id)
        return
    live.process_ended(session)


# --- the registry's stdin operations and kill -----------------------------------------------

def _session_for_live(session_id: str) -> tuple[Any, Any]:
    registry = _registry()
    session = registry.get(session_id)
    if session is not None and _live_of(session) is None and getattr(session, "_hermes_e2b_pending", False):
        _follow_now(session)
    return session, _live_of(session)


def _write_stdin(original: Any, session_id: str, data: Any) -> dict:
    session, process = _session_for_live(session_id)
    if process is None:
        return original(session_id, data)
    if session.exited:
        return {"status": "already_exited", "error": "Process has already finished"}
    payload = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
    try:
        process.write(payload)
    except Exception as error:  # noqa: BLE001 - the tool's answer, as Hermes' own
        return {"status": "error", "error": str(error)}
    return {"status": "ok", "bytes_written": len(data)}


def _close_stdin(original: Any, session_id: str) -> dict:
    session, process = _session_for_live(session_id)
    if process is None:
        return original(session_id)
    if session.exited:
        return {"status": "already_exited", "error": "Process has already finished"}
    try:
        if getattr(session, _PTY, False):
            # A terminal's end of file is a character (what Hermes' local PTY sends).
            process.write(b"\x04")
            return {"status": "ok", "message": "EOF sent"}
        process.close_stdin()
    except Exception as error:  # noqa: BLE001 - the tool's answer, as Hermes' own
        return {"status": "error", "error": str(error)}
    return {"status": "ok", "message": "stdin closed"}


def _signal_kill(original: Any, session: Any, session_id: str, consume_output: bool) -> Optional[dict]:
    if _live_of(session) is None and getattr(session, "_hermes_e2b_pending", False):
        _follow_now(session)
    process = _live_of(session)
    if process is None:
        return original(session, session_id, consume_output)
    # The command and everything it started, whatever group or session they moved to; Hermes'
    # kill_process then records it as killed. A failure raises into kill_process, which
    # answers with the error.
    process.signal("kill")
    return None


# --- a restarted Hermes ------------------------------------------------------------------

def _terminal_backend() -> str:
    try:
        from tools.terminal_tool import _get_env_config

        return str(_get_env_config().get("env_type") or "")
    except Exception:  # noqa: BLE001 - unknown: leave recovery to Hermes
        return ""


def _recover_from_checkpoint(original: Any) -> int:
    """Hermes' recovery, plus the sandbox processes of this backend its checkpoint lists:
    each becomes a running session again, followed once its scope's environment attaches
    (never attaching or resuming a sandbox by itself)."""
    recovered = 0
    if _terminal_backend() == "e2b" and _unsupported is None:
        try:
            recovered = _recover_live()
        except Exception as error:  # noqa: BLE001 - Hermes' own recovery still runs
            logger.warning("hermes-e2b: background processes were not recovered: %s", error)
    return recovered + original()


def _recover_live() -> int:
    from tools.process_registry import (
        _CHECKPOINT_DEFAULTS,
        _CHECKPOINT_FIELDS,
        _WATCHER_ROUTE_KEYS,
        ProcessSession,
        _checkpoint_path,
    )

    path = _checkpoint_path()
    if not path.exists():
        return 0
    try:
        entries = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return 0
    registry = _registry()
    recovered = 0
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("pid_scope") != "sandbox" or not entry.get("pid"):
            continue
        session_id = str(entry.get("session_id") or "")
        with registry._lock:
            if not session_id or session_id in registry._running:
                continue
        fields = {name: entry.get(name, _CHECKPOINT_DEFAULTS[name]) for name in _CHECKPOINT_FIELDS}
        fields.update(command=entry.get("command", "unknown"),
                      owner_task_id=entry.get("owner_task_id", "") or entry.get("task_id", ""),
                      started_at=entry.get("started_at", time.time()))
        session = ProcessSession(id=session_id, **fields)
        session._hermes_e2b_pending = True  # type: ignore[attr-defined]
        with registry._lock:
            registry._running[session.id] = session
        with _pending_lock:
            _pending.setdefault(session.task_id, []).append(session)
        recovered += 1
        logger.info("hermes-e2b: recovered background process %s (sandbox pid %s); followed from its "
                    "chat's next use of the sandbox", session.id, session.pid)
        if session.watcher_interval > 0:
            registry.pending_watchers.append({
                "session_id": session.id,
                "check_interval": session.watcher_interval,
                "session_key": session.session_key,
                **{key: getattr(session, f"watcher_{key}") for key in _WATCHER_ROUTE_KEYS},
                "notify_on_complete": session.notify_on_complete,
                "parent_session_id": session.parent_session_id,
            })
    if recovered:
        _watch_gateway()
    return recovered


def _follow_pending(env: Any) -> None:
    """An environment attached: the recovered processes of its task are followed now (their
    whole output, as far as the sandbox kept it)."""
    task = getattr(env, "_task_id", None)
    with _pending_lock:
        sessions = _pending.pop(task, []) if task is not None else []
    for session in sessions:
        _follow(session, env)


def _follow_now(session: Any) -> None:
    """A recovered process someone acts on before its chat used the sandbox: its environment
    is made now (the action is a use)."""
    with _pending_lock:
        waiting = _pending.get(session.task_id, [])
        if session in waiting:
            waiting.remove(session)
        else:
            return
    try:
        from tools.code_execution_tool import _get_or_create_env

        env, _ = _get_or_create_env(session.task_id)
    except Exception as error:  # noqa: BLE001 - the action then fails as Hermes' own would
        logger.warning("hermes-e2b: background process %s cannot be reached: %s", session.id, error)
        return
    _follow(session, env)


def _follow(session: Any, env: Any) -> None:
    native = getattr(env, "_native", None)
    sandbox = getattr(env, "sandbox_id", None)
    if native is None or not sandbox:
        return
    try:
        process = native.follow_live(session.id, sandbox, int(session.pid))
    except Exception as error:  # noqa: BLE001 - not a live process of this backend
        logger.warning("hermes-e2b: background process %s cannot be followed: %s", session.id, error)
        return
    session.env_ref = env
    setattr(session, _LIVE, process)
    session._hermes_e2b_pending = False  # type: ignore[attr-defined]
    reader = threading.Thread(target=contextvars.copy_context().run, args=(_reader, session),
                              daemon=True, name=f"proc-live-{session.id}")
    session._reader_thread = reader
    reader.start()


# --- a gateway's watchers -----------------------------------------------------------------

def _watch_gateway() -> None:
    """In a gateway, its watcher of a live process looks every quarter second (in memory): the
    completion starts the chat's next turn within a second of the exit, not at Hermes' 5 s."""
    module = sys.modules.get("gateway.run_notifications")
    mixin = getattr(module, "GatewayNotificationsMixin", None) if module is not None else None
    watcher = getattr(mixin, "_run_process_watcher", None)
    if watcher is None or getattr(watcher, "_hermes_e2b_original", None) is not None:
        return

    async def _run_process_watcher(self: Any, descriptor: dict) -> None:
        if is_live(str(descriptor.get("session_id") or "")):
            descriptor = {**descriptor, "check_interval": min(
                float(descriptor.get("check_interval") or LIVE_WATCH_INTERVAL), LIVE_WATCH_INTERVAL)}
        return await watcher(self, descriptor)

    _run_process_watcher._hermes_e2b_original = watcher  # type: ignore[attr-defined]
    _run_process_watcher.__doc__ = watcher.__doc__
    mixin._run_process_watcher = _run_process_watcher


def doctor_row(settings: Any) -> tuple[bool, str, str]:
    """Which path background processes take on this host, and why."""
    if not getattr(settings, "live_tools", True):
        return (True, "E2B background processes", "Hermes' own poller (live_tools: false): a command every 2 s, no stdin")
    if _unsupported is not None:
        return (True, "E2B background processes", f"Hermes' own poller: {_unsupported}")
    return (True, "E2B background processes",
            "live: output streamed as written, stdin and pty=true, no polling")

