"""The fault zoo: small targets with exactly one defect each, and the verdict each should get.

Every module exposes `make(...)`, a factory for `nsadiag --target repro.<name>:make`. Its
docstring states the expected verdict; tests/test_zoo.py diagnoses each and asserts it.
"""
