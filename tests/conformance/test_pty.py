"""envd PTY: the SDK's `sandbox.pty` calls on a real pseudo-terminal."""

import threading

import pytest
from e2b import CommandExitException, PtySize

from conftest import wait_for


class PtyReader:
    """Collects a PTY handle's output on a thread until the process ends."""

    def __init__(self, handle):
        self.handle = handle
        self.output = bytearray()
        self.lock = threading.Lock()
        self.result = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_pty(self, chunk):
        with self.lock:
            self.output.extend(chunk)

    def _run(self):
        try:
            self.result = self.handle.wait(on_pty=self._on_pty)
        except Exception as error:  # the end of the stream, reported to the test
            self.error = error

    def text(self):
        with self.lock:
            return bytes(self.output).decode(errors="replace")

    def wait_for_text(self, needle):
        wait_for(lambda: needle in self.text(), f"{needle!r} in the terminal's output")

    def join(self):
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the PTY stream did not end"


def test_pty_create_send_stdin_resize_and_kill(sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"MARK": "m1"}, timeout=0)
    reader = PtyReader(handle)
    # The echo of the typed line shows `$MARK`, not its value: only the output matches.
    sandbox.pty.send_stdin(handle.pid, b'echo "[$MARK:$(tput cols)x$(tput lines):$(tty)]"\n')
    reader.wait_for_text("[m1:80x24:/dev/pts/")

    sandbox.pty.resize(handle.pid, PtySize(rows=40, cols=132))
    sandbox.pty.send_stdin(handle.pid, b"echo \"<$(stty size)>\"\n")
    reader.wait_for_text("<40 132>")
    assert handle.pid in [p.pid for p in sandbox.commands.list()]

    assert sandbox.pty.kill(handle.pid) is True
    reader.join()
    assert isinstance(reader.error, CommandExitException)
    assert reader.error.exit_code == -1
    assert reader.error.error == "signal: killed"
    assert sandbox.pty.kill(handle.pid) is False


def test_pty_exit_status_reaches_wait(sandbox):
    handle = sandbox.pty.create(PtySize(rows=10, cols=40), timeout=0)
    reader = PtyReader(handle)
    sandbox.pty.send_stdin(handle.pid, b"exit 3\n")
    reader.join()
    assert isinstance(reader.error, CommandExitException)
    assert reader.error.exit_code == 3


def test_pty_connect_reattaches_to_a_running_terminal(sandbox):
    if not hasattr(sandbox.pty, "connect"):
        pytest.skip("this SDK has no sandbox.pty.connect")
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    handle.disconnect()
    attached = sandbox.pty.connect(handle.pid, timeout=0)
    assert attached.pid == handle.pid
    reader = PtyReader(attached)
    sandbox.pty.send_stdin(handle.pid, b"echo \"<$((6 * 7))>\"\n")
    reader.wait_for_text("<42>")
    sandbox.pty.send_stdin(handle.pid, b"exit\n")
    reader.join()
    assert reader.error is None
    assert reader.result.exit_code == 0
