"""Fixtures: a temporary HERMES_HOME per test, the real `hermes` CLI and Python of the test
venv, and (for environment tests) an `e2b-local serve` on loopback.

Hermes keeps process-global state (registries, environment caches, a one-shot config
bridge), so everything that drives Hermes runs in a fresh subprocess with its own
HERMES_HOME; the test process itself never imports Hermes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

import pytest

VENV_BIN = Path(sys.executable).parent
REPO = Path(os.environ.get("HERMES_E2B_REPO", Path(__file__).resolve().parents[2]))
SHIM_DIR = REPO / "crates" / "hermes-binding" / "plugin"
#: A recognisable fake key: every test checks it never shows up in output.
FAKE_KEY = "e2b_test_key_3f9c1d7a5b"

#: Prepended to every driver script: block outbound network (loopback stays allowed, for
#: e2b-local), so a test fails if import or register tries to reach anything.
NETWORK_GUARD = textwrap.dedent(
    """
    import socket as _socket
    _LOOPBACK = ("127.0.0.1", "::1", "localhost")
    _real_connect = _socket.socket.connect
    _real_connect_ex = _socket.socket.connect_ex
    def _host(address):
        return address[0] if isinstance(address, tuple) else str(address)
    def _guard_connect(self, address):
        if self.family in (_socket.AF_INET, _socket.AF_INET6) and _host(address) not in _LOOPBACK:
            raise OSError(f"network blocked by the test: {address!r}")
        return _real_connect(self, address)
    def _guard_connect_ex(self, address):
        if self.family in (_socket.AF_INET, _socket.AF_INET6) and _host(address) not in _LOOPBACK:
            raise OSError(f"network blocked by the test: {address!r}")
        return _real_connect_ex(self, address)
    _socket.socket.connect = _guard_connect
    _socket.socket.connect_ex = _guard_connect_ex
    """
)


class HermesHome:
    """One temporary HERMES_HOME: writes config.yaml / .env, runs the CLI and drivers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, *, settings: Optional[dict] = None, backend: str = "e2b",
                     enabled: bool = True, terminal: Optional[dict] = None) -> None:
        term = {"backend": backend}
        term.update(terminal or {})
        config: dict[str, Any] = {"terminal": term, "plugins": {"enabled": ["e2b"] if enabled else []}}
        if settings is not None:
            config["plugins"]["entries"] = {"e2b": {"settings": settings}}
        # JSON is YAML; no YAML writer needed.
        (self.path / "config.yaml").write_text(json.dumps(config, indent=2))

    def write_key(self, key: str = FAKE_KEY) -> None:
        (self.path / ".env").write_text(f"E2B_API_KEY={key}\n")

    def env(self, extra: Optional[dict] = None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "TERMINAL_", "HERMES_"))}
        env["HERMES_HOME"] = str(self.path)
        # The doctor rows' live access check stays off unless a test asks for it (with an
        # e2b-local endpoint): no test may ever reach the real E2B.
        env["HERMES_E2B_DOCTOR_OFFLINE"] = "1"
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra or {})
        return env

    def hermes(self, *args: str, extra_env: Optional[dict] = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "hermes"), *args], env=self.env(extra_env), capture_output=True,
                              text=True, timeout=timeout, cwd=self.path)

    def python(self, script: str, *, extra_env: Optional[dict] = None, timeout: float = 300) -> subprocess.CompletedProcess:
        code = NETWORK_GUARD + "\n" + textwrap.dedent(script)
        return subprocess.run([sys.executable, "-c", code], env=self.env(extra_env), capture_output=True,
                              text=True, timeout=timeout, cwd=self.path)

    def doctor(self, extra_env: Optional[dict] = None) -> subprocess.CompletedProcess:
        """The real `hermes doctor` entry point. Hermes skips plugin backends when it detects
        a container (this test host may be one), so that check is pretended away."""
        return self.python(
            """
            import sys, hermes_constants
            hermes_constants.is_container = lambda: False
            from hermes_cli.main import main
            sys.argv = ["hermes", "doctor"]
            try:
                main()
            except SystemExit:
                pass
            """,
            extra_env=extra_env,
        )

    def driver(self, script: str, **kwargs: Any) -> Any:
        """Runs `script`, which must print one JSON line prefixed `RESULT:`; returns it."""
        proc = self.python(script, **kwargs)
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT:"):
                return json.loads(line[len("RESULT:"):])
        raise AssertionError(f"driver printed no result (rc {proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")


def install_command(python: Optional[str] = None) -> str:
    """The shim's INSTALL_COMMAND (read from its source, as the shim may not import here), with
    `--python PYTHON`, or without that flag (the README's form, which finds Hermes itself)."""
    import ast

    tree = ast.parse((SHIM_DIR / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["INSTALL_COMMAND"]:
            command = ast.literal_eval(node.value)
            break
    else:
        raise AssertionError("the shim defines no INSTALL_COMMAND")
    if python is None:
        return command.replace(" --python {python}", "")
    return command.format(python=python)


def load_yaml(path: Path) -> Any:
    """Reads YAML with ruamel (Hermes' own dependency)."""
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(path.read_text())


@pytest.fixture
def home(tmp_path: Path) -> HermesHome:
    return HermesHome(tmp_path / "hermes-home")


def assert_no_key(*texts: str) -> None:
    """The API key never appears in anything a test captured (contract X1)."""
    for text in texts:
        assert FAKE_KEY not in text


class LocalServer:
    """One `e2b-local serve` on loopback, dying with this process (stdin EOF)."""

    def __init__(self, *extra_args: str) -> None:
        binary = os.environ.get("E2B_LOCAL_BIN")
        if not binary or not os.path.exists(binary):
            raise RuntimeError("E2B_LOCAL_BIN must name the e2b-local binary (run scripts/hermes-tests)")
        self.proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--exit-on-stdin-eof", *extra_args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        lines: dict[str, str] = {}
        while "E2B_API_URL" not in lines or "E2B_SANDBOX_URL" not in lines:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"e2b-local exited early with {self.proc.wait()}")
            key, _, value = line.strip().partition("=")
            lines[key] = value
        self.api_url = lines["E2B_API_URL"]
        self.sandbox_url = lines["E2B_SANDBOX_URL"]

    def settings(self, **extra: Any) -> dict:
        return {"api_url": self.api_url, "sandbox_url": self.sandbox_url, **extra}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def e2b_local():
    server = LocalServer()
    yield server
    server.stop()
