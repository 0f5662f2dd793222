"""The Python half of the scale scenario, shared by peer.py (the SDK's `Sandbox` objects) and
hermes_row.py (Hermes' terminal environments through the plugin), so both measure alike and
alike with agent-sandbox-bench's `scale` (crates/bench/src/scenarios/scale.rs).

`scale(params, attach, run)`: the process's baseline (what it holds before any scope: the N=0
figure of this process kind), `attach(i)` for i in 0..scopes (each makes one scope and runs one
command in it), a settle, what it holds idle; then, on `go`, `rounds` commands per scope, at
most `workers` at once and never two on one scope (`run(scope)` returns the exit code), each
timed. Speaks the same stdin/stdout protocol as the other scenario processes.
"""

import json
import os
import resource
import sys
import threading
import time


def status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def held():
    """RSS, threads and open descriptors of this process, from /proc/self."""
    return {
        "rss_kib": status_kib("VmRSS"),
        "threads": len(os.listdir("/proc/self/task")),
        # The listing's own descriptor is counted, as in every measurement here and in Rust.
        "fds": len(os.listdir("/proc/self/fd")),
    }


def cpu_seconds():
    """The CPU time this process has spent so far, user and system, every thread included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _expect(word):
    line = sys.stdin.readline()
    if line.strip() != word:
        raise RuntimeError(f"expected {word!r} from the orchestrator, got {line!r}")


def quantile(ordered, q):
    if not ordered:
        return None
    return ordered[round((len(ordered) - 1) * q)]


def scale(params, attach, run):
    scopes, rounds = params["scopes"], params["rounds"]
    workers = max(1, min(params["workers"], scopes))
    baseline = held()
    attach_started = time.perf_counter()
    attached = [attach(index) for index in range(scopes)]
    attach_s = time.perf_counter() - attach_started
    # What attaching started and let go (an idle worker thread, a closed connection) is given
    # time to go, so what remains is what idle scopes hold.
    time.sleep(params["settle_ms"] / 1000)
    idle = held()

    print("ready", flush=True)
    _expect("go")
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        reset = True
    except OSError:
        reset = False
    rss_start = status_kib("VmRSS")
    jobs = scopes * rounds
    lock = threading.Lock()
    state = {"next": 0}
    latencies, errors = [], []
    peak = {"threads": idle["threads"], "fds": idle["fds"]}
    stop = threading.Event()

    sampler_cpu = {"s": 0.0}

    def sample():
        # Peak threads and descriptors while the commands run (RSS's is the kernel's VmHWM).
        # Its own CPU time is the measurement's, not the client's: taken out of the process's.
        started_cpu = time.thread_time()
        while not stop.is_set():
            now = held()
            peak["threads"] = max(peak["threads"], now["threads"])
            peak["fds"] = max(peak["fds"], now["fds"])
            stop.wait(0.02)
        sampler_cpu["s"] = time.thread_time() - started_cpu

    def worker():
        while True:
            with lock:
                job = state["next"]
                state["next"] += 1
            if job >= jobs:
                return
            # Consecutive jobs are consecutive scopes and workers <= scopes: two jobs in
            # flight never share a scope.
            began = time.perf_counter()
            try:
                code = run(attached[job % scopes])
            except Exception as error:  # counted, as the Rust side counts a failed run
                with lock:
                    errors.append(repr(error))
                continue
            took = time.perf_counter() - began
            with lock:
                if code == 0:
                    latencies.append(took)
                else:
                    errors.append(f"exit {code}")

    sampler = threading.Thread(target=sample, daemon=True)
    cpu_started = cpu_seconds()
    sampler.start()
    started = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    # The sampler ran entirely inside this window (started after `cpu_started`, joined before
    # this read), so all of its CPU time is inside the process's and is taken out whole, as
    # agent-sandbox-bench's scale does with its own sampler's.
    cpu = cpu_seconds() - cpu_started - sampler_cpu["s"]
    # Idle again: what the active phase left behind (a scope that holds more after its
    # commands than before them keeps something per command or per lease top-up).
    time.sleep(params["settle_ms"] / 1000)
    after = held()
    latencies.sort()
    hwm = status_kib("VmHWM")
    figures = {
        "scopes": scopes, "workers": workers, "ops": jobs, "completed": len(latencies),
        "errors": len(errors), "first_errors": errors[:3],
        "mean_s": sum(latencies) / len(latencies) if latencies else None,
        "p50_s": quantile(latencies, 0.50), "p99_s": quantile(latencies, 0.99),
        "wall_s": wall, "attach_s": attach_s, "cpu_s": cpu, "sampler_cpu_s": sampler_cpu["s"],
        "peak_threads": peak["threads"], "peak_fds": peak["fds"],
        "rss_start_kib": rss_start, "hwm_kib": hwm, "hwm_reset": reset,
        "rss_growth_kib": None if hwm is None or rss_start is None else max(0, hwm - rss_start),
    }
    for prefix, figures_of in (("base", baseline), ("idle", idle), ("after", after)):
        for key, value in figures_of.items():
            figures[f"{prefix}_{key}"] = value
    print("result " + json.dumps(figures), flush=True)
    _expect("done")
    return attached
