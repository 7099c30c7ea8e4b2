"""The check child: `python -m nsadiag.checks.child NAME [WORLD_SIZE] SPEC_JSON`.

Like the trial child (nsadiag.trial, whose pieces it reuses): faulthandler armed before
torch is imported, heartbeat events in <out_dir>/events.jsonl (the check's own forwards and
backwards run under the heartbeat hooks, so the parent sees progress), the memory cap, the
seed, and <out_dir>/result.json at the end (status "ok" when the check ran to a finding,
"error" with the exception otherwise). The finding itself goes to <out_dir>/check.json.
WORLD_SIZE (default 2) is the number of ranks of the ddp check; the others ignore it.
Exit 0 when the check ran (passed or not), 1 on an exception, 2 on bad arguments.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from nsadiag.heartbeat import HeartbeatWriter
from nsadiag.spec import TrialSpec
from nsadiag.trial import Progress, _make_dir, _result, arm_faulthandler, describe, write_result

CHECKS = ("causality", "parity", "ckpt", "ddp")  # nsadiag.checks.CHECK_NAMES, without the import


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or args[0] not in CHECKS or (
            len(args) == 3 and not args[1].isdigit()):
        print(f"nsadiag.checks.child: usage: python -m nsadiag.checks.child "
              f"{{{','.join(CHECKS)}}} [WORLD_SIZE] SPEC_JSON", file=sys.stderr)
        return 2
    world_size = int(args[1]) if len(args) == 3 else 2
    try:
        spec = TrialSpec.from_json(args[-1])
        out_dir = _make_dir(spec.out_dir)
    except ValueError as exc:
        print(f"nsadiag.checks.child: {exc}", file=sys.stderr)
        return 2
    arm_faulthandler(out_dir / "faulthandler.txt")
    result = run(args[0], spec, out_dir, world_size)
    write_result(out_dir / "result.json", result)
    return 0 if result["status"] == "ok" else 1


def run(name: str, spec: TrialSpec, out_dir: Path, world_size: int = 2) -> dict:
    writer = HeartbeatWriter(out_dir / "events.jsonl")
    writer.start("build")
    error = None
    try:
        from nsadiag.trial import cap_memory, seed_everything

        cap_memory(spec.memory_cap_bytes)
        seed_everything(spec.seed)
        check = importlib.import_module(f"nsadiag.checks.{name}")
        found = (check.measure(spec, writer, world_size) if name == "ddp" else
                 check.measure(spec, writer))
        (out_dir / "check.json").write_text(json.dumps(found.to_dict(), indent=1))
    except Exception as exc:  # recorded for the parent, which turns it into the verdict
        error = describe(exc)
    status = "ok" if error is None else "error"
    writer.end(status)
    writer.close()
    return _result(status, Progress(), error)


if __name__ == "__main__":
    sys.exit(main())
