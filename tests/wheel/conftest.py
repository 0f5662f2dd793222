"""tests/wheel runs inside the fresh venv scripts/wheel-test builds, with a PATH holding no
toolchain. It reuses tests/hermes' fixtures (a temporary HERMES_HOME, the e2b-local server)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "hermes_conftest", Path(__file__).resolve().parents[1] / "hermes" / "conftest.py"
)
hermes_conftest = importlib.util.module_from_spec(_spec)
sys.modules["hermes_conftest"] = hermes_conftest
_spec.loader.exec_module(hermes_conftest)

home = hermes_conftest.home

#: e2b-local stands in for E2B's cloud machine, not for the Hermes host: its sandboxes get
#: the ordinary system PATH (their commands need coreutils; the host's toolchain rule is
#: about the process that runs Hermes and the plugin).
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="session")
def e2b_local():
    host_path = os.environ["PATH"]
    os.environ["PATH"] = SANDBOX_PATH
    try:
        server = hermes_conftest.LocalServer()
    finally:
        os.environ["PATH"] = host_path
    yield server
    server.stop()
