"""One Hermes host process of the campaign: a real Hermes (its terminal tool, lifecycle and
FileSyncManager) with the hermes-e2b plugin as `terminal.backend: e2b`, driven from standard
input with campaign-host's line protocol.

    <hermes python> hermes_host.py <api url> <hermes home> <task id> <push log>
    <hermes python> hermes_host.py --bootstrap

The campaign writes `config.yaml` and `.env` in the Hermes home and starts this with
HERMES_HOME set to it. Commands, one per line: `attach`, `run <shell command>`, `pause <ms>`,
`cleanup`, `finalize`, `quit`; the answers are campaign-host's (`attached <sandbox id>
<role>`, `exit <code> <output, escaped>`, `paused`, `cleanup <pull outcome>`, `finalized`,
`error <message>`), and so are the events `phase push` / `phase pull`; before anything else
it says `ready` once Hermes has started. `--bootstrap` starts Hermes as a host does and exits
before any terminal use: the campaign runs it once first, to fail early without Hermes or the
wheel and to learn what Hermes itself puts in its home.

`run` is Hermes' `terminal_tool` (admission, the plugin's push through Hermes'
`iter_sync_files`, the command); `cleanup` is Hermes' `cleanup_vm` (the plugin's teardown:
Hermes' own `sync_back`, then the backend's recovery). `attach` is the first use of the
terminal tool, the way Hermes brings an environment up: a no-op command. The plugin's state
hooks and the uploads of Hermes' manager are wrapped only to observe them: the `phase` events
(`phase push` as an upload starts) and the push log's `B`/`E` lines around each push, which
the campaign needs for its kills at a transfer and its "never two pushers" check; the push and
the pull themselves are Hermes'.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

# Hermes (and the plugin's logging) may print to standard output; only the protocol goes to
# the campaign: the real stdout is kept for it, and fd 1 becomes stderr for everything else.
_PROTOCOL = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr
_EMIT = threading.Lock()

#: The deadline of every `run`, as campaign-host's (seconds).
RUN_TIMEOUT = 30
#: Largest command output kept for the answer line, as campaign-host's.
OUTPUT_CAP = 4096


def emit(line: str) -> None:
    # Hooks run on whatever thread Hermes calls in on: one line at a time.
    with _EMIT:
        _PROTOCOL.write(line.replace("\n", " ") + "\n")
        _PROTOCOL.flush()


def log_push(path: str, mark: str) -> None:
    # One short O_APPEND write per line: lines of different processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{mark} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def start_hermes() -> None:
    # As the CLI does: the profile's .env (the API key), then the plugins.
    from hermes_cli.env_loader import load_hermes_dotenv

    load_hermes_dotenv()
    from hermes_cli.plugins import discover_plugins

    discover_plugins()
    import tools.terminal_tool  # noqa: F401 - Hermes' own start-up of the tool
    from hermes_e2b import _native  # noqa: F401 - the wheel's compiled core is there


def main() -> int:
    if sys.argv[1:] == ["--bootstrap"]:
        start_hermes()
        return 0
    if len(sys.argv) != 5:
        print("usage: hermes_host.py <api url> <hermes home> <task id> <push log>", file=sys.stderr)
        return 2
    _url, home, task, push_log = sys.argv[1:]
    if os.path.realpath(os.environ.get("HERMES_HOME", "")) != os.path.realpath(home):
        print("hermes_host.py: HERMES_HOME must be the campaign's Hermes home", file=sys.stderr)
        return 2

    start_hermes()
    import tools.terminal_tool as tt
    from tools.terminal_tool_lifecycle import cleanup_vm
    from hermes_e2b import environment

    pulls: list[str] = []
    hooks = environment._StateHooks
    original_push, original_pull = hooks.push, hooks.pull

    def push(self, transport, kind):
        log_push(push_log, "B")
        try:
            original_push(self, transport, kind)
        finally:
            # A failed push has ended too: the role may pass to another process next.
            log_push(push_log, "E")

    # Most pushes find nothing changed (Hermes diffs by mtime); `phase push` marks the ones
    # that transfer: Hermes' manager calls `_push` only with files to upload or delete.
    original_transfer = environment._SyncManager._push

    def transfer(self, to_upload, to_delete):
        emit("phase push")
        original_transfer(self, to_upload, to_delete)

    def pull(self, transport):
        emit("phase pull")
        pulls.append("started")
        original_pull(self, transport)
        pulls[-1] = "ran"

    hooks.push, hooks.pull = push, pull
    environment._SyncManager._push = transfer
    # Hermes is up: the campaign starts the cycle's fault clock on this line.
    emit("ready")

    def terminal(command: str) -> dict:
        return json.loads(tt.terminal_tool(command, task_id=task, timeout=RUN_TIMEOUT))

    def environment_of_task():
        # Hermes keys the persistent environment by its container task ("default" in the CLI).
        return next(iter(tt._active_environments.values()), None)

    for line in sys.stdin:
        line = line.rstrip("\n")
        verb, _, rest = line.partition(" ")
        if verb == "quit":
            break
        try:
            if verb == "attach":
                result = terminal("true")
                env = environment_of_task()
                if result.get("error") or env is None:
                    answer = f"error {result.get('error') or 'no environment'}"
                else:
                    role = env._native.attach()["role"]
                    answer = f"attached {env.sandbox_id} {str(role).capitalize()}"
            elif verb == "run":
                result = terminal(rest)
                if result.get("error"):
                    answer = f"error {result['error']}"
                else:
                    output = (result.get("output") or "")[:OUTPUT_CAP]
                    answer = f"exit {result.get('exit_code')} {escape(output)}"
            elif verb == "pause":
                time.sleep(int(rest) / 1000)
                answer = "paused"
            elif verb == "cleanup":
                pulls.clear()
                # Hermes' own teardown of the task's environment (never raises).
                cleanup_vm(task)
                answer = f"cleanup {pulls[-1] if pulls else 'none'}"
            elif verb == "finalize":
                env = environment_of_task()
                if env is not None:
                    env._native.finalize()
                answer = "finalized"
            else:
                answer = f"error unknown command {verb!r}"
        except Exception as error:  # noqa: BLE001 - reported as the answer, as campaign-host does
            answer = f"error {type(error).__name__}: {error}"
        emit(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
