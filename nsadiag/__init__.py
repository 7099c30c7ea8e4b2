"""nsadiag: tells slow from stuck and wrong from fast in NSA training runs."""

__version__ = "0.1.0"
