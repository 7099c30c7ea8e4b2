"""nsadiag command line: parses options, calls the library, prints. Nothing else."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from nsadiag.envinfo import collect_env

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Tell slow from stuck and wrong from fast in NSA training runs.")
console = Console()


@app.callback()
def _root() -> None:
    """nsadiag: diagnostics for NSA training runs."""


@app.command()
def env(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")):
    """Versions, devices, profilers and permissions of this machine."""
    report = collect_env()
    if as_json:
        print(json.dumps(report.as_dict(), indent=1))
        return
    table = Table(show_header=False, box=None)
    for key, value in report.as_dict().items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = "; ".join(value) or "-"
        table.add_row(key, str(value))
    console.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
