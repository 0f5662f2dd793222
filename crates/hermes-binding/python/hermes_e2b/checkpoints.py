"""Checkpoints, rollback and turn checkpoints for Hermes users: the slash commands, the
agent's tool, the ``pre_tool_call`` hook and the scope backend ``hermes e2b`` uses.

An adapter only: what a checkpoint is, who may take one, what a rollback keeps and how a turn
checkpoint is stored are the native core's (agent-sandbox, contract R1-R10).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
from typing import Any, Callable, Iterator, Optional

from ._core import redact
from ._hermes import session_identity
from .live import CheckpointCalls, live_environments, request_turn

logger = logging.getLogger("hermes_e2b")

#: The slash commands (Hermes' own ``/rollback``, ``/snapshot`` and ``/undo`` are left alone).
SLASH_CHECKPOINT = "sandbox-checkpoint"
SLASH_CHECKPOINTS = "sandbox-checkpoints"
SLASH_ROLLBACK = "sandbox-rollback"
#: The agent's tool (``checkpoint_tool: true``).
TOOL_NAME = "sandbox_checkpoint"
TOOLSET = "e2b"
#: Tools that change files: the first call of one in a turn takes a turn checkpoint. A
#: terminal command counts when Hermes' own heuristic calls it destructive.
FILE_TOOLS = frozenset({"write_file", "patch"})

_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


# --- the pre_tool_call hook (turn checkpoints) ------------------------------------------


def _destructive(command: Any) -> bool:
    try:  # Hermes' own heuristic (the one its /rollback uses on the local backend)
        from agent.tool_dispatch_helpers import _is_destructive_command
    except ImportError:
        return False
    try:
        return bool(_is_destructive_command(str(command or "")))
    except Exception:  # noqa: BLE001 - a heuristic that fails is no reason to fail a tool
        return False


def on_pre_tool_call(tool_name: str = "", args: Any = None, task_id: str = "", session_id: str = "",
                     turn_id: str = "", **_: Any) -> None:
    """Marks the first file-changing tool call of a turn: the environment of ``task_id`` takes
    one turn checkpoint before its next command (R9). Costs nothing here."""
    args = args if isinstance(args, dict) else {}
    changes_files = tool_name in FILE_TOOLS or (tool_name == "terminal" and _destructive(args.get("command")))
    if not changes_files:
        return None
    if not turn_id:
        _warn_once("turn_id", "hermes-e2b: this Hermes passes no turn_id to pre_tool_call; "
                   "turn checkpoints are not taken (E2B checkpoints still work)")
        return None
    request_turn(task_id or "default", session_id, turn_id, f"turn {turn_id[-12:]}: before {tool_name}")
    return None


# --- a backend for a scope outside any session (hermes e2b) -----------------------------


@contextlib.contextmanager
def scope_backend(settings: Any, task_id: str, chat: Optional[str] = None) -> Iterator[Any]:
    """The scope's native Backend as a session would hold it (persistent, Hermes' state
    transport), cleaned up at the end: the writer's pull and release. ``chat``: a gateway
    chat's key, whose sandbox gets only the attachments it named (X19), as its session's."""
    from . import _native
    from ._hermes import host_only_paths, lifetime_seconds, profile_home, resolve_api_key, resolve_credential
    from .environment import _StateHooks

    home = profile_home()
    hooks = _StateHooks()
    backend = _native.Backend(
        settings,
        profile_home=str(home),
        task_id=task_id,
        mode="persistent",
        lifetime_seconds=lifetime_seconds(),
        key_resolver=resolve_api_key,
        hooks=hooks,
        host_only=host_only_paths(home),
        credential_resolver=resolve_credential,
        chat=chat,
    )
    hooks.sync_state = backend.sync_state
    try:
        yield backend
    finally:
        if backend.sandbox_id is not None:
            backend.cleanup()


# --- words --------------------------------------------------------------------------------


def describe(checkpoint: dict) -> str:
    """One line per checkpoint: its label (an unnamed one is known by its id), reason, time
    and source sandbox."""
    name = checkpoint["label"] or "(unnamed)"
    return f"{name}  [{checkpoint['reason']}] {checkpoint['taken_at_utc']} UTC, from {checkpoint['source_sandbox']}"


def describe_with_id(checkpoint: dict) -> str:
    return f"{describe(checkpoint)}\n    id {checkpoint['snapshot_id']}"


def describe_turn(turn: dict) -> str:
    return (f"turn #{turn['number']}  {turn['label']}  {turn['taken_at_utc']} UTC, "
            f"{turn['directory']} ({turn['entries']} entries, {turn['bytes'] // 1024} KiB)")


def rollback_lines(report: dict, task_id: str = "default") -> list[str]:
    """What a rollback did, and the command that undoes it as it can be pasted: with the
    task when it is not the CLI's default (a gateway chat's scope)."""
    undo = report["undo"]
    task = "" if task_id == "default" else f" --task {shlex.quote(task_id)}"
    lines = [
        f"Rolled back to {describe(report['restored'])}.",
        f"Sandbox {report['retired_sandbox']} was replaced by {report['sandbox_id']}; "
        f"skills/ and memories/ are the newest ({report['recovered']['restored']} files recovered from the old one).",
        f"Undo: hermes e2b rollback {shlex.quote(undo['snapshot_id'])}{task}",
    ]
    return lines + [f"Warning: {w}" for w in report["warnings"]]


def turn_restore_lines(report: dict) -> list[str]:
    return [
        f"Restored {describe_turn(report['restored'])}.",
        f"Undo: /{SLASH_ROLLBACK} --turn {report['undo']['number']}  "
        f"(or hermes e2b rollback --turn {report['undo']['number']})",
    ]


def _message(error: Exception) -> str:
    return redact(str(error))


# --- the slash commands -------------------------------------------------------------------


def _session_env(task_id: Optional[str] = None, session_id: Optional[str] = None) -> tuple[Optional[Any], Optional[str]]:
    """The calling session's live environment: the one Hermes names (a host that passes the
    task), else the one created in this chat (the gateway's session key) or this session (its
    id), else the only one live. In a chat, never another chat's sandbox. ``(None, None)``
    when none is live for the caller: the commands then act on the caller's scope directly
    (:func:`_session_scope`); ``(None, why)`` when the caller's sandbox cannot be told."""
    envs = live_environments()
    if task_id and task_id in envs:
        return envs[task_id], None
    key, current_id = session_identity()
    current_id = session_id or current_id
    if key or current_id:
        def belongs(task: str, env: Any) -> bool:
            env_key, env_id = getattr(env, "_session_identity", ("", ""))
            if key:
                return env_key == key
            return current_id in (env_id, task)
        mine = [env for task, env in envs.items() if belongs(task, env)]
        if len(mine) == 1:
            return mine[0], None
        if key:
            return None, (None if not mine else f"{len(mine)} E2B sandboxes are live for this chat's session; "
                          "use `hermes e2b checkpoint --task ID` instead")
    if len(envs) == 1:
        return next(iter(envs.values())), None
    if not envs:
        return None, None
    return None, (f"{len(envs)} E2B sandboxes are live in this process ({', '.join(sorted(envs))}); "
                  "use `hermes e2b checkpoint --task ID` instead")


class _ScopeTarget(CheckpointCalls):
    """The caller's scope when no environment of it is live (a gateway restarted, Hermes'
    idle reaper closed it): the environment's checkpoint calls on a scope backend, the one
    ``hermes e2b … --task`` uses, found by the scope's E2B metadata."""

    def __init__(self, backend: Any, settings: Any, task_id: str) -> None:
        self._native = backend
        self._settings = settings
        self._task_id = task_id


#: The plugin context ``register`` was given: the slash commands read the settings through it.
_context: Any = None


@contextlib.contextmanager
def _session_scope(task_id: Optional[str], session_id: Optional[str]) -> Iterator[Any]:
    """What a slash command acts on: the caller's live environment, else its scope as Hermes
    keys it for this chat or session (the chat's ``session:<key>``), through a scope backend
    cleaned up at the end. Raises ``LookupError`` with the reason when the caller's sandbox
    cannot be told apart."""
    env, why = _session_env(task_id, session_id)
    if env is not None:
        yield env
        return
    if why is not None:
        raise LookupError(why)
    from . import chats
    from ._hermes import container_key, profile_settings

    settings = profile_settings(_context)
    task = container_key(task_id)
    chat = (session_identity()[0] or None) if chats.tracking() else None
    with scope_backend(settings, task, chat) as backend:
        yield _ScopeTarget(backend, settings, task)


def slash_checkpoint(raw_args: str = "", *, task_id: Optional[str] = None, session_id: Optional[str] = None,
                     **_: Any) -> str:
    label = raw_args.strip() or None
    try:
        with _session_scope(task_id, session_id) as env:
            checkpoint = env.checkpoint(label=label, reason="manual")
    except Exception as error:  # noqa: BLE001 - the error is the answer
        return f"/{SLASH_CHECKPOINT}: {_message(error)}"
    return f"Checkpoint taken: {describe(checkpoint)}"


def slash_checkpoints(raw_args: str = "", *, task_id: Optional[str] = None, session_id: Optional[str] = None,
                      **_: Any) -> str:
    try:
        with _session_scope(task_id, session_id) as env:
            checkpoints = env.checkpoints()
            turns = env.turn_checkpoints() if env.turns_enabled else []
    except Exception as error:  # noqa: BLE001
        return f"/{SLASH_CHECKPOINTS}: {_message(error)}"
    lines = [describe_with_id(c) for c in checkpoints] or ["No checkpoints of this scope."]
    if turns:
        lines += ["Turn checkpoints (in the sandbox):"] + [f"  {describe_turn(t)}" for t in turns]
    return "\n".join(lines)


def slash_rollback(raw_args: str = "", *, task_id: Optional[str] = None, session_id: Optional[str] = None,
                   **_: Any) -> str:
    # A chat user adds --yes as on the CLI; a slash command never asks anyway.
    words = [word for word in raw_args.split() if word != "--yes"]
    turn = words[:1] == ["--turn"] and len(words) == 2 and words[1].isdigit()
    if not turn and (len(words) > 1 or (words and words[0].startswith("-") and words[0] != "--last")):
        return f"usage: /{SLASH_ROLLBACK} NAME | --last | --turn N"
    try:
        with _session_scope(task_id, session_id) as env:
            if turn:
                return "\n".join(turn_restore_lines(env.restore_turn(int(words[1]))))
            name = None if not words or words[0] == "--last" else words[0]
            return "\n".join(rollback_lines(env.rollback(name), getattr(env, "_task_id", "default")))
    except Exception as error:  # noqa: BLE001
        return f"/{SLASH_ROLLBACK}: {_message(error)}"


# --- the agent's tool ---------------------------------------------------------------------

TOOL_SCHEMA = {
    "name": TOOL_NAME,
    "description": (
        "Checkpoints of this E2B sandbox (files, installed packages). Call action=create with a "
        "short name before a risky step (a migration, an upgrade, a large deletion); call "
        "action=restore with that name after it failed, to put the sandbox back. Your memories "
        "and skills are kept across a restore. action=list shows the checkpoints."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["create", "list", "restore"]},
            "name": {"type": "string", "description": "create: a short name; restore: the name or id (omit for the latest)"},
        },
        "required": ["action"],
    },
}


def tool_handler(args: dict, task_id: Optional[str] = None, **_: Any) -> str:
    """The tool's handler: JSON in Hermes' tool-result shape."""
    action = (args or {}).get("action")
    name = (args or {}).get("name") or None
    if action not in ("create", "list", "restore"):
        return json.dumps({"error": "action must be create, list or restore"})
    live = live_environments().get(task_id or "default")
    try:
        with (contextlib.nullcontext(live) if live is not None else _session_scope(task_id, None)) as env:
            if action == "create":
                return json.dumps({"checkpoint": env.checkpoint(label=name, reason="agent")})
            if action == "list":
                return json.dumps({"checkpoints": env.checkpoints()})
            report = env.rollback(name)
            return json.dumps({"restored": report["restored"], "undo": report["undo"],
                               "sandbox_id": report["sandbox_id"], "warnings": report["warnings"]})
    except Exception as error:  # noqa: BLE001 - the agent reads the error
        return json.dumps({"error": _message(error)})


def _setting(ctx: Any, key: str) -> bool:
    """A boolean plugin setting as config.yaml holds it now; False when it cannot be read."""
    get_config = getattr(ctx, "get_config", None)
    try:
        return bool(get_config(key, False)) if get_config else False
    except Exception:  # noqa: BLE001 - an unreadable config.yaml is reported by the doctor
        return False


def tool_available(ctx: Any) -> Callable[[], bool]:
    """The tool's check_fn: offered only with ``checkpoint_tool: true`` and the e2b backend."""

    def check() -> bool:
        if not _setting(ctx, "checkpoint_tool"):
            return False
        try:
            from tools.terminal_scope import terminal_env

            backend = str(terminal_env("TERMINAL_ENV") or "").lower()
        except Exception:  # noqa: BLE001 - no way to tell: the setting decides
            return True
        # Unset (the config is not bridged into this process yet): the setting decides.
        return backend in ("", "e2b")

    return check


def register(ctx: Any) -> None:
    """Registers what the host supports (each feature-detected): the slash commands, the
    agent's tool and the turn hook."""
    global _context
    _context = ctx
    command = getattr(ctx, "register_command", None)
    if command is not None:
        for name, handler, description, hint in (
            (SLASH_CHECKPOINT, slash_checkpoint, "Checkpoint this E2B sandbox (an E2B snapshot)", "[name]"),
            (SLASH_CHECKPOINTS, slash_checkpoints, "List this E2B sandbox's checkpoints", ""),
            (SLASH_ROLLBACK, slash_rollback, "Roll this E2B sandbox back to a checkpoint", "NAME|--last|--turn N"),
        ):
            try:
                command(name, handler, description=description, args_hint=hint)
            except Exception as error:  # noqa: BLE001 - a refused command must not fail the load
                logger.warning("hermes-e2b: /%s is not registered: %s", name, error)
    tool = getattr(ctx, "register_tool", None)
    # Only with ``checkpoint_tool: true`` when the plugin loads: a registered tool's toolset
    # shows in `hermes doctor`'s Tool Availability, and an unavailable one reads
    # "e2b (system dependency not met)", as if the plugin were broken.
    if tool is not None and _setting(ctx, "checkpoint_tool"):
        try:
            tool(name=TOOL_NAME, toolset=TOOLSET, schema=TOOL_SCHEMA, handler=tool_handler,
                 check_fn=tool_available(ctx), description=TOOL_SCHEMA["description"])
        except Exception as error:  # noqa: BLE001
            logger.warning("hermes-e2b: the %s tool is not registered: %s", TOOL_NAME, error)
    hook = getattr(ctx, "register_hook", None)
    if hook is not None:
        try:
            hook("pre_tool_call", on_pre_tool_call)
        except Exception as error:  # noqa: BLE001
            logger.warning("hermes-e2b: turn checkpoints are off (pre_tool_call refused: %s)", error)
