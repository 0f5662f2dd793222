"""Fresh Hermes sessions whose first tool calls race, through a real Hermes and the plugin.

Each iteration builds a new environment for the session (Hermes' ``cleanup_vm`` drops the
previous one, so the next tool call constructs a fresh native backend, as a new Hermes
process does), then makes the session's first tool calls:

- ``first-execute-code``: ``execute_code`` alone (Hermes' remote kernel: a detached runner,
  then a cell poll loop and a tool-RPC poll loop calling ``env.execute`` from two threads);
- ``concurrent``: ``execute_code``, a terminal command, ``write_file`` and ``read_file`` at once,
  from four threads.

Every few iterations the sandbox is killed through e2b-local's REST API, so the next session
creates one instead of resuming. With ``faults``, each iteration first sets a random e2b-local
fault (latency, a failed request, a dropped connection or stream).

What is checked is that every call ENDS: a call that outlives its deadline (the tool's timeout
plus the plugin's stated grace, contract O7) makes ``faulthandler`` dump every Python thread's
stack and end the driver; the runner then adds the native threads' stacks (``gdb``, when
installed) before it reports the hang. Failed calls under injected faults are counted, not
judged: an error is an ending.

Used by ``test_tool_call_stress.py`` (a few iterations in every run) and ``scripts/stress``
(hundreds, with and without faults).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

#: The tool timeout the driver gives every call (terminal.timeout and code_execution.timeout).
CALL_TIMEOUT = 20
#: The plugin's stated grace past a call's timeout (contract O7; the native core's
#: ``WATCHDOG_GRACE``), plus Hermes' own retry backoff of a failed terminal command (2+4+8 s).
GRACE = 45 + 14

DRIVER = """
import faulthandler, http.client, json, random, sys, threading, time, urllib.request
from hermes_cli.env_loader import load_hermes_dotenv
load_hermes_dotenv()
from hermes_cli.plugins import discover_plugins
discover_plugins()
import tools.terminal_tool as tt
from tools.code_execution_tool import execute_code
from tools.file_tools import write_file_tool, read_file_tool
from tools.terminal_tool_lifecycle import cleanup_vm
from tools.code_kernel_remote import shutdown_all_remote_kernels

CFG = json.loads(sys.argv[1])
stacks = open(CFG["stacks"], "w")
api = CFG["api_url"]

def rest(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    # An armed drop-connections fault takes the next connection e2b-local accepts, before
    # it sees the path: when the plugin's pooled connections left it unused, that is this
    # driver's own. A dropped connection was never handled, so sending again is safe.
    for attempt in range(3):
        request = urllib.request.Request(api + path, data=data, method=method,
                                         headers={"X-API-Key": "e2b_stress_admin", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
            return json.loads(raw) if raw else None
        except (ConnectionResetError, http.client.RemoteDisconnected):
            if attempt == 2:
                raise

def ours():
    listed = rest("GET", "/v2/sandboxes?state=running,paused") or []
    return [s["sandboxID"] for s in listed if (s.get("metadata") or {}).get("stress") == CFG["tag"]]

FAULTS = [
    ("latency", lambda rng: rest("POST", "/_e2b_local/faults/latency", {"ms": rng.choice([5, 20, 80])})),
    ("fail", lambda rng: rest("POST", "/_e2b_local/faults/fail", {"count": 1, "status": rng.choice([500, 502, 503]), "scope": rng.choice(["rest", "envd", "any"])})),
    ("drop-connection", lambda rng: rest("POST", "/_e2b_local/faults/drop-connections", {"count": 1})),
    ("drop-stream", lambda rng: rest("POST", "/_e2b_local/faults/drop-stream", {"count": 1, "afterBytes": rng.choice([0, 40, 400]), "scope": "envd"})),
]

def call(name, fn, out):
    started = time.monotonic()
    try:
        result = fn()
        ok = True
    except Exception as error:  # an error is an ending; the hang is what is looked for
        result, ok = f"{type(error).__name__}: {error}", False
    out[name] = {"seconds": time.monotonic() - started, "ok": ok and isinstance(result, dict) and JUDGE[name](result), "result": json.dumps(result)[:400]}

def first_execute_code(i):
    out = {}
    call("execute_code", lambda: json.loads(execute_code(f"print({i} * 2)", task_id="s")), out)
    return out

def concurrent(i):
    out = {}
    work = {
        "execute_code": lambda: json.loads(execute_code(f"print({i} * 2)", task_id="s")),
        "terminal": lambda: json.loads(tt.terminal_tool(f"echo t{i}", task_id="s")),
        "write_file": lambda: json.loads(write_file_tool(f"/home/user/w{i}.txt", f"w{i}\\n", task_id="s")),
        "read_file": lambda: json.loads(read_file_tool("/etc/hostname", task_id="s")),
    }
    threads = [threading.Thread(target=call, args=(name, fn, out), name=name) for name, fn in work.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out

JUDGE = {
    "execute_code": lambda r: r.get("status") == "success",
    "terminal": lambda r: r.get("exit_code") == 0,
    "write_file": lambda r: not r.get("error"),
    "read_file": lambda r: not r.get("error"),
}
VARIANTS = {"first-execute-code": first_execute_code, "concurrent": concurrent}
rng = random.Random(CFG["seed"])
report = {"iterations": 0, "calls": 0, "failed_calls": 0, "faults": {}, "slowest": 0.0, "bad_output": [], "failures": []}
for i in range(CFG["iterations"]):
    # Every Python thread's stack, then the end of this process, when an iteration outlives
    # its calls' deadline: faulthandler's own thread does it, GIL or not.
    faulthandler.dump_traceback_later(CFG["iteration_limit"], exit=True, file=stacks)
    fault = None
    if CFG["faults"]:
        fault, arm = rng.choice(FAULTS)
        arm(rng)
        report["faults"][fault] = report["faults"].get(fault, 0) + 1
    out = VARIANTS[CFG["variant"]](i)
    faulthandler.cancel_dump_traceback_later()
    if CFG["faults"]:
        rest("POST", "/_e2b_local/faults/clear")
    report["iterations"] += 1
    for name, entry in out.items():
        report["calls"] += 1
        report["slowest"] = max(report["slowest"], entry["seconds"])
        text = entry["result"]
        failed = not entry["ok"] or (name == "execute_code" and str(i * 2) not in text)
        if failed:
            report["failed_calls"] += 1
            if not CFG["faults"] and len(report["failures"]) < 5:
                report["failures"].append({"iteration": i, "call": name, "result": text[:400]})
    # A fresh session next time, as a new Hermes process has: no kernel, no environment (the
    # native backend goes with it). CLI sessions share one environment key per profile.
    shutdown_all_remote_kernels()
    for key in {"s", tt._resolve_container_task_id("s")}:
        cleanup_vm(key)
    with tt._env_lock:
        assert not tt._active_environments, "the session's environment was dropped"
    if i % CFG["kill_every"] == CFG["kill_every"] - 1:
        for sandbox_id in ours():
            rest("DELETE", f"/sandboxes/{sandbox_id}")
print("RESULT:" + json.dumps(report))
"""


def native_stacks(pid: int) -> str:
    """Every native thread's stack of `pid` (gdb, when this host has it)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(gdb is not installed: no native stacks)"
    try:
        done = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                              capture_output=True, text=True, timeout=120)
        return done.stdout[-200_000:]
    except subprocess.TimeoutExpired:
        return "(gdb did not finish in 120 s)"


def run(home: Any, server: Any, *, variant: str, iterations: int, faults: bool, seed: int,
        kill_every: int = 5) -> dict:
    """Runs the driver in a fresh Hermes process; returns its report, or raises AssertionError
    with every thread's stack when a call outlived its deadline."""
    tag = f"stress-{variant}-{seed}"
    home.write_config(settings=server.settings(metadata={"stress": tag}),
                      terminal={"timeout": CALL_TIMEOUT})
    config = json.loads((home.path / "config.yaml").read_text())
    config["code_execution"] = {"timeout": CALL_TIMEOUT}
    (home.path / "config.yaml").write_text(json.dumps(config, indent=2))
    home.write_key()
    workdir = Path(tempfile.mkdtemp(prefix="hermes-e2b-stress-"))
    stacks = workdir / "python-stacks.txt"
    # The concurrent variant's calls run side by side; the first-call variant's one after
    # another within an iteration, and an iteration holds at most a handful of env.execute
    # calls in sequence (kernel spawn, cell, RPC): CALL_TIMEOUT + GRACE bounds each.
    iteration_limit = 4 * (CALL_TIMEOUT + GRACE)
    cfg = {"variant": variant, "iterations": iterations, "faults": faults, "seed": seed, "tag": tag,
           "api_url": server.api_url, "stacks": str(stacks), "iteration_limit": iteration_limit,
           "kill_every": kill_every}
    from conftest import NETWORK_GUARD  # the same loopback-only guard as every driver

    code = NETWORK_GUARD + "\n" + textwrap.dedent(DRIVER)
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)],
                            env=home.env(), cwd=home.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    # The driver's own faulthandler ends it on a hang; this bound is for a driver so stuck that
    # even that cannot run (then the native stacks are all there is).
    overall = iterations * iteration_limit + 120
    try:
        stdout, stderr = proc.communicate(timeout=overall)
    except subprocess.TimeoutExpired:
        native = native_stacks(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the stress driver outlived {overall} s\nnative stacks:\n{native}\n"
                             f"python stacks:\n{stacks.read_text()}\nstderr:\n{stderr[-4000:]}")
    for line in stdout.splitlines():
        if line.startswith("RESULT:"):
            shutil.rmtree(workdir, ignore_errors=True)
            return json.loads(line[len("RESULT:"):])
    dumped = stacks.read_text()
    if not dumped:
        # faulthandler writes the stacks before it ends a driver whose call outlived its
        # deadline; without them the driver itself failed, which is not a hang.
        raise RuntimeError(f"the stress driver failed (rc {proc.returncode}) before its report:\n{stderr[-4000:]}")
    raise AssertionError(f"a call outlived its deadline (driver rc {proc.returncode}); every Python thread's "
                         f"stack when it did:\n{dumped}\nstderr:\n{stderr[-4000:]}")


def main() -> int:
    """scripts/stress: hundreds of iterations of each variant, with and without faults."""
    import argparse

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import HermesHome, LocalServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--variant", choices=["first-execute-code", "concurrent", "all"], default="all")
    parser.add_argument("--faults", choices=["off", "on", "both"], default="both")
    args = parser.parse_args()
    server = LocalServer()
    status = 0
    try:
        variants = ["first-execute-code", "concurrent"] if args.variant == "all" else [args.variant]
        fault_modes = {"off": [False], "on": [True], "both": [False, True]}[args.faults]
        for variant in variants:
            for faults in fault_modes:
                home = HermesHome(Path(tempfile.mkdtemp(prefix="hermes-e2b-stress-home-")) / "home")
                started = time.monotonic()
                try:
                    report = run(home, server, variant=variant, iterations=args.iterations, faults=faults,
                                 seed=args.seed)
                except AssertionError as error:
                    print(f"HANG {variant} faults={'on' if faults else 'off'}:\n{error}")
                    status = 1
                    continue
                except RuntimeError as error:
                    print(f"FAILED {variant} faults={'on' if faults else 'off'}:\n{error}")
                    status = 1
                    continue
                wall = time.monotonic() - started
                print(f"{variant:<18} faults={'on ' if faults else 'off'} iterations={report['iterations']} "
                      f"calls={report['calls']} failed={report['failed_calls']} slowest={report['slowest']:.1f}s "
                      f"wall={wall:.0f}s faults_set={report['faults']}")
                if not faults and report["failed_calls"]:
                    print(f"  failures without faults: {json.dumps(report['failures'], indent=1)}")
                    status = 1
    finally:
        server.stop()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
