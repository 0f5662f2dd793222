"""Delegated children each in a fork of the parent's sandbox (contract R15, ``subagents:
fork``). An adapter only: the fork, the base a child's work is measured from and the
bring-back are the native core's (``agent-sandbox/src/backend/subagent.rs``); this wires them
to Hermes' hooks, all feature-detected:

- ``subagent_start`` (the parent's thread, before the child runs): the child's task id gets
  an isolation override (``register_task_env_overrides``), so its tool calls key an
  environment of their own instead of collapsing onto the parent's;
- the child's first tool call creates that environment (``provider.create_environment``),
  which forks the parent's sandbox then: a child that never touches the sandbox costs
  nothing;
- ``subagent_stop`` (the parent's thread, once the children are done, before the parent's
  next tool call): the child's work comes back and its fork is killed;
- ``transform_tool_result`` on ``delegate_task``: the result the parent's model reads says
  what came back of each child.

Where a piece is missing, children share the parent's sandbox as Hermes has them do, and
``hermes e2b doctor`` says why in one row.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ._hermes import container_key, worktree_isolation
from .live import live_environments

logger = logging.getLogger("hermes_e2b")

#: The hooks this needs of the host, and the task-override function.
HOOKS = ("subagent_start", "subagent_stop", "transform_tool_result")

#: Why children share the parent's sandbox on this host (None: forks are possible).
_unsupported: Optional[str] = "the plugin was not registered"
_lock = threading.Lock()


@dataclass
class _Child:
    """One delegated child of a parent environment, from ``subagent_start`` on."""

    id: str
    parent_session: str
    child_session: str
    parent: "weakref.ref[Any]"
    #: The native ``Child`` once its fork is made.
    native: Any = None
    #: Why it runs in the parent's sandbox instead, when it does.
    shared_because: Optional[str] = None
    status: Optional[str] = None
    #: Its environment once made (a grandchild forks from it).
    env: Any = None


_children: dict[str, _Child] = {}
_by_session: dict[str, str] = {}
#: Per parent session: what came back of each child, for its ``delegate_task`` result.
_reports: dict[str, list[dict[str, Any]]] = {}


def unsupported() -> Optional[str]:
    """Why this host cannot fork children (None when it can)."""
    return _unsupported


def wanted(settings: Any) -> bool:
    """Whether children of an environment with ``settings`` should work in forks."""
    return getattr(settings, "subagents", "shared") == "fork" or worktree_isolation()


def register(ctx: Any) -> None:
    """Registers the three hooks where the host has them and can override a task's
    environment; otherwise records why children share the parent's sandbox."""
    global _unsupported
    hook = getattr(ctx, "register_hook", None)
    if hook is None:
        _unsupported = "this Hermes has no plugin hooks"
        return
    try:
        from tools.terminal_tool import register_task_env_overrides  # noqa: F401
    except ImportError:
        _unsupported = "this Hermes cannot give a task its own environment (no register_task_env_overrides)"
        return
    try:
        from hermes_cli.plugins import VALID_HOOKS
    except ImportError:
        VALID_HOOKS = set(HOOKS)
    missing = [name for name in HOOKS if name not in VALID_HOOKS]
    if missing:
        _unsupported = f"this Hermes has no {', '.join(missing)} hook"
        return
    try:
        hook("subagent_start", on_subagent_start)
        hook("subagent_stop", on_subagent_stop)
        hook("transform_tool_result", on_transform_tool_result)
        from . import live

        live.on_process_end(_on_process_end)
        live.on_closing(_on_closing)
        if "pre_llm_call" in VALID_HOOKS:
            # A detached delegation (a gateway chat's) ends after the turn that made it: what
            # came back reaches the parent's model at its next turn instead.
            hook("pre_llm_call", on_pre_llm_call)
    except Exception as error:  # noqa: BLE001 - a refused hook must not fail the load
        _unsupported = f"this Hermes refused the subagent hooks ({error})"
        return
    _unsupported = None


def _parent_environment(parent_subagent_id: Optional[str]) -> tuple[Any, Optional[str]]:
    """The environment of the parent of a child being started (in the parent's thread), or
    why there is none to fork."""
    if parent_subagent_id:
        with _lock:
            parent = _children.get(parent_subagent_id)
        if parent is not None:
            return parent.env, None if parent.env is not None else "its parent subagent has no sandbox yet"
    # The calling session's key, as the parent's own tool calls resolve it; never another
    # session's sandbox (a gateway's other chats), whatever is live.
    env = live_environments().get(container_key())
    if env is None:
        return None, "the parent has no E2B sandbox yet (it ran no tool in one)"
    return env, None


def on_subagent_start(child_subagent_id: Any = None, parent_session_id: Any = None,
                      child_session_id: Any = None, parent_subagent_id: Any = None, **_: Any) -> None:
    """Gives the child its own environment key; its fork is made at its first tool call."""
    if _unsupported is not None or not isinstance(child_subagent_id, str) or not child_subagent_id:
        return None
    parent, why = _parent_environment(parent_subagent_id if isinstance(parent_subagent_id, str) else None)
    if parent is None:
        logger.info("hermes-e2b: subagent %s works in its parent's sandbox: %s", child_subagent_id, why)
        return None
    if not wanted(getattr(parent, "_settings", None)):
        return None
    from tools.terminal_tool import register_task_env_overrides

    child = _Child(id=child_subagent_id, parent_session=str(parent_session_id or ""),
                   child_session=str(child_session_id or ""), parent=weakref.ref(parent))
    if isinstance(parent, _SharedEnvironment):
        # Its parent subagent had no fork: the grandchild works where it did (its own key, so
        # that environment's end is not the grandchild's to decide).
        child.shared_because = "is nested under a subagent without a fork: it worked in the parent's sandbox"
    with _lock:
        _children[child.id] = child
        if child.child_session:
            _by_session[child.child_session] = child.id
    # Any isolation key will do: it makes the child's calls key their own environment,
    # which this plugin's provider creates (env_type is not read for plugin backends).
    register_task_env_overrides(child.id, {"env_type": "e2b"})
    return None


def claim(task_id: str) -> Optional[_Child]:
    """The child whose environment Hermes is creating under ``task_id`` (its id, qualified
    by a routed profile's scope), if any."""
    with _lock:
        for child in _children.values():
            if task_id == child.id or task_id.endswith(":" + child.id):
                return child
    return None


def child_environment(child: _Child, make: Callable[[Any, Any], Any]) -> Any:
    """The child's environment: its parent's sandbox forked now, run through ``make(native
    backend, parent environment)``; where the fork cannot be made (the account's limit, a
    refusal), the parent's sandbox, through a stand-in whose cleanup leaves it alone, and
    the reason goes into the child's report."""
    parent = child.parent()
    if parent is None:
        raise RuntimeError(f"subagent {child.id}: its parent's environment is gone")
    if child.shared_because is not None:
        child.env = _SharedEnvironment(parent, child.id)
        return child.env
    from . import _native

    try:
        native = parent._native.fork_child(child.id, parent.cwd)
    except _native.E2BError as error:
        child.shared_because = f"had no fork ({error}): it worked in the parent's sandbox"
        logger.warning("hermes-e2b: subagent %s %s", child.id, child.shared_because)
        child.env = _SharedEnvironment(parent, child.id)
        return child.env
    child.native = native
    logger.info("hermes-e2b: subagent %s works in fork %s of %s", child.id, native.sandbox_id,
                parent.sandbox_id)
    env = make(native.backend(child.id), parent)
    # Its own children (nested delegation) find it is a child's.
    env._subagent_of = child.id
    child.env = env
    return env


class _SharedEnvironment:
    """The parent's environment as a child's: every call goes to it, but the child's end does
    not tear it down."""

    def __init__(self, parent: Any, child_id: str) -> None:
        object.__setattr__(self, "_parent", parent)
        object.__setattr__(self, "_subagent_of", child_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parent, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._parent, name, value)

    def cleanup(self) -> None:
        return None


def on_subagent_stop(child_session_id: Any = None, child_status: Any = None,
                     parent_session_id: Any = None, **_: Any) -> None:
    """Brings the child's work back into the parent's sandbox and ends its fork (the
    parent's thread, before its next tool call)."""
    with _lock:
        child_id = _by_session.pop(str(child_session_id or ""), None)
        child = _children.pop(child_id, None) if child_id else None
    if child is None:
        return None
    child.status = str(child_status) if child_status else None
    report: dict[str, Any] = {"subagent": child.id, "status": child.status}
    if child.native is None:
        report["came_back"] = (f"Subagent {child.id} {child.shared_because}." if child.shared_because
                               else f"Subagent {child.id} used no sandbox: nothing to bring back.")
    else:
        from . import _native

        try:
            back = child.native.bring_back()
            branches = [b for b in back["branches"] if b["commits"]]
            report.update({"came_back": back["summary"], "branches": branches,
                           "branch": branches[0]["branch"] if branches else None, "written": back["written"],
                           "deleted": back["deleted"], "elsewhere": back["elsewhere"], "compared": back["compared"],
                           "unread": back["unread"],
                           "conflicts": [{"path": p, "subagent_version": b} for p, b in back["conflicts"]],
                           "hermes_home": {"written": back["state_written"],
                                           "conflicts": [{"path": p, "subagent_version": b}
                                                         for p, b in back["state_beside"]]}})
            handed = _handed_off(child)
            if handed:
                held = _hold(child, handed)
                report["handed_off"] = held["handed_off"]
                report["came_back"] += held["_came_back_tail"]
            elif getattr(getattr(child.parent(), "_settings", None), "subagent_forks", "kill") == "keep":
                child.native.keep()
                report["came_back"] += f" Its fork {child.native.sandbox_id} is kept, paused (subagent_forks: keep)."
            else:
                child.native.end()
        except _native.E2BError as error:
            report["came_back"] = (f"Subagent {child.id}'s work could not be brought back ({error}); its fork "
                                   f"{child.native.sandbox_id} is kept: hermes e2b list shows it")
            logger.warning("hermes-e2b: %s", report["came_back"])
    logger.info("hermes-e2b: subagent %s ended (%s): %s", child.id, child.status or "no status", report["came_back"])
    with _lock:
        _reports.setdefault(str(parent_session_id or child.parent_session), []).append(report)
    return None


# --- processes a child handed off to its parent -------------------------------------------

@dataclass
class _Held:
    """A child's fork kept running after its work came back, for the processes it handed off
    to its parent (Hermes' ``process_manage handoff``), and the ports they serve in it."""

    child: _Child
    sessions: set = field(default_factory=set)
    ports: list = field(default_factory=list)


#: Kept forks, by child id.
_held: dict[str, _Held] = {}


def _handed_off(child: _Child) -> list[Any]:
    """The background processes of the child's fork that it handed off to its parent: still
    running, and owned by another than the child (a handoff gives the parent its ownership;
    Hermes kills what the child still owned when it closed)."""
    env = child.env
    if env is None or isinstance(env, _SharedEnvironment):
        return []
    try:
        from tools.process_registry import process_registry
    except ImportError:
        return []
    with process_registry._lock:
        running = list(process_registry._running.values())
    def the_childs(owner: Any) -> bool:
        owner = str(owner or "")
        return owner == child.id or owner.endswith(":" + child.id)

    return [s for s in running
            if getattr(s, "env_ref", None) is env and not s.exited and not the_childs(getattr(s, "owner_task_id", ""))]


def _hold(child: _Child, handed: list[Any]) -> dict[str, Any]:
    """Keeps the child's fork for the processes it handed off: each listening port reachable
    from the parent's sandbox (as it is, or forwarded through the host), the fork ended when
    the last of them ends or the parent's environment closes. What the parent's model reads
    of it."""
    parent = child.parent()
    held = _Held(child=child, sessions={s.id for s in handed})
    entries = []
    for session in handed:
        ports = []
        if parent is not None:
            try:
                shared = parent._native.share_ports(child.env._native, session.id)
            except Exception as error:  # noqa: BLE001 - said in the result, the process runs on
                logger.warning("hermes-e2b: the ports of %s could not be shared: %s", session.id, error)
                shared = []
            held.ports.extend(shared)
            ports = [{"port": p.port, "reachable": p.kind != "refused", **({"reason": p.reason} if p.reason else {})}
                     for p in shared]
        entries.append({"session_id": session.id, "command": session.command, "ports": ports})
    what = "; ".join(f"process {e['session_id']} ({e['command'][:60]}) handed off to its parent" for e in entries)
    child.native.hold(what)
    child.env._held_for = what
    with _lock:
        _held[child.id] = held
    reachable = sorted({p["port"] for e in entries for p in e["ports"] if p["reachable"]})
    refused = [f"{p['port']} ({p['reason']})" for e in entries for p in e["ports"] if not p["reachable"]]
    text = (f" Its fork {child.native.sandbox_id} keeps running the process(es) it handed off to you "
            f"({', '.join(e['session_id'] for e in entries)}): process_manage reaches them, and the fork ends "
            f"when they do.")
    if reachable:
        text += f" Port(s) {', '.join(map(str, reachable))} are reachable from this sandbox (localhost)."
    if refused:
        text += f" Not reachable from here: port(s) {', '.join(refused)}."
    logger.info("hermes-e2b: subagent %s's fork %s kept for %s", child.id, child.native.sandbox_id, what)
    return {"handed_off": entries, "_came_back_tail": text}


def _release(held: _Held, why: str) -> None:
    """Ends a kept fork: its forwards, then the fork."""
    for port in held.ports:
        try:
            port.stop()
        except Exception:  # noqa: BLE001 - the fork's end closes what is left
            pass
    try:
        held.child.native.end()
        logger.info("hermes-e2b: subagent %s's kept fork ended (%s)", held.child.id, why)
    except Exception as error:  # noqa: BLE001 - hermes e2b list shows a fork left behind
        logger.warning("hermes-e2b: subagent %s's kept fork was not ended (%s): %s", held.child.id, why, error)
    env = held.child.env
    if env is not None:
        # Its environment was spared Hermes' cleanup while it held the fork: closed now.
        env._held_for = None
        try:
            env.cleanup()
        except Exception as error:  # noqa: BLE001 - the fork is gone either way
            logger.debug("hermes-e2b: subagent %s's environment cleanup: %s", held.child.id, error)


def _on_process_end(session: Any) -> None:
    """A handed-off process ended: its fork ends with the last of them."""
    with _lock:
        done = [key for key, held in _held.items() if session.id in held.sessions]
        released = []
        for key in done:
            held = _held[key]
            held.sessions.discard(session.id)
            if not held.sessions:
                released.append(_held.pop(key))
    for held in released:
        _release(held, f"its last handed-off process {session.id} ended")


def _on_closing(env: Any) -> None:
    """The parent's environment closes: the forks kept for its processes end with it (as the
    processes would in its own sandbox when Hermes ends them with its session)."""
    with _lock:
        keys = [key for key, held in _held.items() if held.child.parent() is env]
        released = [_held.pop(key) for key in keys]
    for held in released:
        _release(held, "its parent's environment closed")


def on_transform_tool_result(tool_name: Any = None, result: Any = None, session_id: Any = None,
                             **_: Any) -> Optional[str]:
    """Adds what came back of each child to the ``delegate_task`` result the parent's model
    reads."""
    if tool_name != "delegate_task":
        return None
    with _lock:
        reports = _reports.pop(str(session_id or ""), None)
    if not reports:
        return None
    text = result if isinstance(result, str) else json.dumps(result)
    try:
        parsed = json.loads(text)
    except (TypeError, ValueError):
        parsed = None
    if isinstance(parsed, dict):
        parsed["subagent_sandboxes"] = reports
        return json.dumps(parsed)
    return text + "\n\nSubagent sandboxes:\n" + "\n".join(r["came_back"] for r in reports)


def on_pre_llm_call(session_id: Any = None, **_: Any) -> Optional[dict[str, str]]:
    """What came back of children that ended after the parent's ``delegate_task`` returned (a
    detached delegation), as context for the parent's next turn; once."""
    with _lock:
        reports = _reports.pop(str(session_id or ""), None)
    if not reports:
        return None
    lines = [f"{r['came_back']} (its run: {r['status'] or 'no status'})" for r in reports]
    return {"context": "Subagent sandboxes, since the delegation returned:\n" + "\n".join(lines)}


def doctor_row(settings: Any) -> Optional[tuple[bool, str, str]]:
    """The "E2B subagents" row when forks are asked for: that they are made, or why not. None
    with `subagents: shared` (Hermes' own behaviour, nothing to report)."""
    if not wanted(settings):
        return None
    if _unsupported is not None:
        return (False, "E2B subagents", f"fork asked for, but children share the parent's sandbox: {_unsupported}")
    return (True, "E2B subagents", "fork: each delegated child works in its own fork of the parent's sandbox; its "
            "work comes back when it ends (a hermes-subagent/<id> branch per git work tree it changed, its other "
            "files under its home and the directories it worked in; what it changed elsewhere named)")
