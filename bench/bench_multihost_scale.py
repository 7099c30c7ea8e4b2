"""What the shared view costs as hosts grow: N simulated hosts against one TCPStore.

    python bench/bench_multihost_scale.py --hosts 1024 --ranks-per-host 8 --json OUT
    python bench/bench_multihost_scale.py --hosts 8 64 256 1024 --ranks-per-host 8 --json OUT

No prior record is needed: the bench builds a job of that shape, every rank waiting in the
job's all_reduce #STEPS+1 from the same line, except one culprit (a rank in the middle of
the job, on a host in the middle) that never issued it and polls in a sleep loop at
CULPRIT_LINE, with its stack samples. Each simulated host is a thread with its own store
client and its own nsadiag.hosts.shared.SharedView; the hosts run in a few worker
processes (``--processes``), the store in this one. What runs is the real code: the
digests, the looks for the stall signal, the decider's reads and finding, the groups at
the stall, the captures asked for, the merged evidence, and the decider's verdict
(nsadiag.hosts.merged.decide_hosts) over it.

First the job progresses: each host publishes LIVE_TICKS times on a clock of its own (one
publication every HOSTS_PUBLISH_EVERY_S of it), calling ``stall_elsewhere`` every watch
poll (WATCH_POLL_S) of it in between, as the watch does; the store operations per host per
second of that phase are counted. Then the first host of the deciding order (``sim0``)
says a stall; every host sees it at its next look, exchanges (capture window 0: the
sampling itself is not simulated) and reads the merged evidence; the decider decides.
``--lose-decider``: the decider says the stall and then vanishes; the next host decides.

Writes one JSON object per N (a list with several --hosts): hosts, ranks, verdict,
culprit_named (the culprit's rank, host and line all in the merged verdict),
stall_to_verdict_s (the stall signal to the decider's verdict: the merged evidence
gathered, then decided; decide_s of it, timed again once the simulated hosts are done, since
on this machine the other hosts' threads parse the merged evidence on the same cores at
that moment, where real hosts each have their own: that figure is
decide_beside_the_simulated_hosts_s), stall_to_every_host_s (to the last host having
read the merged evidence; every host then decides the same over it), phases_s (the
median and last host at each step of the exchange), read_bytes_per_host_median (from the
stall on), read_bytes_decider, live_store_ops_per_host_per_s (median), live_digest_bytes
(one host's publication), peak_rss_mb (every process's peak, summed), the load before
and after.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pickle
import resource
import statistics
import threading
import time
from pathlib import Path
from typing import Any

STEPS = 12
WAITING_LINE = 57
CULPRIT_LINE = 88
TORCH = "/usr/lib/python3.11/site-packages/torch"
LIVE_TICKS = 10
"""Publications per host in the live phase (20 s of the job at one every 2 s)."""


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _rank(r: int, host: str, node: int, local: int, world: int, culprit: int):
    """Rank ``r``: STEPS finished steps, then waiting in all_reduce #STEPS+1 (the culprit:
    polling in forward, never issued it), with two stack samples."""
    from nsadiag.evidence import StackFrame, StackSample, StallEvidence, ThreadStack
    from nsadiag.harness.collectives import summarize
    from nsadiag.probes import frames
    from nsadiag.verdict.ranks import RankEvidence

    t0, events = 1000.0, [{"t": 999.0, "kind": "start"}]
    for k in range(STEPS):
        begin = t0 + k * 0.1
        events += [{"t": begin + 0.05, "kind": "collective", "edge": "start", "n": k + 1,
                    "op": "all_reduce", "origin": "ddp", "phase": "backward", "step": k,
                    "detail": "DDP bucket 0, 4 tensors", "shapes": [[100]]},
                   {"t": begin + 0.08, "kind": "collective", "edge": "end", "n": k + 1,
                    "op": "all_reduce", "status": "ok", "step": k},
                   {"t": begin + 0.1, "kind": "step", "step": k, "step_s": 0.1,
                    "forward_s": 0.03, "backward_s": 0.07}]
    last = t0 + STEPS * 0.1
    stuck = r == culprit
    events.append({"t": last, "kind": "module", "module": "blocks.0",
                   "phase": "forward" if stuck else "backward", "step": STEPS,
                   "edge": "enter"})
    if not stuck:
        events.append({"t": last + 0.01, "kind": "collective", "edge": "start",
                       "n": STEPS + 1, "op": "all_reduce", "origin": "ddp",
                       "phase": "backward", "step": STEPS,
                       "detail": "DDP bucket 0, 4 tensors", "shapes": [[100]]})
    if stuck:
        frame = [StackFrame("sleep", "<built-in>", 0, is_native=True),
                 StackFrame("wait_for_marker", "/job/train.py", CULPRIT_LINE,
                            code="time.sleep(0.5)"),
                 StackFrame("main", "/job/train.py", 120, code="batch = wait_for_marker()")]
    else:
        frame = [StackFrame("wait", f"{TORCH}/distributed/distributed_c10d.py", 300),
                 StackFrame("backward", f"{TORCH}/_tensor.py", 500),
                 StackFrame("main", "/job/train.py", WAITING_LINE,
                            code="loss.backward()")]
    samples = [StackSample(last + 30 + i, 10_000 + r,
                           [ThreadStack(1, "MainThread", list(frame), active=False)])
               for i in range(2)]
    stall = StallEvidence(since_last_event_s=30.0, window_s=10.0, cpu_delta_s=0.01,
                          samples=samples, stacks_class=frames.classify(samples))
    started = [e for e in events if e.get("edge") == "start"]
    return RankEvidence(rank=r, pid=10_000 + r, events=events, event_counts={},
                        result=None, started=started, collectives=summarize(
                            [e for e in events if e.get("kind") == "collective"]),
                        stall=stall, state=frames.classify(samples),
                        signature=frames.stack_signature(samples[-1]),
                        names={"host": host, "rank": r, "local_rank": local,
                               "node_rank": node, "world_size": world})


def _job(hosts: int, per_host: int):
    from nsadiag.evidence import Evidence, ProcessOutcome

    outcome = ProcessOutcome(exit_code=None, signal=9, killed_by_runner=True,
                             kill_reason="stall", wall_s=60.0, ended_at=1100.0)
    return Evidence(spec={"command": ["torchrun", f"--nnodes={hosts}", "train.py"],
                          "stall_timeout_s": 30.0, "deadline_s": 600.0,
                          "subject": "the command"},
                    events=[], event_counts={}, result=None, outcome=outcome, stall=None,
                    expected_events_per_step=None, total_steps=0, stall_timeout_s=30.0)


class HostClock:
    """A host's clock: time.time() plus what the live phase advanced (the same for every
    host once the live phase is over)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


def _worker(port: int, indices: list[int], hosts: int, per_host: int, culprit: int,
            lose_decider: bool, ready: Any, go: Any, out: Any) -> None:
    """Run the hosts ``indices`` as threads; put one result per host on ``out``."""
    from nsadiag.hosts.address import JobShape, StoreAddress
    from nsadiag.hosts.link import HostLink
    from nsadiag.hosts.merged import decide_hosts
    from nsadiag.hosts.shared import SharedView
    from nsadiag.spec import WATCH_POLL_S
    from nsadiag.verdict.thresholds import HOSTS_PUBLISH_EVERY_S

    address = StoreAddress("127.0.0.1", port, "the bench's store")
    looks = round(HOSTS_PUBLISH_EVERY_S / WATCH_POLL_S)
    live_done = threading.Barrier(len(indices) + 1)
    results: list[dict] = []

    def host(i: int) -> None:
        name = f"sim{i}"
        clock = HostClock()
        view = SharedView(JobShape(address, hosts), name, HostLink(address, name, timeout_s=120),
                          clock=clock, store_here=i == 0)
        ranks = [_rank(i * per_host + k, name, i, k, hosts * per_host, culprit)
                 for k in range(per_host)]
        view.tick(lambda: ranks)
        assert view.link is not None
        before, live_started = view.link.ops, clock()
        for _ in range(LIVE_TICKS):  # the job progresses
            for _ in range(looks):
                clock.ahead += WATCH_POLL_S
                view.stall_elsewhere()
            view.tick(lambda: ranks)
        live_ops = (view.link.ops - before) / (clock() - live_started)
        digest = json.dumps(view.link.digests([name])[name], separators=(",", ":"))
        clock.ahead = LIVE_TICKS * HOSTS_PUBLISH_EVERY_S + HOSTS_PUBLISH_EVERY_S
        live_done.wait()
        go.wait()
        said = None
        if i == 0:
            view.say_stall()
            said = time.time()
        at_stall, read_before = view.link.ops, view.link.read_bytes
        if i == 0 and lose_decider:
            results.append({"host": name, "said": said, "vanished": True})
            return
        while not view.stall_elsewhere():
            time.sleep(WATCH_POLL_S)
        seen_at = time.time()
        view.exchange(ranks, 0.0)
        read_at = time.time()
        row: dict[str, Any] = {"host": name, "said": said, "read_at": read_at,
                               "stall_ops": view.link.ops - at_stall,
                               "read_bytes": view.link.read_bytes - read_before,
                               "live_ops_per_s": live_ops, "digest_bytes": len(digest),
                               "decider": view.decider == name, "gone": view.gone,
                               "seen_at": seen_at,
                               "marks": {k: v - clock.ahead for k, v in view.marks.items()}}
        if view.decider == name:
            seen = view.view()
            began = time.perf_counter()
            verdict = decide_hosts(_job(hosts, per_host), ranks + view.remote_ranks(), seen)
            # its verdict as soon as it gathered: the exchange then waits (HOSTS_CAPTURE_
            # MARGIN_S at most) for every host to read the merged evidence
            row.update(gathered_at=view.marks["gathered"] - clock.ahead,
                       decide_contended_s=time.perf_counter() - began,
                       verdict=verdict.to_dict(), replaced=seen.replaced, lost=seen.lost,
                       inputs=pickle.dumps((ranks + view.remote_ranks(), seen)))
        results.append(row)

    threads = [threading.Thread(target=host, args=(i,)) for i in indices]
    for thread in threads:
        thread.start()
    live_done.wait()
    ready.put(len(indices))
    for thread in threads:
        thread.join()
    out.put({"rows": results, "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})


def _culprit_named(verdict: dict, culprit: int, host: str) -> bool:
    culprits = (verdict.get("facts") or {}).get("culprit_ranks") or []
    text = " ".join(verdict.get("reasons") or [])
    return [(c.get("rank"), c.get("host")) for c in culprits] == [(culprit, host)] and \
        f"train.py:{CULPRIT_LINE}" in text


def _phases(rows: list[dict], said: float) -> dict[str, dict[str, float]]:
    """From the stall signal to each step of the exchange: the median and the last host."""
    steps: dict[str, list[float]] = {"seen": [r["seen_at"] - said for r in rows]}
    for row in rows:
        for step, t in row["marks"].items():
            steps.setdefault(step, []).append(t - said)
    return {step: {"median": round(statistics.median(ts), 3), "last": round(max(ts), 3)}
            for step, ts in steps.items()}


def simulate(hosts: int, per_host: int, processes: int, lose_decider: bool = False) -> dict:
    from torch.distributed import TCPStore

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * hosts + 256)), hard))
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    culprit_host = hosts // 2
    culprit = culprit_host * per_host + per_host // 2
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    chunks = [list(range(hosts))[k::processes] for k in range(min(processes, hosts))]
    load_before = _load()
    workers = [ctx.Process(target=_worker, args=(server.port, chunk, hosts, per_host, culprit,
                                                 lose_decider, ready, go, out))
               for chunk in chunks]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=1800)
    go.set()
    found = [out.get(timeout=1800) for _ in workers]
    for worker in workers:
        worker.join()
    rows = [row for part in found for row in part["rows"]]
    decide_alone = None
    for row in rows:  # the decider's decision again, with no simulated host beside it
        if row.get("inputs"):
            from nsadiag.hosts.merged import decide_hosts

            ranks, view = pickle.loads(row.pop("inputs"))
            began = time.perf_counter()
            decide_hosts(_job(hosts, per_host), ranks, view)
            decide_alone = time.perf_counter() - began
    said = next(row["said"] for row in rows if row.get("said"))
    decider = next((row for row in rows if row.get("decider")), None)
    alive = [row for row in rows if not row.get("vanished")]
    verdict = decider["verdict"] if decider else {}
    name = f"sim{culprit_host}"
    return {"hosts": hosts, "ranks": hosts * per_host, "processes": len(workers),
            "verdict": verdict.get("name"), "first_reason": (verdict.get("reasons") or [""])[0],
            "culprit": {"rank": culprit, "host": name, "line": f"train.py:{CULPRIT_LINE}"},
            "culprit_named": _culprit_named(verdict, culprit, name),
            "decider": decider["host"] if decider else None,
            "replaced": decider.get("replaced") if decider else None,
            "stall_to_verdict_s": round(decider["gathered_at"] - said + decide_alone, 3)
            if decider and decide_alone is not None else None,
            "decide_s": round(decide_alone, 3) if decide_alone is not None else None,
            "decide_beside_the_simulated_hosts_s": round(decider["decide_contended_s"], 3)
            if decider else None,
            "stall_to_every_host_s": round(max(r["read_at"] for r in alive) - said, 3),
            "read_bytes_per_host_median": statistics.median(r["read_bytes"] for r in alive),
            "read_bytes_per_host_max": max(r["read_bytes"] for r in alive),
            "read_bytes_decider": decider["read_bytes"] if decider else None,
            "stall_store_ops_per_host_median": statistics.median(r["stall_ops"]
                                                                 for r in alive),
            "live_store_ops_per_host_per_s": round(statistics.median(
                r["live_ops_per_s"] for r in alive), 3),
            "live_digest_bytes": statistics.median(r["digest_bytes"] for r in alive),
            "hosts_that_lost_the_store": sum(1 for r in alive if r.get("gone")),
            "phases_s": _phases(alive, said),
            "peak_rss_mb": round(sum(p["peak_rss_kb"] for p in found) / 1024 +
                                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "load_before": load_before, "load_after": _load(), "cpus": mp.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--ranks-per-host", type=int, default=8)
    parser.add_argument("--processes", type=int, default=8,
                        help="worker processes the simulated hosts are spread over")
    parser.add_argument("--lose-decider", action="store_true",
                        help="the decider says the stall, then vanishes")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    found = []
    for count in args.hosts:
        row = simulate(count, args.ranks_per_host, args.processes, args.lose_decider)
        print(json.dumps(row), flush=True)
        found.append(row)
    if args.json is not None:
        args.json.write_text(json.dumps(found[0] if len(found) == 1 else found, indent=1) + "\n")


if __name__ == "__main__":
    main()
