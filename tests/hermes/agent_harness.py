"""Driving a real Hermes agent loop against the scripted model (scripted_model.py): the
profile's config for it, `hermes chat -q`, and a real `hermes gateway run` serving Hermes'
`api_server` platform.

How Hermes is pointed at the scripted model (config.yaml, `model` section):
`provider: custom`, `base_url: http://127.0.0.1:PORT/v1`, `default: <model id>`,
`api_key: ...`, `context_length: N` (a pinned context length: no probe). Auxiliary tasks
(`auxiliary.*.provider: auto`) inherit the main provider, so they would reach the scripted
model too; title generation and the post-turn background review are switched off so that
only the agent loop talks to it. `OPENAI_BASE_URL` never picks Hermes' endpoint.

The gateway's api_server platform is enabled by `API_SERVER_KEY` alone (16+ characters, not
a placeholder); `API_SERVER_PORT` and `API_SERVER_HOST` choose where it listens (default
127.0.0.1:8642). Chats are told apart by the `X-Hermes-Session-Id` header (the session id,
history reloaded from state.db when it is sent again; the terminal sandbox is keyed
`session:<id>`), optionally `X-Hermes-Session-Key` (a per-channel key that wins over the id
for the sandbox and memory scope); without headers the session id is a digest of the system
prompt and the first user message.

Every Hermes process started here gets a `sitecustomize` that refuses any non-loopback
connect or name lookup and writes the attempt to a log (`NetGuard.attempts()`).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

from conftest import VENV_BIN, HermesHome
from scripted_model import ScriptedModel

SITECUSTOMIZE = textwrap.dedent(
    """
    import os as _os, socket as _socket
    _LOG = _os.environ.get("HERMES_TEST_NET_LOG")
    _LOOPBACK = ("127.0.0.1", "::1", "localhost")
    def _note(what):
        if _LOG:
            import traceback
            with open(_LOG, "a") as handle:
                handle.write(f"{_os.getpid()} {what}\\n")
            with open(_LOG + ".stacks", "a") as handle:
                handle.write(f"{_os.getpid()} {what}\\n{''.join(traceback.format_stack()[-45:-1])}\\n")
    def _host(address):
        return address[0] if isinstance(address, tuple) else str(address)
    _real_connect = _socket.socket.connect
    _real_connect_ex = _socket.socket.connect_ex
    _real_getaddrinfo = _socket.getaddrinfo
    def _connect(self, address):
        if self.family in (_socket.AF_INET, _socket.AF_INET6) and _host(address) not in _LOOPBACK:
            _note(f"connect {address!r}")
            raise OSError(f"network blocked by the test: {address!r}")
        return _real_connect(self, address)
    def _connect_ex(self, address):
        if self.family in (_socket.AF_INET, _socket.AF_INET6) and _host(address) not in _LOOPBACK:
            _note(f"connect_ex {address!r}")
            raise OSError(f"network blocked by the test: {address!r}")
        return _real_connect_ex(self, address)
    def _getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and name not in _LOOPBACK:
            _note(f"getaddrinfo {name!r}")
            raise _socket.gaierror(_socket.EAI_NONAME, f"name lookup blocked by the test: {name!r}")
        return _real_getaddrinfo(host, *args, **kwargs)
    _socket.socket.connect = _connect
    _socket.socket.connect_ex = _connect_ex
    _socket.getaddrinfo = _getaddrinfo
    """
)


class NetGuard:
    """A directory holding the guarding `sitecustomize.py`, and the log of refused attempts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.log = directory / "attempts.log"

    def env(self) -> dict:
        path = os.environ.get("PYTHONPATH", "")
        return {"PYTHONPATH": str(self.directory) + (os.pathsep + path if path else ""),
                "HERMES_TEST_NET_LOG": str(self.log)}

    def attempts(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def stacks(self) -> str:
        """Where each refused attempt came from (the Python stack at the attempt)."""
        path = Path(str(self.log) + ".stacks")
        return path.read_text() if path.exists() else ""


def agent_config(model: ScriptedModel, settings: dict, *, terminal: Optional[dict] = None,
                 extra: Optional[dict] = None) -> dict:
    """A profile config: the scripted model as the main model, the e2b backend with `settings`
    (as `plugins.entries.e2b.settings`), nothing that calls a model besides the agent loop."""
    config: dict[str, Any] = {
        "model": model.model_config(),
        "terminal": {"backend": "e2b", "timeout": 60, **(terminal or {})},
        # auto_update_check_hours: 0 stops the gateway's plugin update check, which asks PyPI
        # for the newest `hermes-e2b` (a name not registered yet) every 24 h.
        "plugins": {"enabled": ["e2b"], "entries": {"e2b": {"settings": settings}}, "auto_update_check_hours": 0},
        "auxiliary": {"title_generation": {"enabled": False, "model_upgrade_enabled": False},
                      "background_review": {"enabled": False}},
        "updates": {"check": False},
        "model_catalog": {"enabled": False},
        "curator": {"enabled": False},
    }
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def write_agent_config(home: HermesHome, config: dict) -> None:
    # JSON is YAML; no YAML writer needed (as HermesHome.write_config).
    (home.path / "config.yaml").write_text(json.dumps(config, indent=2))


def hermes_chat(home: HermesHome, guard: NetGuard, query: str, *, timeout: float = 120,
                extra_env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """`hermes chat -q QUERY`: one full agent loop, then exit."""
    env = {**guard.env(), **(extra_env or {})}
    return subprocess.run([str(VENV_BIN / "hermes"), "chat", "-q", query], env=home.env(env),
                          capture_output=True, text=True, timeout=timeout, cwd=home.path,
                          stdin=subprocess.DEVNULL)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class GatewayError(AssertionError):
    pass


#: The gateway's log lines (at -v) when its boot warm-up of the turn machinery ended.
WARMED = "Turn machinery warmed in"
WARM_FAILED = "Turn-machinery warm-up failed"


class Gateway:
    """One `hermes gateway run` serving the api_server platform on loopback, for `home`."""

    def __init__(self, home: HermesHome, guard: NetGuard, *, key: Optional[str] = None,
                 extra_env: Optional[dict] = None, name: str = "gateway") -> None:
        self.home = home
        self.guard = guard
        self.key = key or secrets.token_hex(24)
        self.extra_env = dict(extra_env or {})
        self.name = name
        self.port: Optional[int] = None
        self.proc: Optional[subprocess.Popen] = None
        self.returncode: Optional[int] = None
        self.output_path = home.path.parent / f"{name}-{os.getpid()}-{time.monotonic_ns()}.out"
        #: Response headers of the last chat (X-Hermes-Session-Id, ...).
        self.last_headers: dict = {}
        #: Boots stopped and started again because their warm-up failed (see start()).
        self.warm_up_failures = 0

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 90, attempts: int = 3) -> "Gateway":
        """Starts the gateway and waits until it is ready: its api_server answers /health and
        its boot warm-up of the turn machinery is over.

        The api_server answers before that warm-up (run_agent's import and the tool schemas,
        on an executor thread) ends, and the warm-up runs beside other boot threads. Under
        CPython 3.11.7, two threads in ast.parse at once can fail ("AST constructor
        recursion depth mismatch", CPython gh-106905, fixed in 3.11.8; Hermes' boot reaches
        ast.parse through its tool discovery, pydantic's inspect.signature and traceback
        formatting), and a chat sent meanwhile finds run_agent half imported. A boot whose
        warm-up failed is stopped (SIGTERM, before any chat) and started again, up to
        `attempts` times; `warm_up_failures` counts them."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        import importlib.util

        if importlib.util.find_spec("aiohttp") is None:
            # The api_server adapter is aiohttp; Hermes' own extras pin it at 3.14.3.
            raise GatewayError("the test venv lacks aiohttp, which Hermes' api_server platform needs "
                               "(pip install aiohttp==3.14.3)")
        for attempt in range(attempts):
            if self._start_once(timeout):
                return self
            self.warm_up_failures += 1
            self.stop(signal.SIGTERM)
        raise GatewayError(f"the gateway's boot warm-up failed {attempts} times\n{self.tail()}")

    def _start_once(self, timeout: float) -> bool:
        """One boot; True once ready, False when its warm-up failed."""
        self.port = free_port()
        starts = sum(1 for line in self.output_lines() if line.startswith("==== start on port"))
        env = self.home.env({**self.guard.env(), "API_SERVER_ENABLED": "true", "API_SERVER_KEY": self.key,
                             "API_SERVER_HOST": "127.0.0.1", "API_SERVER_PORT": str(self.port),
                             **self.extra_env})
        with open(self.output_path, "ab") as out:
            out.write(f"==== start on port {self.port}\n".encode())
            out.flush()
            # A session of its own: what is left of its process group is killed at close().
            self.proc = subprocess.Popen([str(VENV_BIN / "hermes"), "gateway", "run", "-v"], env=env,
                                         cwd=self.home.path, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.returncode = None
        deadline = time.monotonic() + timeout
        answered = False
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise GatewayError(f"the gateway exited with {self.proc.returncode} before it was ready\n{self.tail()}")
            if not answered:
                try:
                    with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                        answered = response.status == 200
                except (OSError, urllib.error.URLError):
                    pass
            if answered:
                this_start = self._this_start(starts)
                if any(WARM_FAILED in line for line in this_start):
                    return False
                if any(WARMED in line for line in this_start):
                    return True
            time.sleep(0.25)
        raise GatewayError(f"the gateway was not ready on {self.url} within {timeout}s "
                           f"(answered: {answered})\n{self.tail()}")

    def _this_start(self, earlier_starts: int) -> list[str]:
        """The output lines of the current start (after its `==== start` line)."""
        lines = self.output_lines()
        seen = 0
        for index, line in enumerate(lines):
            if line.startswith("==== start on port"):
                seen += 1
                if seen == earlier_starts + 1:
                    return lines[index + 1:]
        return []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Sends `sig` to the gateway (SIGTERM: a clean shutdown; SIGKILL: a crash) and waits."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise GatewayError(f"the gateway did not exit within {timeout}s of signal {sig}\n{self.tail()}")
        self.returncode = self.proc.returncode
        self._reap_group()
        return self.returncode

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)

    def _reap_group(self) -> None:
        """Kills what the gateway left in its own process group (it was started as the leader)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reap_group()

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- chats ------------------------------------------------------------------------------

    def chat(self, text: str, *, session_id: Optional[str] = None, session_key: Optional[str] = None,
             history: Optional[list] = None, stream: bool = False, timeout: float = 120) -> str:
        """Sends `text` as the next user message of the chat named by `session_id`
        (X-Hermes-Session-Id) and/or `session_key` (X-Hermes-Session-Key); returns the reply."""
        messages = list(history or []) + [{"role": "user", "content": text}]
        body = {"model": "hermes-agent", "messages": messages, "stream": stream}
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        if session_id:
            headers["X-Hermes-Session-Id"] = session_id
        if session_key:
            headers["X-Hermes-Session-Key"] = session_key
        request = urllib.request.Request(f"{self.url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                self.last_headers = dict(response.headers)
                if not stream:
                    payload = json.loads(response.read())
                    return payload["choices"][0]["message"]["content"]
                parts = []
                for raw in response:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    for choice in chunk.get("choices") or []:
                        parts.append((choice.get("delta") or {}).get("content") or "")
                return "".join(parts)
        except urllib.error.HTTPError as error:
            raise GatewayError(f"chat answered {error.code}: {error.read()[:2000]!r}\n{self.tail()}") from None

    def chat_in_thread(self, text: str, **kwargs: Any) -> "ChatThread":
        thread = ChatThread(self, text, kwargs)
        thread.start()
        return thread

    # -- logs -------------------------------------------------------------------------------

    def output_lines(self) -> list[str]:
        """The gateway's stdout and stderr (every start of this Gateway, in order)."""
        return self.output_path.read_text(errors="replace").splitlines() if self.output_path.exists() else []

    def profile_log_lines(self) -> list[str]:
        """The profile's log files (HERMES_HOME/logs/*.log)."""
        lines: list[str] = []
        for path in sorted((self.home.path / "logs").glob("*.log")):
            lines.extend(f"{path.name}: {line}" for line in path.read_text(errors="replace").splitlines())
        return lines

    def log_lines(self) -> list[str]:
        return self.output_lines() + self.profile_log_lines()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output_lines()[-n:])


class FakeNtfy:
    """An ntfy server on loopback, for Hermes' bundled ntfy platform: a push chat (like a
    Telegram DM) whose messages the test publishes and whose replies it reads. Hermes
    subscribes with `GET /<topic>/json` (a stream of JSON lines) and publishes its replies
    with `POST /<topic>`. A gateway chat on it can get a turn the user did not send (a
    background process's completion), which the api_server platform (stateless) cannot."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        fake = self
        self._events: list[dict] = []
        self._cond = threading.Condition()
        #: Every message Hermes published: {"topic", "text", "time"}.
        self.published: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                topic = self.path.split("?")[0].strip("/").split("/")[0]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                seen = 0
                try:
                    self.wfile.write(json.dumps({"id": "open", "event": "open", "topic": topic}).encode() + b"\n")
                    self.wfile.flush()
                    while True:
                        with fake._cond:
                            fake._cond.wait_for(lambda: len(fake._events) > seen, timeout=20)
                            pending = fake._events[seen:]
                            seen = len(fake._events)
                        lines = [e for e in pending if e["topic"] == topic] or [
                            {"id": secrets.token_hex(6), "event": "keepalive", "topic": topic}]
                        for event in lines:
                            self.wfile.write(json.dumps(event).encode() + b"\n")
                        self.wfile.flush()
                except OSError:
                    return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                text = self.rfile.read(length).decode("utf-8", "replace") if length else ""
                topic = self.path.split("?")[0].strip("/").split("/")[0]
                with fake._cond:
                    fake.published.append({"topic": topic, "text": text, "time": time.time()})
                    fake._cond.notify_all()
                body = json.dumps({"id": secrets.token_hex(6), "event": "message", "topic": topic}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-ntfy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def env(self, topic: str) -> dict:
        """The gateway's environment for a chat on `topic` (any topic may talk to the bot)."""
        return {"NTFY_TOPIC": topic, "NTFY_SERVER_URL": self.url, "NTFY_ALLOW_ALL_USERS": "true"}

    def send(self, topic: str, text: str) -> None:
        """The user writes `text` in the chat."""
        with self._cond:
            self._events.append({"id": secrets.token_hex(8), "time": int(time.time()), "event": "message",
                                 "topic": topic, "message": text})
            self._cond.notify_all()

    def wait_for(self, needle: str, timeout: float = 120) -> dict:
        """The first message Hermes published containing `needle`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for message in self.published:
                    if needle in message["text"]:
                        return message
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GatewayError(f"Hermes published nothing with {needle!r} within {timeout}s: "
                                       f"{[m['text'][:200] for m in self.published]}")
                self._cond.wait(timeout=min(left, 1.0))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class ChatThread(threading.Thread):
    """A chat sent from a thread (two chats at once); join() then `.reply` or `.error`."""

    def __init__(self, gateway: Gateway, text: str, kwargs: dict) -> None:
        super().__init__(daemon=True)
        self.gateway, self.text, self.kwargs = gateway, text, kwargs
        self.reply: Optional[str] = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.reply = self.gateway.chat(self.text, **self.kwargs)
        except BaseException as error:  # reported by result()
            self.error = error

    def result(self, timeout: float = 150) -> str:
        self.join(timeout)
        if self.is_alive():
            raise GatewayError(f"the chat did not end within {timeout}s\n{self.gateway.tail()}")
        if self.error is not None:
            raise self.error
        return self.reply
