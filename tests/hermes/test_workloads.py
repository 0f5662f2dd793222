"""Real Hermes workloads whose stdin is larger than one command-line argument may be (Linux:
128 KiB): write_file, patch, execute_code and the spill of a large tool result, through the
plugin's payload stdin mode (contract O4). Every check is byte-exact: a SHA-256 computed in
the sandbox against the one computed here."""

from __future__ import annotations

import hashlib
import json
import textwrap

from conftest import assert_no_key
from test_environment import PRELUDE, configured  # noqa: F401 - fixture re-used

#: Driver helpers: deterministic text of a given UTF-8 size (multi-byte characters, newlines,
#: quotes and shell metacharacters included), and a sandbox-side SHA-256.
HELPERS = """
import hashlib
def text(size, seed):
    unit = f"{seed} line ü€ 'quoted' \\"double\\" $HOME `x` \\\\ tab\\t end\\n"
    data = (unit * (size // len(unit.encode()) + 1)).encode()[:size]
    return data.decode("utf-8", "ignore")
def sha(s):
    return hashlib.sha256(s.encode("utf-8")).hexdigest()
def remote_sha(path):
    out = T(f"sha256sum {path} | cut -d' ' -f1")
    return out["output"].strip()
"""


def run(home, body, **kwargs):
    """Runs a driver (PRELUDE, HELPERS, then `body`); returns its result and captured log."""
    out = home.driver(PRELUDE + HELPERS + textwrap.dedent(body), **kwargs)
    assert_no_key(out["log"], json.dumps(out["result"]))
    return out["result"], out["log"]


def test_write_file_of_1_and_16_mib_is_byte_exact(configured):  # noqa: F811
    # contract: O4
    home, _ = configured
    result, _ = run(home, """
        from tools.file_tools import write_file_tool
        r = {}
        for name, size in (("one", 1 << 20), ("sixteen", 16 << 20)):
            body = text(size, name)
            path = f"/home/user/big-{name}.txt"
            r[name] = {"write": json.loads(write_file_tool(path, body, task_id="t1")),
                       "want": sha(body), "got": remote_sha(path), "bytes": len(body.encode())}
        finish(r)
    """, timeout=600)
    for name, size in (("one", 1 << 20), ("sixteen", 16 << 20)):
        entry = result[name]
        assert entry["bytes"] > size - 8, entry["bytes"]
        assert "error" not in entry["write"], entry["write"]
        assert entry["got"] == entry["want"], name


def test_patch_on_a_2_mib_file_is_byte_exact(configured):  # noqa: F811
    # contract: O4
    home, _ = configured
    result, _ = run(home, """
        from tools.file_tools import write_file_tool, patch_tool
        body = text(2 << 20, "patch") + "UNIQUE-MARKER-OLD\\n" + text(4096, "tail")
        path = "/home/user/patched.txt"
        r = {"write": json.loads(write_file_tool(path, body, task_id="t1"))}
        r["patch"] = json.loads(patch_tool(mode="replace", path=path, old_string="UNIQUE-MARKER-OLD",
                                           new_string="UNIQUE-MARKER-NEW", task_id="t1"))
        r["want"] = sha(body.replace("UNIQUE-MARKER-OLD", "UNIQUE-MARKER-NEW"))
        r["got"] = remote_sha(path)
        finish(r)
    """, timeout=600)
    assert result["patch"].get("success") is True, result["patch"]
    assert result["got"] == result["want"]


def test_execute_code_with_a_512_kib_script(configured):  # noqa: F811
    # contract: O4
    home, _ = configured
    result, _ = run(home, """
        from tools.code_execution_tool import execute_code
        blob = text(512 << 10, "code")
        script = "import hashlib\\nblob = " + repr(blob) + "\\nprint('digest', hashlib.sha256(blob.encode()).hexdigest())\\n"
        r = {"script_bytes": len(script.encode()), "want": sha(blob)}
        r["code"] = json.loads(execute_code(script, task_id="t1"))
        finish(r)
    """, timeout=600)
    assert result["script_bytes"] > 512 << 10
    assert f"digest {result['want']}" in result["code"]["output"], result["code"]


def test_a_spilled_large_tool_result_reads_back_byte_exact(configured):  # noqa: F811
    # contract: O4
    home, _ = configured
    result, _ = run(home, """
        from tools.tool_result_storage import maybe_persist_tool_result, extract_persisted_path
        T("true")  # the environment exists, as after any tool call
        env = tt._active_environments["default"]
        body = text(3 << 20, "spill")
        message = maybe_persist_tool_result(body, "terminal", "call-spill-1", env=env, threshold=1000)
        path = extract_persisted_path(message)
        r = {"path": path, "want": sha(body)}
        r["got"] = remote_sha(path) if path else None
        finish(r)
    """, timeout=600)
    assert result["path"], "the result was inline-truncated, not persisted"
    assert result["got"] == result["want"]


def test_helpers_text_is_exact_size():
    # The drivers' generator, run here too so a broken generator cannot make the checks vacuous.
    scope: dict = {}
    exec(HELPERS, scope)
    body = scope["text"](1 << 20, "x")
    assert 0 <= (1 << 20) - len(body.encode()) < 4
    assert scope["sha"](body) == hashlib.sha256(body.encode()).hexdigest()


def test_hermes_own_sync_calls_reach_the_sandbox_outside_any_command(configured):  # noqa: F811
    """Hermes calls env._sync_manager.sync(force=True) itself, between commands: for a spilled
    tool result (tool_result_storage) and a generated image (image_generation_tool). Both
    files must be in the sandbox through that call."""
    # contract: S14
    home, _ = configured
    out, log = run(home, """
        import os, pathlib
        from tools.tool_result_storage import maybe_persist_tool_result, extract_persisted_path
        from tools.image_generation_tool import _postprocess_image_generate_result
        T("true")
        env = tt._active_environments["default"]
        r = {}
        body = text(300 << 10, "spill-sync")
        message = maybe_persist_tool_result(body, "terminal", "call-sync-1", env=env, threshold=1000)
        r["spill_path"] = extract_persisted_path(message)
        r["spill_want"] = sha(body)
        image = pathlib.Path(os.environ["HERMES_HOME"]) / "cache" / "images" / "generated.png"
        image.parent.mkdir(parents=True, exist_ok=True)
        image.write_bytes(bytes(range(256)) * 4096)
        r["image_want"] = hashlib.sha256(image.read_bytes()).hexdigest()
        # The image tool's sync happens here, with no command around it.
        out = json.loads(_postprocess_image_generate_result(json.dumps({"success": True, "image": str(image)}), task_id="t1"))
        r["image_path"] = out.get("agent_visible_image")
        # Checked by commands only now, after both syncs.
        r["spill_got"] = remote_sha(r["spill_path"]) if r["spill_path"] else None
        r["image_got"] = remote_sha(r["image_path"]) if r["image_path"] else None
        finish(r)
    """, timeout=600)
    notes = "\n".join(line for line in log.splitlines() if "sync" in line.lower() or "spill" in line.lower())
    assert out["spill_path"] == "/home/user/.hermes/cache/spillover/call-sync-1.txt", notes
    assert out["spill_got"] == out["spill_want"]
    assert out["image_path"] == "/home/user/.hermes/cache/images/generated.png"
    assert out["image_got"] == out["image_want"]
    # Hermes swallows a failing sync (debug/warning) and falls back; neither may happen.
    assert "Spillover sync failed" not in log
    assert "Could not force-sync" not in log


#: A command in the sandbox that waits (bounded: 10 s) until no `sleep 32` runs, then counts them.
NO_SLEEP_LEFT = ("for i in $(seq 100); do ps -eo args | grep -q '^sleep 32$' || break; sleep 0.1; done; "
                 "ps -eo args | grep -c '^sleep 32$' || true")


def test_timeout_and_interrupt_kill_what_the_command_started(configured):  # noqa: F811
    """contract L6: a timeout or an interrupt kills the command's process group (`sleep 32`
    under its shell), while a background process of an earlier command survives."""
    # contract: L6
    home, _ = configured
    out, _ = run(home, f"""
        import threading
        from tools.interrupt import set_interrupt
        r = {{}}
        r["bg"] = T("sh -c 'echo $$ > /home/user/bg.pid; exec sleep 3600'", background=True)
        r["timeout"] = T("sleep 32; echo after", timeout=2)
        r["after_timeout"] = T({NO_SLEEP_LEFT!r})
        me = threading.get_ident()
        timer = threading.Timer(2.0, lambda: set_interrupt(True, me))
        timer.start()
        r["interrupt"] = T("sleep 32; echo after", timeout=60)
        timer.join()
        set_interrupt(False, me)
        r["after_interrupt"] = T({NO_SLEEP_LEFT!r})
        r["bg_alive"] = T("kill -0 $(cat /home/user/bg.pid) && echo alive")
        finish(r)
    """, timeout=300)
    assert out["timeout"]["exit_code"] == 124, out["timeout"]
    assert "after" not in out["timeout"]["output"].splitlines()  # the suffix says "timed out after"
    assert out["after_timeout"]["output"] == "0", out["after_timeout"]
    assert out["interrupt"]["exit_code"] == 130, out["interrupt"]
    assert out["after_interrupt"]["output"] == "0", out["after_interrupt"]
    assert out["bg_alive"]["output"] == "alive"


def test_a_reader_refused_at_session_start_gets_its_snapshot_once_admitted(configured):  # noqa: F811
    """init_session's snapshot is admitted like any command: a reader refused while the scope
    is dirty is not left without it (every command under `bash -l`, exports lost); Hermes
    retries the refused command, and once admitted the snapshot is taken and exports stick."""
    # contract: C2
    import os
    import subprocess
    import sys

    home, _ = configured
    writer = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent("""
            import sys
            T("echo writer-up")
            env = tt._active_environments["default"]
            print("DIGEST:" + env._native.scope_digest(), flush=True)
            sys.stdin.readline()  # hold the writer role until the test says so
        """)],
        env=home.env(), cwd=home.path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = writer.stdout.readline()
        assert line.startswith("DIGEST:"), line
        # The writer's dirty marker, as its failed sync leaves it (any content marks dirty).
        marker = home.path / "cache" / "e2b" / (line.strip()[len("DIGEST:"):] + ".dirty")
        assert marker.parent.is_dir()
        marker.write_text("sync failed\n")
        out, log = run(home, f"""
            import os, threading
            marker = {str(marker)!r}
            # The writer's next sync succeeds 1 s from now, before Hermes' first retry (2 s).
            threading.Timer(1.0, lambda: os.remove(marker)).start()
            r = {{"set": T("export FOO=1; echo set")}}
            env = tt._active_environments["default"]
            r["role"] = env._native.attach()["role"]
            r["snapshot"] = env._snapshot_ready
            r["get"] = T("echo foo=$FOO")
            finish(r)
        """, timeout=300)
    finally:
        writer.stdin.close()
        writer.wait(timeout=120)
    assert out["role"] == "reader"
    assert out["set"]["output"] == "set", out["set"]
    assert out["snapshot"] is True
    assert out["get"]["output"] == "foo=1", out["get"]
    # The refusal happened (and was retried), it did not silently pass.
    assert "dirty" in log.lower(), log[-2000:]


def test_a_gib_of_output_through_hermes_terminal_keeps_the_process_bounded(configured):  # noqa: F811
    # contract: O1 — the plugin's execute path end to end: native stream, the pipe Hermes
    # reads, Hermes' bounded collector. The driver's peak resident set (VmHWM, reset before
    # the command) must grow by far less than the output.
    home, _ = configured
    result, _ = run(home, """
        def peak():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        T("head -c 1048576 /dev/zero | tr '\\\\0' a; echo")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = peak()
        r = T("head -c 1073741824 /dev/zero | tr '\\\\0' a; echo", timeout=600)
        finish({"grown": peak() - before, "len": len(r["output"]),
                "total": r.get("output_total_chars"), "rc": r["exit_code"]})
    """, timeout=900)
    print(f"1 GiB through Hermes' terminal: peak resident set grew by {result['grown'] // 1024} KiB")
    assert result["rc"] == 0
    assert result["total"] >= 1 << 30, result["total"]
    assert result["len"] < 200_000
    assert result["grown"] < 96 << 20, result["grown"]
