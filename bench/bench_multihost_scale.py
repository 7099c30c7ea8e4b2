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
operations per host (median and most), and the bytes each host published and read.
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
    views = [SharedView(JobShape(address, count), f"sim{i}", HostLink(address, f"sim{i}",
                                                                        timeout_s=60))
             for i in range(count)]
    ranks = [_ranks(template, f"sim{i}", i, per_host) for i in range(count)]
    joined = threading.Barrier(count + 1)
    done: dict[int, float] = {}
    sizes: dict[int, int] = {}

    def host(i: int) -> None:
        view = views[i]
        view.tick(lambda: [_live(r) for r in ranks[i]])
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
    ops = [v.link.ops for v in views if v.link is not None]
    published = len(json.dumps(views[0].states["sim0"].to_dict()))
    return {"hosts": count, "ranks": count * per_host,
            "exchange_s": max(done.values()) - said, "decide_s": decided,
            "ops_median": statistics.median(ops), "ops_max": max(ops),
            "published_bytes": published, "read_bytes_per_host": statistics.median(
                sizes.values()), "verdict": verdict.name, "lost": len(view.lost)}


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
    template = [r for r in record["evidence"]["ranks"] if r.get("stall")]
    job = Evidence.from_dict({**record["evidence"], "spec": record["spec"]})
    print("| hosts | ranks | stall said -> every host read every capture (s) | merged "
          "verdict decided (s) | store ops per host (median / most) | published per host "
          "(kB) | read per host (MB) | verdict |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    rows = []
    for n in args.hosts:  # each row as soon as it is measured: the largest N may not end
        row = simulate(n, template, job, args.ranks_per_host)
        rows.append(row)
        print(f"| {row['hosts']} | {row['ranks']} | {row['exchange_s']:.2f} | "
              f"{row['decide_s']:.2f} | {row['ops_median']:.0f} / {row['ops_max']} | "
              f"{row['published_bytes'] / 1e3:.0f} | {row['read_bytes_per_host'] / 1e6:.1f} | "
              f"{row['verdict']} |", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
