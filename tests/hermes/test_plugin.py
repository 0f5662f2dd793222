"""The plugin as Hermes sees it: packaging, discovery both ways, doctor and status rows,
registration without network, secrets. Every Hermes call runs in a fresh subprocess."""

from __future__ import annotations

import shutil
import sys

from conftest import FAKE_KEY, SHIM_DIR, assert_no_key, install_command, load_yaml


def test_wheel_metadata_entry_point_and_typing(home):
    result = home.driver(
        """
        import json, importlib.metadata as md, importlib.resources as res
        dist = md.distribution("hermes-e2b")
        eps = [(ep.name, ep.value) for ep in md.entry_points(group="hermes_agent.plugins")]
        import hermes_e2b, hermes_e2b._native as native
        files = {f.name for f in res.files("hermes_e2b").iterdir()}
        print("RESULT:" + json.dumps({
            "name": dist.metadata["Name"], "version": dist.version, "eps": eps,
            "pkg_version": hermes_e2b.__version__, "native_version": native.__version__,
            "files": sorted(files),
            "hierarchy": [issubclass(getattr(native, n), native.E2BError) for n in
                          ("ConfigurationError", "NotReadyError", "SandboxGoneError", "StateSyncError", "BackendClosedError")],
        }))
        """
    )
    assert result["name"] == "hermes-e2b"
    assert ["e2b", "hermes_e2b"] in result["eps"]
    assert result["version"] == result["pkg_version"] == result["native_version"]
    assert {"py.typed", "_native.pyi", "__init__.py"} <= set(result["files"])
    assert all(result["hierarchy"])
    shim = load_yaml(SHIM_DIR / "plugin.yaml")
    assert shim["name"] == "e2b"
    assert str(shim["version"]) == result["version"], "the shim pins the wheel's version"
    assert f"hermes-e2b=={result['version']}" in shim["python_dependencies"]


def test_import_and_register_touch_no_network(home):
    # NETWORK_GUARD blocks every non-loopback connect; any socket at all is also counted.
    result = home.driver(
        """
        import json, socket
        opened = []
        _orig = socket.socket.__init__
        def _track(self, *a, **k):
            opened.append(a)
            _orig(self, *a, **k)
        socket.socket.__init__ = _track
        import hermes_e2b
        class Ctx:
            def __init__(self): self.providers = []
            def register_terminal_environment_provider(self, p): self.providers.append(p)
            def get_config(self, key, default=None): return default
        ctx = Ctx()
        hermes_e2b.register(ctx)
        p = ctx.providers[0]
        rows = p.doctor_checks(); status = p.probe(); avail = p.is_available()
        print("RESULT:" + json.dumps({"names": [x.name for x in ctx.providers], "sockets": len(opened),
              "rows": rows, "probe": list(status), "available": avail}))
        """
    )
    assert result["names"] == ["e2b"]
    assert result["sockets"] == 0, "import, register, doctor rows and probe open no socket"
    assert result["probe"][0] == "needs_setup"  # no key in this HERMES_HOME
    assert result["available"] is False


def test_register_on_a_host_without_the_provider_abc_logs_one_line(home):
    result = home.driver(
        """
        import json, logging, sys
        records = []
        class H(logging.Handler):
            def emit(self, r): records.append(r.getMessage())
        logging.getLogger("hermes_e2b").addHandler(H())
        sys.modules["agent.terminal_env_provider"] = None  # what 0.19.0 looks like: no such module
        import hermes_e2b
        class Ctx:
            called = 0
            def register_terminal_environment_provider(self, p): Ctx.called += 1
        hermes_e2b.register(Ctx())
        print("RESULT:" + json.dumps({"records": records, "called": Ctx.called}))
        """
    )
    assert result["called"] == 0
    assert len(result["records"]) == 1
    assert "no pluggable terminal backends" in result["records"][0]


def test_entry_point_discovery_after_enable(home):
    # contract: X3 (strip_env_keys carries E2B_API_KEY into Hermes' union)
    home.write_config(enabled=False)
    # iot's `plugins enable` hands the new selection to its package manager, which syncs a
    # managed interpreter (a download; no network here) and then writes config.yaml. Stand in
    # for that one step (write the selection it was given), and run the real command.
    enable = home.python(
        """
        import sys
        import hermes_cli.plugins_admission as admission
        def admit(enabled, disabled, **kwargs):
            from hermes_cli.config import load_config, save_config
            config = load_config()
            config.setdefault("plugins", {})["enabled"] = sorted(enabled)
            config["plugins"]["disabled"] = sorted(disabled)
            save_config(config)
        admission.admit_plugin_set_change = admit
        from hermes_cli.main import main
        sys.argv = ["hermes", "plugins", "enable", "e2b"]
        sys.exit(main())
        """
    )
    assert enable.returncode == 0, enable.stdout + enable.stderr
    config = load_yaml(home.path / "config.yaml")
    assert "e2b" in config["plugins"]["enabled"]
    select = home.hermes("config", "set", "terminal.backend", "e2b")
    assert select.returncode == 0, select.stderr
    assert load_yaml(home.path / "config.yaml")["terminal"]["backend"] == "e2b"
    listing = home.hermes("plugins", "list", "--plain", "--no-bundled")
    line = next(l for l in listing.stdout.splitlines() if l.split() and l.split()[-1] == "e2b")
    assert "enabled" in line and "entrypoint" in line
    result = home.driver(
        """
        import json
        from hermes_cli.plugins import discover_plugins
        discover_plugins()
        from agent.terminal_env_registry import get_provider, plugin_strip_env_keys
        p = get_provider("e2b")
        print("RESULT:" + json.dumps({"cls": type(p).__name__, "name": p.name,
              "flags": [p.is_remote, p.is_container, p.session_isolated_when_nonpersistent],
              "strip": sorted(plugin_strip_env_keys()), "cache": p.cache_path_base}))
        """
    )
    assert result["cls"] == "E2BProvider" and result["name"] == "e2b"
    assert result["flags"] == [True, True, True]
    assert "E2B_API_KEY" in result["strip"]
    # Absolute: Hermes shell-quotes it when probing a spilled result (no "~" expansion).
    assert result["cache"] == "/home/user/.hermes"


def test_disabled_plugin_is_not_loaded(home):
    home.write_config(enabled=False)
    result = home.driver(
        """
        import json
        from hermes_cli.plugins import discover_plugins
        discover_plugins()
        from agent.terminal_env_registry import get_provider
        print("RESULT:" + json.dumps({"provider": get_provider("e2b") is not None}))
        """
    )
    assert result["provider"] is False


def test_directory_shim_passes_plugins_doctor_ci(home):
    proc = home.hermes("plugins", "doctor", str(SHIM_DIR), "--ci")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: runtime discovery, manifest parsing, import, and registration passed" in proc.stdout
    assert "manifest: e2b" in proc.stdout


def test_directory_shim_discovery(home):
    # The wheel is installed in this venv, so hide its entry point: one key, one source.
    shutil.copytree(SHIM_DIR, home.path / "plugins" / "e2b")
    home.write_config()
    result = home.driver(
        """
        import json, importlib.metadata as md
        _orig = md.entry_points
        def _no_e2b(*a, **k):
            eps = _orig(*a, **k)
            if k.get("group") == "hermes_agent.plugins":
                return md.EntryPoints([e for e in eps if e.name != "e2b"])
            return eps
        md.entry_points = _no_e2b
        from hermes_cli.plugins import discover_plugins, get_plugin_manager
        discover_plugins()
        from agent.terminal_env_registry import get_provider
        p = get_provider("e2b")
        manager = get_plugin_manager()
        loaded = {name: getattr(getattr(lp, "manifest", None), "source", None)
                  for name, lp in getattr(manager, "_plugins", {}).items()}
        print("RESULT:" + json.dumps({"provider": type(p).__name__ if p else None, "loaded": {k: str(v) for k, v in loaded.items()}}))
        """
    )
    assert result["provider"] == "E2BProvider"
    assert result["loaded"].get("e2b") not in (None, "entrypoint"), result["loaded"]


def test_status_full_shows_the_doctor_rows_without_the_key(home):
    # contract: C8 — the doctor rows name who arbitrates the writer role.
    home.write_config(settings={"template": "my-template", "writer_arbitration": "sandbox"})
    home.write_key()
    proc = home.hermes("status", "--full")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "E2B native core: ✓ hermes_e2b._native" in out
    assert "E2B API key: ✓ set for this profile" in out
    assert "E2B endpoint: ✓ E2B cloud (e2b.app), template my-template" in out
    assert "E2B writer arbitration: ✓ sandbox (a fenced record in the sandbox" in out
    assert_no_key(proc.stdout, proc.stderr)


def test_status_reports_a_missing_key_and_a_bad_setting(home):
    home.write_config(settings={"lease_seconds": "soon"})
    proc = home.hermes("status", "--full")
    assert "E2B API key: ✗ no E2B API key for this profile" in proc.stdout
    assert "E2B settings: ✗ E2B setting lease_seconds (plugins.entries.e2b.settings in" in proc.stdout
    assert "E2B endpoint" not in proc.stdout


def test_hermes_doctor_rows(home):
    home.write_config(settings={"api_url": "http://127.0.0.1:9", "sandbox_url": "http://127.0.0.1:9"})
    home.write_key()
    proc = home.doctor()
    out = proc.stdout
    assert "E2B native core" in out, out[-3000:] + proc.stderr[-3000:]
    assert "E2B API key" in out and "set for this profile" in out
    assert "http://127.0.0.1:9 (api and sandbox)" in out
    assert_no_key(proc.stdout, proc.stderr)


def test_key_resolution_fails_closed_without_a_profile_scope(home):
    home.write_config()
    # The key sits in the process environment, but multiplexing is active and no scope is
    # installed: the plugin must report unconfigured, not read os.environ (contract X2).
    result = home.driver(
        """
        import json
        from agent.secret_scope import set_multiplex_active
        from hermes_e2b.provider import E2BProvider
        from hermes_e2b._hermes import resolve_api_key
        set_multiplex_active(True)
        p = E2BProvider(None)
        print("RESULT:" + json.dumps({"rows": p.doctor_checks(), "key": resolve_api_key() is None,
                                      "available": p.is_available(), "probe": list(p.probe())}))
        """,
        extra_env={"E2B_API_KEY": FAKE_KEY},
    )
    key_row = next(r for r in result["rows"] if r[1] == "E2B API key")
    assert key_row[0] is False and "no profile secret scope" in key_row[2]
    assert result["key"] is True
    assert result["available"] is False
    assert result["probe"][0] == "needs_setup"


def test_config_schema_surface_for_newer_hosts(home):
    home.write_config()
    result = home.driver(
        """
        import json
        from hermes_e2b.provider import E2BProvider
        p = E2BProvider(None)
        schema = p.get_config_schema()
        ok = p.resolve_config({"template": "t2"})
        try:
            p.resolve_config({"secure": "maybe"}); bad = None
        except ValueError as e:
            bad = str(e)
        print("RESULT:" + json.dumps({"keys": sorted(schema), "ok": ok, "bad": bad,
              "pwc": list(p.probe_with_config({"lease_seconds": 0}))}))
        """
    )
    assert {"template", "cwd", "lease_seconds", "sandbox_id", "api_url"} <= set(result["keys"])
    assert result["ok"]["template"] == "t2"
    assert "secure" in result["bad"]
    assert result["pwc"][0] == "needs_setup"


def test_schema_defaults_and_remote_home_come_from_the_native_settings_table(home):
    result = home.driver(
        """
        import json
        from hermes_e2b import _native
        from hermes_e2b.provider import E2BProvider
        p = E2BProvider(None)
        p.get_config_schema()["template"]["default"] = "changed by a caller"
        print("RESULT:" + json.dumps({"schema": p.get_config_schema(), "table": list(_native.SETTINGS),
              "keys": list(_native.SETTING_KEYS), "home": _native.E2B_DEFAULT_HOME, "default_cwd": p.default_cwd,
              "settings_cwd": _native.Settings({}).cwd, "cache_base": p.cache_path_base}))
        """
    )
    assert result["keys"] == [entry["key"] for entry in result["table"]]
    schema = result["schema"]
    assert list(schema) == result["keys"]
    assert schema["template"]["type"] == "string" and schema["template"]["default"] == "base"
    assert schema["command_grace_seconds"] == {"type": "number", "default": 30,
                                               "description": "Lease headroom beyond a command's deadline."}
    assert schema["secure"]["type"] == "boolean" and schema["secure"]["default"] is True
    assert "default" not in schema["lease_seconds"], "derived from terminal.lifetime_seconds"
    assert schema["metadata"]["type"] == "text"
    # Before any sandbox reported its home, the hints show E2B's usual one; the setting
    # itself stays unset, so commands follow the sandbox's real $HOME.
    assert result["home"] == result["default_cwd"] == "/home/user"
    assert result["cache_base"] == "/home/user/.hermes"
    assert result["settings_cwd"] is None
    assert "default" not in schema["cwd"] and "$HOME" in schema["cwd"]["description"]


def test_rust_tracing_reaches_python_logging(home):
    result = home.driver(
        """
        import json, logging
        records = []
        class H(logging.Handler):
            def emit(self, r): records.append((r.name, r.levelname, r.getMessage()))
        logger = logging.getLogger("hermes_e2b"); logger.addHandler(H()); logger.setLevel(logging.INFO)
        from hermes_e2b import _native
        _native.emit_log("warn", "bridge check")
        _native.emit_log("debug", "below the logger level")
        print("RESULT:" + json.dumps(records))
        """
    )
    assert ["hermes_e2b", "WARNING", "bridge check"] in result
    assert all("below the logger level" not in r[2] for r in result)


def test_stubs_match_the_native_module(home):
    result = home.driver(
        """
        import ast, json, importlib.resources as res
        from hermes_e2b import _native
        tree = ast.parse(res.files("hermes_e2b").joinpath("_native.pyi").read_text())
        stubbed = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                stubbed[node.name] = sorted(n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("__"))
            elif isinstance(node, ast.FunctionDef):
                stubbed[node.name] = None
            elif isinstance(node, ast.AnnAssign):
                stubbed[node.target.id] = None
        public = {n for n in dir(_native) if not n.startswith("_") or n == "__version__"}
        members = {n: sorted(m for m in dir(getattr(_native, n)) if not m.startswith("_"))
                   for n in stubbed if stubbed[n] is not None}
        print("RESULT:" + json.dumps({"stubbed": stubbed, "public": sorted(public), "members": members}))
        """
    )
    assert set(result["stubbed"]) == set(result["public"])
    for name, methods in result["stubbed"].items():
        if methods is None or name.endswith("Error"):
            continue
        assert set(methods) == set(result["members"][name]), name


def test_shim_without_the_wheel_imports_and_explains(home):
    result = home.driver(
        f"""
        import importlib.util, json, logging, sys
        sys.modules["hermes_e2b"] = None  # the wheel is not installed
        records = []
        class H(logging.Handler):
            def emit(self, r): records.append(r.getMessage())
        logging.getLogger("hermes_e2b").addHandler(H())
        spec = importlib.util.spec_from_file_location("e2b_shim", {str(SHIM_DIR / "__init__.py")!r})
        shim = importlib.util.module_from_spec(spec); spec.loader.exec_module(shim)
        class Ctx:
            called = 0
            def register_terminal_environment_provider(self, p): Ctx.called += 1
        shim.register(Ctx())
        print("RESULT:" + json.dumps({{"records": records, "called": Ctx.called, "version": shim.__version__}}))
        """
    )
    # One stand-in provider (never available; see test_upstream_seams for its doctor row).
    assert result["called"] == 1
    assert len(result["records"]) == 1
    assert install_command(sys.executable) in result["records"][0]
    assert result["version"] == load_yaml(SHIM_DIR / "plugin.yaml")["version"]


def test_debug_log_switch_writes_the_cores_records_to_the_profiles_e2b_log(home, e2b_local):
    # HERMES_E2B_LOG=debug is the documented switch: the Rust core's DEBUG records (one per
    # E2B request) land in logs/e2b.log of the profile, redacted; without it there is no file.
    home.write_config(settings=e2b_local.settings())
    home.write_key()
    log = home.path / "logs" / "e2b.log"
    quiet = home.hermes("e2b", "doctor", "--live")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert not log.exists()
    loud = home.hermes("e2b", "doctor", "--live", extra_env={"HERMES_E2B_LOG": "debug"})
    assert loud.returncode == 0, loud.stdout + loud.stderr
    text = log.read_text()
    assert " DEBUG hermes_e2b: E2B request answered" in text, text[-2000:]
    assert "operation=create sandbox status=201" in text, text[-2000:]
    assert_no_key(text, loud.stdout, loud.stderr)


def test_the_readmes_and_the_hints_give_one_install_command():
    # The README's install line is the shim's INSTALL_COMMAND (the hint a missing wheel shows),
    # less `--python`, which the installer works out from the `hermes` launcher.
    from conftest import REPO

    for readme in (REPO / "README.md", SHIM_DIR.parent / "README.md"):
        assert f"\n{install_command()}\n" in readme.read_text(), readme


def test_the_readme_shows_what_the_installer_prints_at_its_end():
    # The README's "It ends with:" block is the installer's closing text, version and
    # interpreter filled in.
    import re

    from conftest import REPO

    script = (REPO / "scripts" / "install-plugin").read_text()
    closing = script.split("cat <<EOF\n", 1)[1].split("\nEOF", 1)[0]
    readme = (REPO / "README.md").read_text()
    shown = readme.split("It ends with:\n\n```text\n", 1)[1].split("```", 1)[0].rstrip("\n")
    version = load_yaml(SHIM_DIR / "plugin.yaml")["version"]
    expected = closing.replace("$version", version)
    assert re.fullmatch(re.escape(expected).replace(re.escape("($python)"), r"\(/\S+\)"), shown), (shown, expected)
