"""Hermes lookups the plugin needs: settings, the profile's API key, a few terminal values.

Every function here only reads Hermes state; none touches the network, and none reads the
process environment as a fallback for the API key.
"""

from __future__ import annotations

import enum
import logging
import re
from pathlib import Path
from typing import Any, Callable, Optional

logger = logging.getLogger("hermes_e2b")

#: The API key's env-file name.
KEY_NAME = "E2B_API_KEY"

#: The native core's settings table: the keys under ``plugins.entries.e2b.settings`` (it
#: validates them) and their schema entries. Without the native core there is nothing to hand
#: settings to, and no sandbox.
try:
    from ._native import E2B_DEFAULT_HOME, SETTING_KEYS, SETTINGS
except ImportError:  # reported once by the package and as a doctor row
    SETTING_KEYS: tuple[str, ...] = ()
    SETTINGS: tuple[dict[str, Any], ...] = ()
    E2B_DEFAULT_HOME = "/home/user"

#: The sandbox home the latest attach in this process reported, per profile home. The
#: provider's static hints (``cache_path_base``, ``default_cwd``) have no environment in hand,
#: so they show the last real answer, and E2B's usual home before any sandbox exists.
_reported_homes: dict[str, str] = {}


def record_sandbox_home(profile: Path, home: str) -> None:
    """Remembers the home a sandbox of ``profile`` reported at attach."""
    _reported_homes[str(profile)] = home


def sandbox_home(profile: Optional[Path] = None) -> str:
    """The home the latest sandbox of ``profile`` (default: the active one) reported."""
    try:
        key = str(profile if profile is not None else profile_home())
    except Exception:  # no Hermes (unit tests of the package alone)
        key = ""
    return _reported_homes.get(key, E2B_DEFAULT_HOME)


class KeyStatus(enum.Enum):
    """Whether the active profile has an E2B API key. ``detail`` never contains the key."""

    CONFIGURED = "set for this profile"
    MISSING = "missing"
    UNSCOPED = "unconfigured: no profile secret scope is active; run `hermes gateway restart`"
    NO_LOOKUP = "unconfigured: this Hermes has no profile secret lookup, agent.secret_scope"

    @property
    def detail(self) -> str:
        if self is not KeyStatus.MISSING:
            return self.value
        # The native core's words, naming the active profile's env file (contract O5).
        try:
            from ._native import missing_key_message
        except ImportError:  # no core: the native row says why; still name the file
            return f"not set: add {KEY_NAME}=... to {profile_home() / '.env'}"
        return missing_key_message(profile_home())


def _lookup() -> tuple[Optional[str], KeyStatus]:
    try:
        from agent.secret_scope import UnscopedSecretError, get_secret
    except ImportError:
        return None, KeyStatus.NO_LOOKUP
    try:
        value = get_secret(KEY_NAME)
    except UnscopedSecretError:
        # Fail closed: the process environment may hold another profile's key.
        return None, KeyStatus.UNSCOPED
    if not value:
        return None, KeyStatus.MISSING
    return value, KeyStatus.CONFIGURED


def resolve_api_key() -> Optional[str]:
    """The active profile's API key, or None. Called by the native core on first use."""
    return _lookup()[0]


def resolve_credential(name: str) -> Optional[str]:
    """The active profile's value of a ``credentials`` variable (its ``.env`` through Hermes'
    profile-scoped secret lookup), or None. Called by the native core before every command;
    the value goes only into the sandbox's E2B network rules, never into the sandbox."""
    try:
        from agent.secret_scope import UnscopedSecretError, get_secret
    except ImportError:
        return None
    try:
        value = get_secret(name)
    except UnscopedSecretError:
        # Fail closed, as for the API key: the process environment may be another profile's.
        return None
    return value or None


def hermes_proxy_mappings() -> Optional[list[dict[str, Any]]]:
    """The mappings of Hermes' own egress credential firewall (``hermes egress``:
    ``proxy.enabled`` in ``config.yaml`` and its ``mappings.json``), without their proxy
    tokens: ``env_name``, ``upstream_hosts``, ``match_headers``, ``alias_env_names``. None where this Hermes has no
    such firewall or it is not enabled. Feature-detected: the module is Hermes'."""
    try:
        from hermes_cli.config import load_config_readonly

        proxy = (load_config_readonly() or {}).get("proxy") or {}
    except Exception as error:  # noqa: BLE001 - an unreadable config.yaml is reported elsewhere
        logger.debug("hermes-e2b: cannot read Hermes' proxy settings: %s", type(error).__name__)
        return None
    if not isinstance(proxy, dict) or not proxy.get("enabled"):
        return None
    try:
        from agent.proxy_sources.iron_proxy import load_mappings
    except ImportError:
        return None
    try:
        mappings = load_mappings()
    except Exception as error:  # noqa: BLE001 - Hermes' own doctor reports its firewall
        logger.warning("hermes-e2b: cannot read Hermes' egress mappings: %s", type(error).__name__)
        return None
    return [
        {
            "env_name": getattr(m, "real_env_name", None),
            "upstream_hosts": list(getattr(m, "upstream_hosts", ()) or ()),
            "match_headers": list(getattr(m, "match_headers", ()) or ()),
            "alias_env_names": list(getattr(m, "alias_env_names", ()) or ()),
        }
        for m in mappings
    ]


def key_status() -> KeyStatus:
    """Whether the key is configured, without returning it."""
    return _lookup()[1]


def read_settings(ctx: Any) -> dict[str, Any]:
    """The raw ``plugins.entries.e2b.settings`` mapping (validation is the native core's)."""
    get_config = getattr(ctx, "get_config", None)
    if get_config is None:
        return {}
    raw: dict[str, Any] = {}
    for key in SETTING_KEYS:
        try:
            value = get_config(key, None)
        except Exception as error:  # noqa: BLE001 - a broken config.yaml is reported, not raised
            logger.warning("hermes-e2b: cannot read setting %s: %s", key, type(error).__name__)
            continue
        if value is not None:
            raw[key] = value
    # Other keys go over by name only, so the native core can warn about them (with the
    # nearest known key) instead of ignoring a typo silently.
    for key in _settings_keys(ctx):
        if key not in SETTING_KEYS:
            raw[key] = None
    return raw


#: The settings that may change while Hermes runs and are re-read before every command.
EGRESS_KEYS = ("allow_out", "deny_out", "credentials")


def read_egress(ctx: Any) -> tuple[Any, Any, Any]:
    """``allow_out``, ``deny_out`` and ``credentials`` as ``config.yaml`` holds them now.
    Hermes' config cache re-reads the file only when it changed, so this costs no file parse
    (and no request)."""
    get_config = getattr(ctx, "get_config", None)
    if get_config is None:
        return (None, None, None)
    values = []
    for key in EGRESS_KEYS:
        try:
            values.append(get_config(key, None))
        except Exception as error:  # noqa: BLE001 - an unreadable config.yaml keeps the policy
            raise RuntimeError(f"hermes-e2b: cannot read setting {key}: {type(error).__name__}") from None
    return (values[0], values[1], values[2])


def _settings_keys(ctx: Any) -> list[str]:
    """The keys written under ``plugins.entries.<plugin>.settings`` (no values)."""
    try:
        from hermes_cli.config import load_config_readonly

        config = load_config_readonly() or {}
    except Exception as error:  # noqa: BLE001 - an unreadable config.yaml is reported elsewhere
        logger.debug("hermes-e2b: cannot list settings keys: %s", type(error).__name__)
        return []
    plugin_id = getattr(ctx, "plugin_id", None) or "e2b"
    node: Any = config
    for segment in ("plugins", "entries", plugin_id, "settings"):
        node = node.get(segment) if isinstance(node, dict) else None
    return [key for key in node if isinstance(key, str)] if isinstance(node, dict) else []


def profile_settings(ctx: Any) -> Any:
    """The native ``Settings`` of the plugin's ``config.yaml`` entry as it is now; raises
    RuntimeError when the native core is not importable."""
    from ._core import NATIVE_IMPORT_ERROR

    if NATIVE_IMPORT_ERROR is not None:
        raise RuntimeError(f"the native core is not importable: {NATIVE_IMPORT_ERROR}")
    return native_settings(read_settings(ctx))


def worktree_isolation() -> bool:
    """Hermes' own ``delegation.worktree_isolation`` in ``config.yaml`` (the user asked for
    isolated children); False where it is unset or unreadable."""
    try:
        from hermes_cli.config import load_config_readonly

        delegation = (load_config_readonly() or {}).get("delegation") or {}
    except Exception:  # noqa: BLE001 - an unreadable config.yaml is reported elsewhere
        return False
    return isinstance(delegation, dict) and delegation.get("worktree_isolation") is True


def container_key(task_id: Optional[str] = None) -> str:
    """The key Hermes gives the calling session's terminal scope (``task_id``, else its
    default): a gateway chat's ``session:<key>``, the CLI's ``default``. Hermes' own
    resolution where this Hermes has it, so a slash command finds the scope the chat's tools
    used; else ``task_id`` itself."""
    task = task_id or "default"
    try:
        from tools.terminal_tool import _resolve_container_task_id
    except ImportError:
        return task
    return str(_resolve_container_task_id(task))


def native_settings(raw: dict[str, Any]) -> Any:
    """The native core's validated ``Settings`` for ``raw``; a ConfigurationError names the
    key, what is valid and this profile's ``config.yaml``."""
    from ._native import Settings

    return Settings(raw, lifetime_seconds=lifetime_seconds(), profile_home=profile_home(),
                    hermes_proxy_mappings=hermes_proxy_mappings())


def command_timeout(value: Any = None) -> Optional[float]:
    """Hermes' ``terminal.timeout`` (``value``, else as Hermes' profile-aware lookup has it;
    None when unset: Hermes' default applies) in seconds; raises the native
    ConfigurationError for one the backend cannot use."""
    from ._native import command_timeout as check

    if value is None:
        try:
            from tools.terminal_scope import terminal_env
        except ImportError:
            return None
        value = terminal_env("TERMINAL_TIMEOUT")
        if value is None or str(value).strip() == "":
            return None
    return check(value, profile_home=profile_home())


def lifetime_seconds() -> Optional[int]:
    """``terminal.lifetime_seconds`` through Hermes' profile-aware terminal lookup; None when
    unset (the native core then applies its default)."""
    try:
        from tools.terminal_scope import terminal_env
    except ImportError:
        return None
    try:
        return int(float(terminal_env("TERMINAL_LIFETIME_SECONDS")))
    except (TypeError, ValueError):
        return None


def session_identity() -> tuple[str, str]:
    """``(HERMES_SESSION_KEY, HERMES_SESSION_ID)`` of the calling Hermes session: the gateway
    (one key per chat) and the TUI set them in context variables around a turn and around a
    slash command; the CLI sets the id. Empty where this Hermes has no session context."""
    try:
        from gateway.session_context import get_session_env
    except ImportError:
        return "", ""
    return get_session_env("HERMES_SESSION_KEY", "") or "", get_session_env("HERMES_SESSION_ID", "") or ""


def profile_home() -> Path:
    """The active Hermes home (profile-aware)."""
    from hermes_constants import get_hermes_home

    return Path(get_hermes_home())


def host_only_paths(home: Path) -> list[str]:
    """Host paths recovery must never write from sandbox data: the profile's config, env file,
    platforms/, and every credential file Hermes maps (read from Hermes, not guessed)."""
    paths = [str(home / "config.yaml"), str(home / ".env"), str(home / "platforms")]
    try:
        from tools.credential_files import get_credential_file_mounts

        paths += [entry["host_path"] for entry in get_credential_file_mounts() if entry.get("host_path")]
    except Exception as error:  # noqa: BLE001 - fewer exclusions is logged, not fatal
        logger.warning("hermes-e2b: cannot read Hermes' credential file mounts: %s", type(error).__name__)
    return paths


def inventory(settings: Any, progress: Optional[Callable[..., None]] = None) -> Any:
    """The native ``Inventory`` of this profile's sandboxes, for ``hermes e2b`` and the
    doctor's access check."""
    from . import _native

    home = profile_home()
    return _native.Inventory(
        settings,
        profile_home=home,
        lifetime_seconds=lifetime_seconds(),
        key_resolver=resolve_api_key,
        host_only=host_only_paths(home),
        progress=progress,
        credential_resolver=resolve_credential,
    )


#: The directory shim's pin line (``plugin/__init__.py``), which also marks a directory as ours.
_SHIM_PIN = re.compile(r'^WHEEL_VERSION = "([^"]+)"', re.MULTILINE)


def e2b_plugin_directories() -> list[tuple[str, Path, Optional[str]]]:
    """Directory plugins Hermes would load as ``e2b``, in its own discovery order:
    ``(key, path, pin)``, where ``pin`` is the wheel version a directory shim of this package
    pins, and None for any other plugin (e.g. the pure-Python hermes-plugin-e2b). Reads
    manifests and ``__init__.py`` heads only; empty on a Hermes without this discovery."""
    try:
        from hermes_cli.plugins_discovery import collect_directory_manifests
        from hermes_cli.plugins_manifest import manifest_key

        manifests = collect_directory_manifests()
    except Exception as error:  # noqa: BLE001 - an older or newer Hermes: nothing to report
        logger.debug("hermes-e2b: cannot list plugin directories: %s", type(error).__name__)
        return []
    found = []
    for manifest in manifests:
        key = manifest_key(manifest)
        if "e2b" not in (key, getattr(manifest, "name", None)) or not getattr(manifest, "path", None):
            continue
        path = Path(manifest.path)
        try:
            head = (path / "__init__.py").read_text(encoding="utf-8", errors="replace")[:8192]
        except OSError:
            head = ""
        pin = _SHIM_PIN.search(head) if "hermes_e2b" in head else None
        found.append((key, path, pin.group(1) if pin else None))
    return found
