"""The Hermes provider for the ``e2b`` terminal backend.

Imports Hermes' ``TerminalEnvironmentProvider`` at module level, so importing this module
fails on a Hermes without pluggable backends; :func:`hermes_e2b.register` handles that.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, Optional

from agent.terminal_env_provider import TerminalEnvironmentProvider

from ._core import NATIVE_IMPORT_ERROR, __version__, redact
from ._hermes import (
    KEY_NAME,
    SETTING_KEYS,
    SETTINGS,
    KeyStatus,
    command_timeout,
    e2b_plugin_directories,
    inventory,
    key_status,
    native_settings,
    profile_home,
    read_egress,
    read_settings,
    resolve_credential,
    sandbox_home,
)

logger = logging.getLogger("hermes_e2b")

#: Set (non-empty) to keep the doctor rows offline: no request to E2B (air-gapped hosts, and
#: tests that must never reach the real E2B).
OFFLINE_DOCTOR_VARIABLE = "HERMES_E2B_DOCTOR_OFFLINE"


def _native_module() -> Any:
    from . import _native

    return _native


def _creation_refused(error: Exception) -> Exception:
    """What create_environment raises for a configuration error: Hermes' creation-time
    ``EnvironmentConnectionError``, which its terminal tool shows once, as a result with the
    reason and the hint (what to fix, in which file), without a traceback and without
    retrying. Any other exception would become a traceback in the tool's result."""
    try:  # iot and newer; absent in 0.19.0
        from tools.environments.base import EnvironmentConnectionError
    except ImportError:  # pragma: no cover - old hosts show the exception itself
        return error
    return EnvironmentConnectionError(getattr(error, "reason", None) or str(error),
                                      retry_hint=getattr(error, "hint", None) or "run `hermes e2b doctor`")


def _doctor_text(text: str) -> str:
    """A failing doctor row's detail as Hermes repeats it in its summary: with "(" and ")"
    stripped from both ends, so a detail ending in ")" would lose its closing bracket."""
    return text + "." if text.endswith(")") or text.startswith("(") else text


class E2BProvider(TerminalEnvironmentProvider):
    """Hermes' view of the E2B backend: classification, health rows, environment factory."""

    is_remote = True
    is_container = True
    session_isolated_when_nonpersistent = True

    # Hints for hosts that know them (the provider-parity surface); harmless elsewhere. The
    # home is the one the latest sandbox reported (E2B's usual one before any exists).
    @property
    def default_cwd(self) -> str:
        return sandbox_home()

    @property
    def guest_home_root(self) -> str:
        return sandbox_home()

    def __init__(self, ctx: Any = None) -> None:
        self._ctx = ctx

    # --- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "e2b"

    @property
    def display_name(self) -> str:
        return "E2B"

    @property
    def description(self) -> str:
        return "Run commands in an E2B cloud sandbox (Rust core)."

    @property
    def cache_path_base(self) -> Optional[str]:
        # Absolute: Hermes shell-quotes the translated path when it probes it (tool-result
        # spill), so a "~" would never expand. Under the home the sandbox reported.
        return f"{sandbox_home().rstrip('/')}/.hermes"

    @property
    def strip_env_keys(self) -> frozenset[str]:
        return frozenset({KEY_NAME})

    @property
    def env_description(self) -> str:
        return f"an E2B cloud sandbox (Linux, home {sandbox_home()})"

    def get_setup_schema(self) -> dict:
        return {
            "name": self.display_name,
            "badge": "",
            "tag": "cloud sandbox",
            "env_vars": [{"key": KEY_NAME, "prompt": "E2B API key", "url": "https://e2b.dev/dashboard"}],
        }

    # --- cheap health (no network) --------------------------------------------------------
    def _settings_or_error(self, overrides: Optional[Mapping[str, Any]] = None) -> tuple[Any, Optional[str]]:
        settings, error = self._settings_or_exception(overrides)
        return settings, None if error is None else str(error)

    def _settings_or_exception(self, overrides: Optional[Mapping[str, Any]] = None) -> tuple[Any, Optional[Exception]]:
        if NATIVE_IMPORT_ERROR is not None:
            return None, ImportError(NATIVE_IMPORT_ERROR)
        raw = read_settings(self._ctx)
        if overrides:
            raw.update({k: v for k, v in overrides.items() if k in SETTING_KEYS})
        try:
            return native_settings(raw), None
        except Exception as error:  # ConfigurationError: names the key, the file, what is valid
            return None, error

    @staticmethod
    def _timeout_error(value: Any = None) -> Optional[str]:
        """Why Hermes' ``terminal.timeout`` cannot be used, or None."""
        if NATIVE_IMPORT_ERROR is not None:
            return None
        try:
            command_timeout(value)
        except Exception as error:  # ConfigurationError: names the setting and what is valid
            return str(error)
        return None

    def is_available(self) -> bool:
        return NATIVE_IMPORT_ERROR is None and key_status() is KeyStatus.CONFIGURED

    def check_requirements(self, config: Optional[dict] = None) -> bool:
        if NATIVE_IMPORT_ERROR is not None:
            logger.error("hermes-e2b: the native core is not importable: %s", NATIVE_IMPORT_ERROR)
            return False
        status = key_status()
        if status is not KeyStatus.CONFIGURED:
            logger.error("hermes-e2b: %s", status.detail)
            return False
        backend_config = (config or {}).get("backend_config") if isinstance(config, Mapping) else None
        _, error = self._settings_or_error(backend_config if isinstance(backend_config, Mapping) else None)
        error = error or self._timeout_error((config or {}).get("timeout") if isinstance(config, Mapping) else None)
        if error is not None:
            logger.error("hermes-e2b: %s", error)
            return False
        return True

    def probe(self) -> tuple[str, str]:
        try:
            if NATIVE_IMPORT_ERROR is not None:
                return "unavailable", f"E2B native core is not importable ({NATIVE_IMPORT_ERROR})."
            status = key_status()
            if status is not KeyStatus.CONFIGURED:
                return "needs_setup", status.detail
            _, error = self._settings_or_error()
            if error is not None:
                return "needs_setup", error
            return "ready", ""
        except Exception as error:  # noqa: BLE001 - probe must never raise
            return "unavailable", f"E2B probe failed: {type(error).__name__}"

    def probe_with_config(self, config: Mapping[str, Any]) -> tuple[str, str]:
        status, detail = self.probe()
        if status != "ready":
            return status, detail
        _, error = self._settings_or_error(config)
        return ("needs_setup", error) if error is not None else (status, detail)

    def doctor_checks(self) -> list[tuple[bool, str, str]]:
        if NATIVE_IMPORT_ERROR is None:
            native_row = (True, "E2B native core", f"hermes_e2b._native {__version__}")
        else:
            native_row = (False, "E2B native core", f"not importable: {NATIVE_IMPORT_ERROR}")
        status = key_status()
        key_row = (status is KeyStatus.CONFIGURED, "E2B API key", status.detail)
        settings, error = self._settings_or_error()
        rows = [native_row, self._interpreter_row(), key_row] + self._settings_rows(settings, error)
        if settings is not None:
            rows.append((True, "E2B endpoint", f"{settings.endpoint_summary()}, template {settings.template}"))
        if (settings is not None and status is KeyStatus.CONFIGURED and NATIVE_IMPORT_ERROR is None
                and not os.environ.get(OFFLINE_DOCTOR_VARIABLE)):
            rows.append(self._access_row(settings))
            if settings.credentials:
                rows.append(self._credential_store_row(settings))
        if settings is not None:
            rows.append((True, "E2B writer arbitration", settings.arbitration_summary()))
            rows.append((True, "E2B egress policy", settings.egress_summary()))
            from . import subagents

            subagent_row = subagents.doctor_row(settings)
            if subagent_row is not None:
                rows.append(subagent_row)
            from . import kernels, processes

            rows.append(kernels.doctor_row(settings))
            rows.append(processes.doctor_row(settings))
            rows += self._credential_rows(settings)
        rows += self._other_plugin_rows()
        # Rows quote settings and errors, which may carry credentials (X4).
        return [(ok, redact(name), redact(detail) if ok else _doctor_text(redact(detail))) for ok, name, detail in rows]

    def _credential_rows(self, settings: Any) -> list[tuple[bool, str, str]]:
        """The "E2B credentials" row: each configured name, its hosts and whether the profile
        has its value (never the value); a missing one fails the row (X16)."""
        configured = settings.credentials
        if not configured:
            return []
        missing = [c["name"] for c in configured if resolve_credential(c["name"]) is None]
        names = "; ".join(f"{c['name']} for {', '.join(c['hosts'])}" for c in configured)
        if missing:
            return [(False, "E2B credentials", f"{names}; no value for {', '.join(missing)}: "
                     f"set it in {profile_home() / '.env'}")]
        return [(True, "E2B credentials", f"{names}; the sandbox sees stand-ins")]

    def _settings_rows(self, settings: Any, settings_error: Optional[str]) -> list[tuple[bool, str, str]]:
        """The "E2B settings" row: the plugin's settings and Hermes' ``terminal.timeout``, one
        row per problem (each names the setting, its file and what is valid)."""
        if NATIVE_IMPORT_ERROR is not None:
            return [(False, "E2B settings", "not checked: the native core is not importable")]
        problems = [e for e in (settings_error, self._timeout_error()) if e is not None]
        # A misspelled key is ignored (the default applies), which the user should see here.
        problems += settings.unknown_key_notes() if settings is not None else []
        if problems:
            return [(False, "E2B settings", problem) for problem in problems]
        return [(True, "E2B settings", "valid: plugins.entries.e2b.settings and terminal.timeout")]

    @staticmethod
    def _access_row(settings: Any) -> tuple[bool, str, str]:
        """One cheap authenticated request (creates nothing, short deadline): whether this
        setup will work. The wording, hint included, is the native core's."""
        try:
            access = inventory(settings).check_access()
        except Exception as error:  # noqa: BLE001 - a doctor row never raises
            return (False, "E2B API access", f"the check could not run: {error}")
        if not access["ok"]:
            return (False, "E2B API access", access["error"])
        running = "" if access["running"] is None else f", {access['running']} sandboxes running"
        return (True, "E2B API access",
                f"the key is accepted by {access['api_url']} ({access['seconds'] * 1000:.0f} ms{running})")

    @staticmethod
    def _credential_store_row(settings: Any) -> tuple[bool, str, str]:
        """Where the credentials' values are kept (X22), as E2B answers now: its Secrets, or
        the rules and why. A failed look fails the row; the fallback does not."""
        try:
            store = inventory(settings).credential_store()
        except Exception as error:  # noqa: BLE001 - a doctor row never raises
            return (False, "E2B credential store", f"not read: {error}")
        if store["store"] == "secrets":
            names = ", ".join(s["name"] for s in store["secrets"]) or "none stored yet"
            return (True, "E2B credential store", f"E2B Secrets ({names}); sandboxes' rules hold placeholders only")
        return (True, "E2B credential store", store["summary"])

    @staticmethod
    def _interpreter_row() -> tuple[bool, str, str]:
        # Hermes never installs python_dependencies: the wheel must sit in this interpreter.
        return (True, "E2B plugin", f"hermes-e2b {__version__} in the interpreter that runs Hermes ({sys.executable})")

    @staticmethod
    def _other_plugin_rows() -> list[tuple[bool, str, str]]:
        rows = []
        for key, path, pin in e2b_plugin_directories():
            if pin is None:
                rows.append((False, "E2B plugin", f"another plugin also provides e2b at {path} (the pure-Python "
                             f"hermes-plugin-e2b?); this wheel is the active one. Remove the other: "
                             f"hermes plugins remove {key}, then enable e2b again "
                             f"(hermes config set plugins.enabled '[\"e2b\", ...]')"))
            elif pin != __version__:
                rows.append((False, "E2B plugin", f"the plugin directory {path} pins hermes-e2b=={pin}, but "
                             f"{__version__} is installed: install hermes-e2b {pin} (scripts/install-plugin --python "
                             f"{sys.executable} in a checkout of that version), or update that directory"))
        return rows

    # --- setup ----------------------------------------------------------------------------
    def setup_instructions(self) -> list[str]:
        return [
            "E2B runs every terminal, file and execute_code call in a cloud sandbox.",
            f"1. Get an API key at https://e2b.dev/dashboard and add it to this profile's env file: "
            f"echo '{KEY_NAME}=e2b_...' >> {profile_home() / '.env'}",
            "2. Optional settings live under plugins.entries.e2b.settings in config.yaml (template, cwd, lease_seconds, ...).",
            "3. Check it: hermes e2b doctor",
        ]

    def post_setup(self) -> None:
        # Deliberately not interactive: the key belongs in the profile's .env, never in config.yaml.
        status = key_status()
        if status is not KeyStatus.CONFIGURED:
            logger.warning("hermes-e2b: %s", status.detail)

    # --- newer config-schema surface (feature-detected by the host) -------------------------
    def get_config_schema(self) -> dict[str, dict]:
        # The native settings table, keyed the way Hermes wants it (fresh dicts per call).
        return {entry["key"]: {k: v for k, v in entry.items() if k != "key"} for entry in SETTINGS}

    def resolve_config(self, config: Mapping[str, Any]) -> dict:
        raw = read_settings(self._ctx)
        raw.update({k: v for k, v in dict(config or {}).items() if k in SETTING_KEYS})
        if NATIVE_IMPORT_ERROR is None:
            try:
                native_settings(raw)
            except Exception as error:
                raise ValueError(str(error)) from None
        # Unknown keys were read by name only (to warn about them); they resolve to nothing.
        return {k: v for k, v in raw.items() if k in SETTING_KEYS}

    # --- the factory ----------------------------------------------------------------------
    def create_environment(
        self,
        *,
        cwd: str,
        timeout: int,
        task_id: str = "default",
        image: Optional[str] = None,
        container_config: Optional[dict] = None,
        **kwargs: Any,
    ) -> Any:
        # Unknown kwargs are accepted and ignored (forward compatibility); image is always ""
        # for plugin backends and E2B sizes sandboxes by template.
        if NATIVE_IMPORT_ERROR is not None:
            raise ImportError(f"hermes-e2b native core is not importable: {NATIVE_IMPORT_ERROR}")
        backend_config = kwargs.get("backend_config")
        settings, error = self._settings_or_exception(backend_config if isinstance(backend_config, Mapping) else None)
        try:
            if error is not None:
                raise error
            # Hermes' deadline for every command: one it cannot meet is refused here, once.
            command_timeout(timeout)
        except _native_module().ConfigurationError as refused:
            raise _creation_refused(refused) from None
        from .environment import E2BEnvironment

        persistent = bool((container_config or {}).get("container_persistent", True))
        ctx = self._ctx
        from . import subagents

        child = subagents.claim(task_id)
        if child is not None:
            # A delegated child's first tool call (R15): its environment is a fork of the
            # parent's sandbox, made now.
            return subagents.child_environment(child, lambda native, parent: E2BEnvironment(
                settings=settings, cwd=parent.cwd, timeout=int(timeout), task_id=task_id, persistent=persistent,
                egress_source=lambda: read_egress(ctx), native=native))
        return E2BEnvironment(
            settings=settings,
            cwd=cwd,
            timeout=int(timeout),
            task_id=task_id,
            persistent=persistent,
            # Re-read before every command: a narrowed policy holds from the next one (X10).
            egress_source=lambda: read_egress(ctx),
        )
