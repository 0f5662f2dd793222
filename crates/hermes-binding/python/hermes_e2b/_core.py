"""What the compiled core offers the rest of the package: whether it loaded, the version,
and the redaction pass. Below every other module of the package (it imports only
``_native``), so none of them has to import the package itself back.
"""

from __future__ import annotations

#: Why the compiled core could not be imported (None when it loaded). Reported by the
#: doctor rows rather than raised, so a broken install still registers and explains.
NATIVE_IMPORT_ERROR: str | None

try:
    from . import _native

    __version__: str = _native.__version__
    NATIVE_IMPORT_ERROR = None
    _redact = _native.redact
except ImportError as _error:  # the directory shim can run without the wheel installed
    NATIVE_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"
    try:
        from importlib.metadata import version as _dist_version

        __version__ = _dist_version("hermes-e2b")
    except Exception:  # noqa: BLE001 - no distribution metadata at all
        __version__ = "0.0.0+unknown"

    def _redact(text: str) -> str:
        # Without the core there is no backend, so no sandbox or server text to clean.
        return text


def redact(text: str) -> str:
    """The native redaction pass; doctor rows and log records go through it."""
    return _redact(text)
