"""The peer side of scripts/bench: the official E2B Python SDK doing a scenario's work.

`python peer.py <scenario> '<params json>'` speaks the same stdin/stdout protocol as
`agent-sandbox-bench` (see crates/bench/src/main.rs): `ready`, wait for `go`, the measured
part, `result {json}`, wait for `done`, tear down. The SDK reads E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY from the environment the orchestrator sets.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from e2b import Sandbox

DEADLINE = 900


def status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


class Protocol:
    def __init__(self):
        self.rss_start = None
        self.reset = False

    def _expect(self, word):
        line = sys.stdin.readline()
        if line.strip() != word:
            raise RuntimeError(f"expected {word!r} from the orchestrator, got {line!r}")

    def ready(self):
        print("ready", flush=True)
        self._expect("go")
        # The peak mark starts here, as for agent-sandbox-bench.
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")
            self.reset = True
        except OSError:
            self.reset = False
        self.rss_start = status_kib("VmRSS")

    def result(self, figures):
        hwm = status_kib("VmHWM")
        figures.update(
            rss_start_kib=self.rss_start,
            hwm_kib=hwm,
            rss_growth_kib=None if hwm is None or self.rss_start is None else max(0, hwm - self.rss_start),
            hwm_reset=self.reset,
        )
        print("result " + json.dumps(figures), flush=True)
        self._expect("done")


def make_tree(root, files, file_bytes):
    """The same tree agent-sandbox-bench's upload scenario writes."""
    body = bytes(ord("a") + i % 26 for i in range(file_bytes))
    pairs = []
    for i in range(files):
        rel = f"skills/group-{i % 20:02}/skill-{i % 200:03}/file-{i:05}.md"
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(body)
        pairs.append((path, f"/home/user/.hermes/{rel}"))
    return pairs


def read(path):
    with open(path, "rb") as source:
        return source.read()


def steady(params, protocol):
    pattern, commands = params["pattern"], params["commands"]
    sbx = Sandbox.create(timeout=300)
    sbx.commands.run("true")
    protocol.ready()
    started = time.perf_counter()
    for _ in range(commands):
        if pattern == "connect_run":
            # The reference plugin's way: a handle per command.
            Sandbox.connect(sbx.sandbox_id, timeout=300).commands.run("true")
        elif pattern == "held":
            sbx.commands.run("true")
        else:
            raise ValueError(f"unknown pattern {pattern!r}")
    wall = time.perf_counter() - started
    protocol.result({"ops": commands, "wall_s": wall})
    sbx.kill()


def upload(params, protocol):
    pattern, files, file_bytes = params["pattern"], params["files"], params["file_bytes"]
    with tempfile.TemporaryDirectory() as tree:
        pairs = make_tree(tree, files, file_bytes)
        sbx = Sandbox.create(timeout=300)
        protocol.ready()
        started = time.perf_counter()
        if pattern == "per_file":
            for path, remote in pairs:
                sbx.files.write(remote, read(path))
        elif pattern == "multi":
            sbx.files.write_files([{"path": remote, "data": read(path)} for path, remote in pairs])
        else:
            raise ValueError(f"unknown pattern {pattern!r}")
        wall = time.perf_counter() - started
        protocol.result({"ops": 1, "files": files, "bytes": files * file_bytes, "wall_s": wall})
        probe = "/home/user/.hermes/skills/group-00/skill-000/file-00000.md"
        if len(sbx.files.read(probe, format="bytes")) != file_bytes:
            raise RuntimeError(f"{probe} did not arrive whole")
        sbx.kill()


def stream(params, protocol):
    pattern, size = params["pattern"], params["bytes"]
    # The reference plugin's way keeps the output (the SDK's default); the SDK's best
    # pattern for a stream consumed by a callback turns that off.
    retain = {"on_stdout": True, "no_retain": False}[pattern]
    sbx = Sandbox.create(timeout=DEADLINE)
    counted = [0]

    def count(chunk):
        counted[0] += len(chunk)

    protocol.ready()
    started = time.perf_counter()
    result = sbx.commands.run(
        f"head -c {size} /dev/zero", on_stdout=count, timeout=DEADLINE, retain_output=retain
    )
    wall = time.perf_counter() - started
    if result.exit_code != 0 or counted[0] != size:
        raise RuntimeError(f"received {counted[0]} of {size} bytes, exit {result.exit_code}")
    protocol.result({"ops": 1, "bytes": counted[0], "wall_s": wall})
    sbx.kill()


def pull(params, protocol):
    pattern, size, fill = params["pattern"], params["bytes"], params["fill"]
    sbx = Sandbox.create(timeout=DEADLINE)
    sbx.commands.run(fill, timeout=DEADLINE)
    make_tar = "tar -C /home/user/.hermes -cf /tmp/state.tar ."
    if pattern == "curl":
        # curl measures the /files download alone, so the tar is made before `go`.
        sbx.commands.run(make_tar, timeout=DEADLINE)
    protocol.ready()
    started = time.perf_counter()
    if pattern == "bytes":
        # As the reference plugin pulls: tar in the sandbox, then one files.read.
        sbx.commands.run(make_tar, timeout=DEADLINE)
        received = len(sbx.files.read("/tmp/state.tar", format="bytes", request_timeout=DEADLINE))
    elif pattern == "stream":
        sbx.commands.run(make_tar, timeout=DEADLINE)
        received = sum(len(c) for c in sbx.files.read("/tmp/state.tar", format="stream", request_timeout=DEADLINE))
    elif pattern == "curl":
        url = sbx.download_url("/tmp/state.tar")
        out = subprocess.run(
            ["curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{size_download}", url],
            check=True, capture_output=True, text=True, timeout=DEADLINE,
        )
        received = int(float(out.stdout.strip()))
    else:
        raise ValueError(f"unknown pattern {pattern!r}")
    wall = time.perf_counter() - started
    if received < size:
        raise RuntimeError(f"pulled {received} bytes, less than {size}")
    protocol.result({"ops": 1, "bytes": received, "wall_s": wall})
    sbx.kill()


def cold(params, protocol):
    step = params["step"]
    protocol.ready()
    started = time.perf_counter()
    if step == "create":
        sbx = Sandbox.create(timeout=300)
    elif step == "resume":
        sbx = Sandbox.connect(params["sandbox_id"], timeout=300)
    else:
        raise ValueError(f"unknown step {step!r}")
    sbx.commands.run("true")
    wall = time.perf_counter() - started
    protocol.result({"ops": 1, "wall_s": wall, "sandbox_id": sbx.sandbox_id})
    if step == "resume":
        sbx.kill()


def state_files(files):
    """The same state agent-sandbox-bench's rollback scenario keeps on its host."""
    entries = []
    for i in range(files):
        rel = f"memories/note-{i:03}.md" if i % 4 == 0 else f"skills/skill-{i:02}/SKILL.md"
        entries.append({"path": f"/home/user/.hermes/{rel}", "data": (f"state file {i}\n" * 32).encode()})
    return entries


def checkpoint(params, protocol):
    checkpoints = params["checkpoints"]
    sbx = Sandbox.create(timeout=300)
    sbx.commands.run("true")
    protocol.ready()
    started = time.perf_counter()
    taken = [sbx.create_snapshot() for _ in range(checkpoints)]
    wall = time.perf_counter() - started
    protocol.result({"ops": checkpoints, "wall_s": wall})
    for snapshot in taken:
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    sbx.kill()


STATE_ROOTS = "/home/user/.hermes/skills /home/user/.hermes/memories"


def rollback(params, protocol):
    """What an SDK user does for an undoable rollback that keeps the agent's state, step for
    step what `Backend::rollback` does: read the current sandbox's skills/ and memories/ (one
    command streaming a tar), snapshot it (the undo point), create a sandbox from the
    checkpoint, kill the old one, empty the new one's stale state roots and write the host's
    state files into them. `recipe: bare` leaves out the read and the emptying (it loses what
    the agent wrote since the last sync and leaves the checkpoint's deleted files behind);
    its figures are reported without a target."""
    rollbacks, state = params["rollbacks"], state_files(params["files"])
    bare = params.get("recipe") == "bare"
    sbx = Sandbox.create(timeout=300)
    sbx.files.write_files(state)
    sbx.commands.run("echo base > /home/user/workspace.txt")
    base = sbx.create_snapshot()
    sbx.commands.run("echo broken > /home/user/workspace.txt")
    before = sbx.sandbox_id
    protocol.ready()
    started = time.perf_counter()
    for _ in range(rollbacks):
        if not bare:
            recovered = sbx.commands.run(
                "tar -C /home/user/.hermes -cf - skills memories | base64 -w0")
            if not recovered.stdout:
                raise RuntimeError("the state read returned nothing")
        sbx.create_snapshot()
        restored = Sandbox.create(base.snapshot_id, timeout=300)
        sbx.kill()
        if not bare:
            restored.commands.run(f"rm -rf -- {STATE_ROOTS}")
        restored.files.write_files(state)
        sbx = restored
    wall = time.perf_counter() - started
    protocol.result({"ops": rollbacks, "wall_s": wall})
    check = sbx.commands.run("cat /home/user/workspace.txt")
    if check.stdout.strip() != "base" or sbx.sandbox_id == before:
        raise RuntimeError(f"the rollback did not restore the checkpoint: {check.stdout!r}")
    sbx.kill()


def scale(params, _protocol):
    """`scopes` Sandbox objects held in this process, each created and run once, then every
    one running `true` at once (scale_common.py does the measuring, as for the plugin)."""
    import scale_common

    def attach(_index):
        sbx = Sandbox.create(timeout=900)
        sbx.commands.run("true")
        return sbx

    def run(sbx):
        return sbx.commands.run("true").exit_code

    # Left to the orchestrator, which kills every sandbox after the run.
    scale_common.scale(params, attach, run)


SCENARIOS = {
    "steady": steady, "scale": scale, "upload": upload, "stream": stream, "pull": pull, "cold": cold,
    "checkpoint": checkpoint, "rollback": rollback,
}


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: peer.py <scenario> ['<params json>']")
    params = json.loads(sys.argv[2]) if len(sys.argv) == 3 else {}
    SCENARIOS[sys.argv[1]](params, Protocol())


if __name__ == "__main__":
    main()
