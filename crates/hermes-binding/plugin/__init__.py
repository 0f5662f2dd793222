"""Directory shim for `hermes plugins install`: the real plugin is the `hermes-e2b` wheel.

Never install this shim and enable the wheel's entry point under the same key on one host.
Importing it never fails. Without the wheel in the interpreter that runs Hermes (Hermes never
installs ``python_dependencies``), register() logs one line and registers a stand-in ``e2b``
backend that is never available, so ``hermes doctor`` names that interpreter and the pip
command instead of reporting an unknown backend.
"""

import logging
import sys

#: The wheel this shim expects (kept equal to plugin.yaml's version).
WHEEL_VERSION = "0.1.0"

#: How to install the wheel while it is not published (the README's install command; a test
#: keeps the two equal). ``{python}`` is the interpreter that runs Hermes.
INSTALL_COMMAND = ("git clone https://github.com/hermes-e2b/hermes-e2b && "
                   "hermes-e2b/scripts/install-plugin --python {python}")

try:
    from hermes_e2b import __version__, register
except ImportError as _error:
    __version__ = WHEEL_VERSION
    _REASON = str(_error)

    def _install_hint() -> str:
        # Not `pip install hermes-e2b`: the name is not on PyPI yet, so anyone could claim it.
        return INSTALL_COMMAND.format(python=sys.executable)

    def register(ctx):
        logging.getLogger("hermes_e2b").warning(
            "hermes-e2b: the wheel is not installed in the interpreter that runs Hermes (%s: %s); run: %s",
            sys.executable,
            _REASON,
            _install_hint(),
        )
        registrar = getattr(ctx, "register_terminal_environment_provider", None)
        try:
            from agent.terminal_env_provider import TerminalEnvironmentProvider
        except ImportError:
            return
        if registrar is None:
            return

        class MissingWheelProvider(TerminalEnvironmentProvider):
            """Fails closed: Hermes refuses the backend, nothing runs on the host."""

            name = "e2b"
            display_name = "E2B"

            def is_available(self):
                return False

            def check_requirements(self, config=None):
                logging.getLogger("hermes_e2b").error("hermes-e2b: the wheel is missing; run: %s", _install_hint())
                return False

            def probe(self):
                return "unavailable", f"hermes-e2b is not installed; run: {_install_hint()}"

            def doctor_checks(self):
                return [(False, "E2B plugin", f"the hermes-e2b wheel is not installed in the interpreter "
                                              f"that runs Hermes ({sys.executable}); run: {_install_hint()}")]

            def create_environment(self, **kwargs):
                raise ImportError(f"hermes-e2b is not installed in {sys.executable}; run: {_install_hint()}")

        registrar(MissingWheelProvider())

__all__ = ["register", "__version__", "WHEEL_VERSION", "INSTALL_COMMAND"]
