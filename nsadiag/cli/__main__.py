"""``python -m nsadiag.cli``."""

from nsadiag.cli import main

main()
