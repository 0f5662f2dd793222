"""The release wheel in a fresh venv beside a real Hermes, with no Rust or C toolchain on
PATH: what a Hermes user's `pip install hermes-e2b` gives them. Run by scripts/wheel-test."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import textwrap
import uuid
from pathlib import Path

from hermes_conftest import FAKE_KEY, assert_no_key

#: Anything that could compile or link the extension at install or run time.
TOOLCHAIN = ("cc", "gcc", "g++", "c++", "clang", "ld", "as", "cargo", "rustc", "rustup", "zig", "maturin", "make")


def test_nothing_on_path_could_build_the_extension():
    found = {tool: shutil.which(tool) for tool in TOOLCHAIN}
    assert not {tool: path for tool, path in found.items() if path}, "the toolchain is reachable"
    assert not any(os.environ.get(name) for name in ("CC", "CARGO", "RUSTC")), "a toolchain is configured"


def test_the_installed_wheel_is_the_portable_release_artifact(home):
    result = home.driver(
        """
        import json, importlib.metadata as md, sys
        import hermes_e2b, hermes_e2b._native as native
        dist = md.distribution("hermes-e2b")
        print("RESULT:" + json.dumps({"tags": [l.split(": ", 1)[1] for l in dist.read_text("WHEEL").splitlines()
                                               if l.startswith("Tag: ")],
              "native": native.__file__, "prefix": sys.prefix, "version": hermes_e2b.__version__,
              "installer": (dist.read_text("INSTALLER") or "").strip()}))
        """
    )
    arch = platform.machine()
    assert result["tags"] == [f"cp311-abi3-manylinux_2_28_{arch}"]
    assert Path(os.environ["HERMES_E2B_WHEEL"]).name.startswith(f"hermes_e2b-{result['version']}-")
    assert result["native"].startswith(result["prefix"]) and result["prefix"] == sys.prefix
    assert result["installer"] == "pip"


def test_smoke_register_doctor_command_and_file_write(home, e2b_local):
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), enabled=False, terminal={"timeout": 60})
    home.write_key()
    # Register: the README's enable path that needs no package manager download.
    enable = home.hermes("config", "set", "plugins.enabled", '["e2b"]')
    assert enable.returncode == 0, enable.stdout + enable.stderr
    listing = home.hermes("plugins", "list", "--plain", "--no-bundled")
    line = next(l for l in listing.stdout.splitlines() if l.split() and l.split()[-1] == "e2b")
    assert "enabled" in line and "entrypoint" in line, listing.stdout
    # hermes doctor (told it is not in a container, where it would skip plugin backends).
    doctor = home.python(
        """
        import sys, hermes_constants
        hermes_constants.is_container = lambda: False
        from hermes_cli.main import main
        sys.argv = ["hermes", "doctor"]
        try:
            main()
        except SystemExit:
            pass
        """
    )
    assert "E2B native core" in doctor.stdout, doctor.stdout[-3000:] + doctor.stderr[-3000:]
    assert "set for this profile" in doctor.stdout
    assert f"{e2b_local.api_url} (api and sandbox)" in doctor.stdout
    assert f"in the interpreter that runs Hermes ({sys.executable})" in doctor.stdout
    # A command and a file write through Hermes' own tools, into an e2b-local sandbox.
    payload = "written by the installed wheel\n" * 64
    result = home.driver(
        textwrap.dedent(
            """
            import json
            from hermes_cli.env_loader import load_hermes_dotenv
            load_hermes_dotenv()
            from hermes_cli.plugins import discover_plugins
            discover_plugins()
            import tools.terminal_tool as tt
            from tools.file_tools import write_file_tool
            hello = json.loads(tt.terminal_tool("echo hello from $(uname -s); pwd", task_id="t1"))
            wrote = json.loads(write_file_tool("/home/user/smoke/out.txt", PAYLOAD, task_id="t1"))
            back = json.loads(tt.terminal_tool("sha256sum /home/user/smoke/out.txt", task_id="t1"))
            print("RESULT:" + json.dumps({"hello": hello, "wrote": wrote, "back": back}))
            """
        ).replace("PAYLOAD", repr(payload))
    )
    assert result["hello"]["exit_code"] == 0
    assert result["hello"]["output"].splitlines()[0] == "hello from Linux"
    assert "error" not in result["wrote"], result["wrote"]
    import hashlib

    assert result["back"]["output"].split()[0] == hashlib.sha256(payload.encode()).hexdigest()
    assert_no_key(doctor.stdout, doctor.stderr, json.dumps(result))
    assert FAKE_KEY not in listing.stdout
