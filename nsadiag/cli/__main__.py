"""``python -m nsadiag.cli``."""

from nsadiag.cli.app import main

main()
