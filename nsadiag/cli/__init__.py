"""nsadiag's command line: ``nsadiag`` (the ``main`` console entry point) and
``python -m nsadiag.cli``.

    app.py      the typer app: parse, call one library function per command, print
    options.py  every option declared once; the trial options object that builds a TrialSpec
    render.py   tables, progress and the redacted terminal streams

The command line parses and prints; everything else is the library's.
"""

from nsadiag.cli.app import app, main, run

__all__ = ["app", "main", "run"]
