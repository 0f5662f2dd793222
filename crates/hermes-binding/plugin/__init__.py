"""Directory shim for `hermes plugins install`: the real plugin is the `hermes-e2b` wheel.

Never install this shim and enable the wheel's entry point under the same key on one host.
Importing it never fails: without the wheel, register() logs one line and registers nothing.
"""

import logging

#: The wheel this shim expects (kept equal to plugin.yaml's version).
WHEEL_VERSION = "0.1.0"

try:
    from hermes_e2b import __version__, register
except ImportError as _error:
    __version__ = WHEEL_VERSION
    _REASON = str(_error)

    def register(ctx):
        logging.getLogger("hermes_e2b").warning(
            "hermes-e2b: the wheel is not installed in Hermes' interpreter (%s); "
            "run: pip install hermes-e2b==%s",
            _REASON,
            WHEEL_VERSION,
        )

__all__ = ["register", "__version__", "WHEEL_VERSION"]
