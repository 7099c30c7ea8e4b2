"""What several test modules share: the checkout's paths, the command line run as a user
runs it, run-directory records and triage states written by hand, and the tensors the
attention ops are compared on. Process helpers live in tests/procs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from nsa.config import NSAConfig
from nsadiag.checks import CheckResult
from nsadiag.evidence import Evidence
from nsadiag.recordspec import RecordSpec
from nsadiag.rundir import TrialRecord
from nsadiag.runmeta import RunMeta
from nsadiag.spec import TrialSpec
from nsadiag.triage.state import TriageState
from nsadiag.verdict.names import Verdict

# ---- paths ---------------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
VERDICT_FIXTURES = FIXTURES / "verdict"
"""Evidence written by hand in the runner's formats, one case of a verdict rule each."""
STACK_FIXTURES = FIXTURES / "stacks"
"""Children that wait, spin or compute on purpose, and py-spy dumps captured from them."""
REPRO = REPO / "repro"
SCRIPTS = REPRO / "scripts"
"""The plain-script zoo: training scripts with one defect each, run as their authors do."""


# ---- the command line ----------------------------------------------------------------------


def nsadiag(*args: str, cwd: Path | str | None = REPO, env: dict[str, str] | None = None,
            timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess:
    """``python -m nsadiag.cli ARGS`` run to its end from ``cwd`` (the checkout, where the
    targets ``repro.*`` and ``tests.*`` import from), stdout and stderr captured as text;
    ``env`` replaces the environment when given. ``timeout`` only stops a hung command
    (subprocess.TimeoutExpired): no test asserts how long a command takes."""
    return subprocess.run([sys.executable, "-m", "nsadiag.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env, **kwargs)


def checkout_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH (so a command run from
    another directory gets this checkout's packages), plus ``extra``."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def read_jsonl(path: Path) -> list[dict]:
    """The records of a finished JSON-lines file (events.jsonl, a worker's output), blank
    lines skipped."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- run directories and triage states written by hand --------------------------------------


def block_enters(run: Path) -> int:
    """The blocks entered that a ``nsadiag run`` directory's module events stand for: they
    are aggregated, one event standing for its ``edges`` enters."""
    return sum(event.get("edges", 1) for path in run.glob("proc-*/events.jsonl")
               for event in read_jsonl(path) if event["kind"] == "module")


def plain_spec(n_layers: int, **changes: Any) -> dict[str, Any]:
    """The spec fields of a trial of the built-in target as a plain dict: 64 tokens, one
    sequence, 2 steps on the CPU in fp32, a 5 s stall timeout and a 60 s budget;
    ``changes`` replace fields."""
    base = dict(target="nsa", n_layers=n_layers, seq_len=64, batch=1, dtype="float32",
                device="cpu", steps=2, seed=0, stall_timeout_s=5.0, budget_s=60.0,
                grad_ckpt=False, branches=None, backend=None, memory_cap_bytes=None,
                overrides={})
    return {**base, **changes}


def evidence_of(spec: dict[str, Any] | RecordSpec, stored: dict[str, Any]) -> Evidence:
    """The Evidence whose JSON form is ``stored`` (keys missing read as their defaults), of
    a process that exited with code 0 unless ``stored`` names its outcome."""
    if isinstance(spec, RecordSpec):
        spec = spec.to_dict()
    return Evidence.from_dict({"outcome": {"exit_code": 0}, **stored, "spec": spec})


def trial_record(spec: dict[str, Any], result: dict[str, Any] | None, verdict: str = "OK",
                 trial_dir: str = "trial-0", *, events: list[dict] | None = None,
                 reasons: list[str] | None = None, facts: dict[str, Any] | None = None,
                 wall_s: float = 1.0) -> TrialRecord:
    """A trials.jsonl record as a finished trial leaves it: ``result`` (the child's
    result.json; None when it wrote none) and ``events`` as its evidence, the verdict
    ``verdict`` with ``reasons`` (default "VERDICT because") and ``facts``."""
    evidence = evidence_of(spec, {"events": events or [], "result": result})
    return TrialRecord(spec, evidence, Verdict(verdict, reasons or [f"{verdict} because"],
                                               facts or {}), trial_dir, wall_s)


def sweep_report(run_dir: Path, records: list[TrialRecord], meta: RunMeta
                 ) -> tuple[str, dict[str, Any]]:
    """report.md's text and summary.json of a layer sweep of ``records``, its finding
    decided as the sweep command decides it when it ends (against this machine's
    memory)."""
    import psutil

    from nsadiag.finding.sweep import decide_sweep, measure_sweep
    from nsadiag.report.sweep import build_report

    measured = measure_sweep(meta.command_name or "sweep-layers", records, meta,
                             psutil.virtual_memory().total)
    return build_report(run_dir, measured, meta, decide_sweep(measured))


def one_step_record(n_layers: int = 1, trial_dir: str = "trial-0") -> TrialRecord:
    """An OK record of a one-step trial of the built-in target at ``n_layers`` layers
    (its spec as TrialSpec writes it, a step of 1 s)."""
    spec = json.loads(TrialSpec(n_layers=n_layers, out_dir=trial_dir).to_json())
    return trial_record(spec, {"step_s": [1.0], "steps_done": 1}, "OK", trial_dir,
                        reasons=["fine"])


TRIAGE_SPEC = TrialSpec(target="repro.late_bound_ckpt:make", seq_len=16, batch=1,
                        device="cpu", stall_timeout_s=60.0, seed=0, backend=None,
                        overrides={"dim": 8}).to_dict()
"""The base spec of the triage states below, as triage.json stores it."""


def triage_state(**changes: Any) -> TriageState:
    """A triage of the late-bound-checkpoint zoo entry that ran its environment, check and
    sweep stages and found every depth up to 1 OK; ``changes`` replace top-level fields."""
    state = {"target": TRIAGE_SPEC["target"], "argv": ["nsadiag", "triage"], "max_layers": 2,
             "max_minutes": 10, "trial_budget_s": 40.0, "user_budget_s": 600.0,
             "stages_done": ["env", "checks", "sweep"], "stopped": None,
             "base_spec": TRIAGE_SPEC, "world_size": 1, "elapsed_s": 50.0,
             "env": {}, "env_problems": [],
             "sweep": {"probed": [{"trial": "trial-0", "verdict": "OK", "n_layers": 1,
                                   "reason": "ok"}],
                       "threshold": None, "deepest_ok": 1, "failing": None, "complete": True}}
    state.update(changes)
    return TriageState.from_dict(state)


def check_result(name: str, verdict: str, module: str | None = None,
                 summary: str = "fine") -> dict[str, Any]:
    """A correctness check's result as a triage state stores it (CheckResult.to_dict() and
    whether it finished): passed when the verdict is OK, ``summary`` as its one reason."""
    result = CheckResult(name, verdict == "OK", Verdict(verdict, [summary]), module, summary)
    return {**result.to_dict(), "finished": verdict in ("OK", "WRONG")}


# ---- attention ops against the oracle -------------------------------------------------------

HEAD_DIM = 8
TOL = 1e-5


def tiny_config(**changes: Any) -> NSAConfig:
    """Small shapes that exercise every rule: l=8, d=4, l_sel=16, w=12."""
    base = NSAConfig(dim=32, n_heads=4, n_kv_heads=2, head_dim=8, l=8, d=4, l_sel=16,
                     n_sel=3, w=12, query_chunk=16, compress_hidden=16, n_layers=2,
                     vocab_size=64)
    return base.replace(**changes)


def attention_inputs(batch: int, seq: int, n_q_heads: int, n_kv_heads: int,
                     n_keys: int | None = None, head_dim: int = HEAD_DIM,
                     seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Leaf q [B, S, Hq, D], k and v [B, n_keys (default S), Hkv, D] requiring grad, and a
    random upstream gradient for o [B, S, Hq, D], fp32 on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    n_keys = seq if n_keys is None else n_keys
    q = torch.randn(batch, seq, n_q_heads, head_dim, generator=gen).requires_grad_()
    k = torch.randn(batch, n_keys, n_kv_heads, head_dim, generator=gen).requires_grad_()
    v = torch.randn(batch, n_keys, n_kv_heads, head_dim, generator=gen).requires_grad_()
    grad_o = torch.randn(batch, seq, n_q_heads, head_dim, generator=gen)
    return q, k, v, grad_o


def grads_of(out: torch.Tensor, grad_out: torch.Tensor, *leaves: torch.Tensor
          ) -> list[torch.Tensor]:
    """d(out . grad_out)/d(leaf) for each leaf, the graph left for further calls."""
    return list(torch.autograd.grad(out, leaves, grad_out))


def assert_close(got: list[torch.Tensor], want: list[torch.Tensor], tol: float = TOL) -> None:
    """Same shapes, finite, and at most ``tol`` apart elementwise (absolute), pair by pair."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, (i, g.shape, w.shape)
        assert torch.isfinite(g).all(), i
        err = (g.float() - w.float()).abs().max().item() if g.numel() else 0.0
        assert err <= tol, f"tensor {i}: max abs error {err:.3e}"


def random_indices(batch: int, seq: int, n_kv_heads: int, n_sel: int, n_blocks: int,
                   seed: int = 1) -> torch.Tensor:
    """[B, S, Hkv, n_sel] selected block indices: unique blocks per row, including future
    ones, with -1 padding and all -1 rows."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(batch, seq, n_kv_heads, n_blocks, generator=gen)
    idx = scores.argsort(dim=-1)[..., :n_sel]
    pad = torch.rand(idx.shape, generator=gen) < 0.3
    idx = idx.masked_fill(pad, -1)
    idx[:, ::7] = -1  # rows with nothing selected
    rows = idx[:, 1::7]  # a block every query of these rows can at least partly see
    rows[rows == 0] = -1
    rows[..., 0] = 0
    return idx


def with_repeats(idx: torch.Tensor, seed: int = 3) -> torch.Tensor:
    """idx with some entries of each row overwritten by a copy of another entry."""
    gen = torch.Generator().manual_seed(seed)
    out = idx.clone()
    n_sel = idx.shape[-1]
    src = torch.randint(0, n_sel, idx.shape, generator=gen)
    copy = torch.rand(idx.shape, generator=gen) < 0.4
    return torch.where(copy, idx.gather(-1, src), out)


def has_repeats(idx: torch.Tensor) -> torch.Tensor:
    """[..., n] -> [...] bool: some valid block appears twice in the row."""
    same = (idx.unsqueeze(-1) == idx.unsqueeze(-2)) & (idx >= 0).unsqueeze(-1)
    return same.sum((-1, -2)) > (idx >= 0).sum(-1)
