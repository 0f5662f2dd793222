"""agent-sandbox's session kernel: Python cells in one namespace, calls to the host.

Started by a bootstrap that read the first message from stdin (its length, a newline, then a
JSON object: the key, the frame marker, this source, extra modules, the capture caps and the
idle time) and exec'd this source with that object as BOOT. Nothing secret is on the command
line or in the environment.

Host -> kernel, on the stdin it was started with: "<length> <mac>\\n<json>" messages, each
authenticated (HMAC-SHA256 of b"h" + json under the key): {"cell": n, "code": ...} runs a cell,
{"reply": k, "result": ...} answers call k. Kernel -> host, on stdout (the process's log, which
the host follows): "\\n<marker> <length> <mac>\\n<json>" frames (HMAC of b"k" + json), each with
the next sequence number ("seq"), so a frame read from the log cannot be replayed and no other
process of the sandbox can forge one without the key. Everything else on stdout is the cells'
own output at the file-descriptor level (a subprocess's), which the host gives the cell that
ran. The cells' stdin is /dev/null: the protocol's pipe is the runner's alone.
"""

import contextlib
import hashlib
import hmac
import io
import json
import os
import select
import sys
import threading
import traceback
import types

_KEY = bytes.fromhex(BOOT["key"])
_MARKER = BOOT["marker"].encode("ascii")
_STDOUT_CAP, _STDERR_CAP = BOOT["caps"]
_IDLE_EXIT = float(BOOT["idle_exit"])

# The protocol's descriptors, then stdin for cells is /dev/null.
_IN_FD = os.dup(0)
_OUT_FD = os.dup(1)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(os.devnull, "r")

_seq = 0
_out_lock = threading.Lock()
_call_lock = threading.Lock()
_calls = 0
_cell = 0


def _mac(prefix, body):
    return hmac.new(_KEY, prefix + body, hashlib.sha256).hexdigest().encode("ascii")


def _send(payload):
    """One frame to the host: the next sequence number, authenticated."""
    global _seq
    with _out_lock:
        _seq += 1
        payload["seq"] = _seq
        body = json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        frame = b"\n" + _MARKER + b" " + str(len(body)).encode("ascii") + b" " + _mac(b"k", body) + b"\n" + body
        view = memoryview(frame)
        while view:
            written = os.write(_OUT_FD, view)
            view = view[written:]


_buffer = bytearray()


def _fill(timeout=None):
    """One read of the protocol's input into the buffer: False at end of input, None when
    `timeout` passed first."""
    if timeout is not None:
        readable, _, _ = select.select([_IN_FD], [], [], timeout)
        if not readable:
            return None
    chunk = os.read(_IN_FD, 65536)
    if not chunk:
        return False
    _buffer.extend(chunk)
    return True


def _receive(timeout=None):
    """The next authenticated message from the host; None at end of input, or when
    `timeout` seconds pass before one starts. A message that fails its check ends the
    kernel: its input is not the host's."""
    while b"\n" not in _buffer:
        if len(_buffer) > 100:
            os._exit(3)
        if not _fill(None if _buffer else timeout):
            return None
    end = _buffer.index(b"\n")
    header = bytes(_buffer[:end])
    del _buffer[: end + 1]
    try:
        length_text, mac = header.split(b" ")
        length = int(length_text)
    except ValueError:
        os._exit(3)
    while len(_buffer) < length:
        if not _fill():
            return None
    body = bytes(_buffer[:length])
    del _buffer[:length]
    if not hmac.compare_digest(_mac(b"h", body), mac):
        os._exit(3)
    return json.loads(body)


def call(name, args):
    """Asks the host to run `name` with `args` (JSON) for the cell running now; returns the
    host's answer (text). Calls are serialized: one question, one answer."""
    global _calls
    with _call_lock:
        _calls += 1
        number = _calls
        _send({"call": number, "cell": _cell, "name": str(name), "args": args})
        reply = _receive()
        if reply is None:
            raise RuntimeError("the host went away")
        if reply.get("reply") != number:
            raise RuntimeError("the host answered another call")
        if "error" in reply:
            raise RuntimeError(str(reply["error"]))
        return reply.get("result", "")


_kernel_module = types.ModuleType("agent_sandbox_kernel")
_kernel_module.call = call
sys.modules["agent_sandbox_kernel"] = _kernel_module
for _name, _source in BOOT.get("modules", {}).items():
    _module = types.ModuleType(_name)
    _module.__file__ = "<" + _name + ">"
    exec(compile(_source, "<" + _name + ">", "exec"), _module.__dict__)
    sys.modules[_name] = _module

GLOBALS = {"__name__": "__main__", "__builtins__": __builtins__}


def _clip(text, cap):
    return (text, False) if len(text) <= cap else (text[:cap], True)


def _run(code):
    out, err = io.StringIO(), io.StringIO()
    status, trace = "ok", ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(code, "<cell>", "exec"), GLOBALS)
    except SystemExit as exc:
        status, trace = "exit", "SystemExit: " + repr(exc.code)
    except BaseException:
        status, trace = "error", traceback.format_exc()
    stdout, stdout_clipped = _clip(out.getvalue(), _STDOUT_CAP)
    stderr, stderr_clipped = _clip(err.getvalue(), _STDERR_CAP)
    return status, stdout, stdout_clipped, stderr, stderr_clipped, trace


def main():
    global _cell
    count = 0
    _send({"ready": True, "python": sys.version.split()[0]})
    while True:
        message = _receive(timeout=_IDLE_EXIT)
        if message is None:
            return  # end of input, or idle past its time: nobody is talking to us
        if "cell" not in message:
            continue  # a late answer to a call whose cell is over
        _cell = message["cell"]
        count += 1
        status, stdout, stdout_clipped, stderr, stderr_clipped, trace = _run(message["code"])
        sys.stdout.flush()
        _send({
            "result": _cell, "status": status, "stdout": stdout, "stderr": stderr,
            "stdout_clipped": stdout_clipped, "stderr_clipped": stderr_clipped,
            "traceback": trace, "execution_count": count,
        })
        _cell = 0
        if status == "exit":
            return


main()
