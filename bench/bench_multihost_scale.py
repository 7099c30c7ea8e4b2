"""What the shared view costs as hosts grow: N simulated hosts against one TCPStore.

    python bench/bench_multihost_scale.py --record RUN/record.json [--hosts 8 64 256]

Each simulated host is a thread of this process with its own store client and its own
nsadiag.hosts.shared.SharedView, publishing the ranks of a real two-host run's record
(``--record``: one host's record.json of ``nsadiag run``; its ranks are relabelled per
host) as the watch does: a live publication, a look for the shared stall signal every
watch poll (WATCH_POLL_S), then, once host 0 says a stall, its capture exchanged
(nsadiag.hosts.shared.SharedView.exchange, capture window 0: the sampling itself is not
simulated). Then host 0 decides the merged verdict over every host's ranks
(nsadiag.hosts.merged.decide_hosts). Prints, per N: the time from the stall signal to the
last host having read every capture, the time to decide the merged verdict, the store
operations per host from the stall on (median and most), and the bytes each host
published and read.

Before the stall every host runs LIVE_TICKS publications on a clock of its own that
advances HOSTS_PUBLISH_EVERY_S per publication, with a look for the stall signal every
WATCH_POLL_S of it, as the watch does while the job progresses: the store operations per
host per second of that phase, the bytes of one live publication and, of those, the bytes
of the straggler data (each rank's latest step paces and hot frame). The record may be of
a stuck run (its captured ranks are published) or of one that ended well (its ranks as
they ended; a straggler's paces in them if it had one). The load average is read before
and after each N.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import threading
import time
from pathlib import Path

from nsadiag.evidence import Evidence
from nsadiag.hosts.address import JobShape, StoreAddress
from nsadiag.hosts.link import HostLink
from nsadiag.hosts.merged import decide_hosts
from nsadiag.hosts.shared import SharedView
from nsadiag.spec import WATCH_POLL_S
from nsadiag.verdict.ranks import RankEvidence
from nsadiag.verdict.thresholds import HOSTS_PUBLISH_EVERY_S

LIVE_TICKS = 10
"""Publications per host in the live phase (20 s of the job at one every 2 s): two reads
of the others' states at the steady pace (every fifth), more while not every host has
been seen."""


class HostClock:
    """A host's clock for the live phase: time.time() plus what the phase advanced."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


def _payload(data: dict) -> int:
    """Bytes of ``data`` as the link sends it (nsadiag.hosts.link.HostLink.publish)."""
    return len(json.dumps(data, separators=(",", ":"), default=str))


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _ranks(template: list[dict], host: str, node: int, per_host: int) -> list[RankEvidence]:
    ranks = []
    for local in range(per_host):
        data = copy.deepcopy(template[local % len(template)])
        data["rank"] = node * per_host + local
        data["names"] = {"host": host, "rank": data["rank"], "local_rank": local,
                         "node_rank": node}
        ranks.append(RankEvidence.from_dict(data))
    return ranks


def simulate(count: int, template: list[dict], job: Evidence, per_host: int) -> dict:
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    address = StoreAddress("127.0.0.1", server.port, "a simulated store")
    clocks = [HostClock() for _ in range(count)]
    views = [SharedView(JobShape(address, count), f"sim{i}", HostLink(address, f"sim{i}",
                                                                        timeout_s=60),
                        clock=clocks[i])
             for i in range(count)]
    ranks = [_ranks(template, f"sim{i}", i, per_host) for i in range(count)]
    joined = threading.Barrier(count + 1)
    done: dict[int, float] = {}
    sizes: dict[int, int] = {}

    live_ops: dict[int, int] = {}
    at_stall: dict[int, int] = {}
    live_bytes: dict[int, int] = {}
    straggler_bytes: dict[int, int] = {}
    looks = round(HOSTS_PUBLISH_EVERY_S / WATCH_POLL_S)

    def host(i: int) -> None:
        view = views[i]
        view.tick(lambda: [_live(r) for r in ranks[i]])
        assert view.link is not None
        before = view.link.ops
        for _ in range(LIVE_TICKS):  # the job progresses: publications and stall looks
            for _ in range(looks):
                view.stall_elsewhere()
            clocks[i].ahead += HOSTS_PUBLISH_EVERY_S
            view.tick(lambda: [_live(r) for r in ranks[i]])
        live_ops[i] = view.link.ops - before
        at_stall[i] = view.link.ops
        mine = view.states[f"sim{i}"].to_dict()
        live_bytes[i] = _payload(mine)
        straggler_bytes[i] = _payload({"paces": mine["paces"], "frames": mine["frames"]})
        joined.wait()
        if i == 0:
            view.say_stall()
        while not view.stall_elsewhere():
            time.sleep(WATCH_POLL_S)
        view.exchange(ranks[i], 0.0)
        done[i] = time.perf_counter()
        sizes[i] = sum(len(json.dumps(s.to_dict())) for s in view.states.values())

    threads = [threading.Thread(target=host, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    joined.wait()
    said = time.perf_counter()
    for thread in threads:
        thread.join()
    merged_at = time.perf_counter()
    view = views[0].view()
    every = [r for state in view.states.values() for r in state.ranks]
    verdict = decide_hosts(job, every, view)
    decided = time.perf_counter() - merged_at
    # the operations from the stall on: the signal, its looks, the exchange of captures
    ops = [v.link.ops - at_stall[i] for i, v in enumerate(views) if v.link is not None]
    published = len(json.dumps(views[0].states["sim0"].to_dict()))
    return {"hosts": count, "ranks": count * per_host,
            "exchange_s": max(done.values()) - said, "decide_s": decided,
            "ops_median": statistics.median(ops), "ops_max": max(ops),
            "live_ops_per_s": statistics.median(live_ops.values()) /
            (LIVE_TICKS * HOSTS_PUBLISH_EVERY_S),
            "live_bytes": statistics.median(live_bytes.values()),
            "straggler_bytes": statistics.median(straggler_bytes.values()),
            "published_bytes": published, "read_bytes_per_host": statistics.median(
                sizes.values()), "verdict": verdict.name, "lost": len(view.lost),
            "straggler": (view.straggler or {}).get("label")}


def _live(rank: RankEvidence) -> RankEvidence:
    live = copy.copy(rank)
    live.stall = None
    return live


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--hosts", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    record = json.loads(args.record.read_text())
    ranks = record["evidence"].get("ranks") or []
    # a stuck run's captured ranks; a run that ended well captured none: its ranks as
    # they ended
    template = [r for r in ranks if r.get("stall")] or ranks
    if not template:
        raise SystemExit(f"{args.record}: the record holds no ranks (not a run of a job "
                         f"with ranks)")
    job = Evidence.from_dict({**record["evidence"], "spec": record["spec"]})
    print("| hosts | ranks | stall said -> every host read every capture (s) | merged "
          "verdict decided (s) | store ops per host at the stall (median / most) | published "
          "per host "
          "(kB) | read per host (MB) | verdict | live store ops per host per s | live "
          "publication (kB) | of it, straggler data (kB) | load before -> after |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|", flush=True)
    rows = []
    for n in args.hosts:  # each row as soon as it is measured: the largest N may not end
        load = _load()
        row = simulate(n, template, job, args.ranks_per_host)
        row["load"] = f"{load} -> {_load()}"
        rows.append(row)
        print(f"| {row['hosts']} | {row['ranks']} | {row['exchange_s']:.2f} | "
              f"{row['decide_s']:.2f} | {row['ops_median']:.0f} / {row['ops_max']} | "
              f"{row['published_bytes'] / 1e3:.0f} | {row['read_bytes_per_host'] / 1e6:.1f} | "
              f"{row['verdict']} | {row['live_ops_per_s']:.2f} | "
              f"{row['live_bytes'] / 1e3:.1f} | {row['straggler_bytes'] / 1e3:.2f} | "
              f"{row['load']} |", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
