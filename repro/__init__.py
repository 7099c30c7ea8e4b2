"""The fault zoo: small targets with exactly one defect each, and the verdict each should get.

Every module exposes `make(...)`, a factory for `nsadiag --target repro.<name>:make`. Its
docstring states the expected verdict; tests/zoo/test_zoo.py diagnoses each and asserts it.
"""

# entry -> (expected verdict, TrialSpec settings that show it quickly on a CPU)
ZOO = {
    "per_token_loop": ("SLOW", dict(n_layers=2, seq_len=1024, steps=30, budget_s=10.0,
                                    stall_timeout_s=30.0)),
    # one block's forward and backward at S=8192 each outlast the 2 s stall timeout
    "long_token_loop": ("SLOW", dict(n_layers=1, seq_len=8192, batch=1, steps=50,
                                     budget_s=30.0, stall_timeout_s=2.0)),
    # one forward at S=262144 is as many per-token iterations, well over a minute on a fast
    # quiet machine (0.6 ms each here at S=2048, more at this length): none finishes in the
    # budget on any machine, and the budget leaves a loaded machine the time to start the
    # trial (on 2 CPUs with 3 burners, the dense reference at S=4096 took 18 s of it)
    "sequential_prefill": ("SLOW", dict(n_layers=1, seq_len=262144, batch=1, steps=2,
                                        budget_s=45.0, stall_timeout_s=10.0)),
    "lock_deadlock": ("DEADLOCK", dict(seq_len=64, stall_timeout_s=3.0)),
    "native_stall": ("STALL-BUSY", dict(seq_len=64, stall_timeout_s=3.0)),
    "python_spin": ("STALL-BUSY", dict(seq_len=64, stall_timeout_s=3.0)),
    "backward_error": ("ERROR", dict(seq_len=64)),
    "hard_crash": ("CRASH", dict(seq_len=64)),
    "dense_masks": ("OOM", dict(seq_len=4096, memory_cap_bytes=5 * 2**30 // 4)),
    # "check": diagnosed by that nsadiag check (nsadiag.checks.run_check), not by a trial
    "late_bound_ckpt": ("WRONG", dict(seq_len=16, stall_timeout_s=30.0, check="ckpt")),
}

# entry -> (expected verdict, world size, TrialSpec settings) for `nsadiag ddp` on gloo/CPU
DDP_ZOO = {
    "rank_divergent": ("STALL-COLLECTIVE", 2, dict(seq_len=64, batch=2, steps=3,
                                                   stall_timeout_s=3.0)),
    "late_bound_ckpt": ("ERROR", 2, dict(seq_len=64, batch=2, grad_ckpt=True,
                                         overrides={"reentrant": True})),
}
