"""nsadiag's command line: ``nsadiag`` (the ``main`` console entry point) and
``python -m nsadiag.cli``.

    app.py      the typer app: parse, call one library function per command, print
    options.py  every option declared once; the trial options object that builds a TrialSpec
    render.py   tables, progress and the redacted terminal streams

The command line parses and prints; everything else is the library's. This package itself
is light: ``main`` takes SIGTERM, SIGINT and SIGHUP before it loads the command line
(typer, rich), so a stop that comes while nsadiag is still starting is one line and the
signal's exit code too (130, 143, 129: nsadiag.harness.stop); ``app`` and ``run`` load it
on first use.
"""

from __future__ import annotations

import os
import signal
import sys
import types
from typing import Any

from nsadiag.harness import stop

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""The signals that stop nsadiag with its diagnosis kept (nsadiag.harness.stop)."""


def main() -> None:
    """The console entry point (`nsadiag`, `python -m nsadiag.cli`)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _while_starting)
    # a signal mask is inherited through exec, and some runners and supervisors start
    # their commands with SIGINT blocked: a handler alone would never run, and Ctrl-C
    # would leave the run going to its end with no diagnosis
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        app = _load()
        if stop.requested():  # an interrupt that an import swallowed
            raise KeyboardInterrupt
        app.main()  # it takes the signals over first thing
    except KeyboardInterrupt:
        _stopped_while_starting()


def _while_starting(signum: int, frame: Any) -> None:
    stop.request(signum)
    raise KeyboardInterrupt


def _stopped_while_starting() -> None:
    """One line and the signal's exit code, at once (nothing was started that needs stopping)."""
    try:
        sys.stderr.write("nsadiag: interrupted while starting; nothing was run\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(stop.exit_code())


def _load() -> Any:
    """nsadiag.cli.app, with this package's ``run`` set to its ``run``."""
    import nsadiag.cli.app  # noqa: F401  (a statement: `python -X importtime` lists it)

    module = sys.modules["nsadiag.cli.app"]
    globals()["run"] = module.run
    return module


def __getattr__(name: str) -> Any:
    if name in ("app", "run"):
        _load()
        return globals()[name]
    raise AttributeError(f"module 'nsadiag.cli' has no attribute {name!r}")


class _Package(types.ModuleType):
    """This package, whose ``app`` is the typer app: importing the submodule nsadiag.cli.app
    (however it is first imported) sets the package's attribute to the module, and here
    to the module's ``app``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "app" and isinstance(value, types.ModuleType):
            value = value.app
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = ["app", "main", "run"]
