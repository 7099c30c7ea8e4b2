"""The run directory's files: what in it is nsadiag's (owned), and, moving here from
nsadiag/rundir.py, locking, writing, reading and limits."""
