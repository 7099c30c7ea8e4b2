"""Many hosts, one verdict: two hosts on one machine (tests/twohosts.py), a 2 x 2 torchrun
job with c10d rendezvous, one `nsadiag run` per host with equal stall timeouts, one rank
stuck outside any collective (tests/multihost_train.py). Both hosts' reports name the
culprit's host, global rank and line, neither says ERROR or CRASH, and `nsadiag merge` on
the two run directories gives the same verdict. Also: the store's parsing and the names."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from nsadiag.cli import app
from nsadiag.hosts.address import StoreAddress, job_shape
from nsadiag.hosts.link import HostLink, StoreGone
from nsadiag.ranknames import rank_names
from tests.helpers import TESTS, nsadiag
from tests.procs import wait_for
from tests.twohosts import (
    free_port,
    kill_host,
    make_hosts,
    start_host,
    torchrun,
    unshare_refused,
    while_hosts_live,
)

SCRIPT = TESTS / "multihost_train.py"
POLL_LINE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1)
                 if "while not os.path.exists(marker):" in line)
STALL_TIMEOUT = "10"

# ---- parsing at the edge --------------------------------------------------------------------


def test_the_store_is_torchruns_rendezvous_endpoint_else_master_addr():
    shape = job_shape(["torchrun", "--nnodes=1:2", "--rdzv_backend", "c10d",
                       "--rdzv-endpoint", "node0:29500", "train.py", "--rdzv-endpoint", "x:1"],
                      {"MASTER_ADDR": "m", "MASTER_PORT": "1234"})
    assert (shape.store.host, shape.store.port, shape.nnodes) == ("node0", 29500, 2)
    assert "rendezvous" in shape.store.source
    bare = job_shape(["python", "-m", "torch.distributed.run", "--nnodes", "2",
                      "--rdzv-endpoint", "node0", "--rdzv-backend", "c10d", "t.py"], {})
    assert (bare.store.host, bare.store.port) == ("node0", 29400)
    static = job_shape(["python", "train.py"], {"MASTER_ADDR": "m", "MASTER_PORT": "1234"})
    assert (static.store.host, static.store.port, static.nnodes) == ("m", 1234, None)
    assert static.store.source == "the MASTER_ADDR:MASTER_PORT store"
    assert job_shape(["python", "train.py"], {}).store is None


def test_a_rank_is_named_by_torchrun_or_slurm():
    names = rank_names({"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "4"},
                       "host2")
    assert names.label() == "rank 3 on host2 (local rank 1, node 1)"
    slurm = rank_names({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
                        "SLURMD_NODENAME": "gpu-07", "SLURM_JOB_ID": "77"}, "ignored")
    assert (slurm.host, slurm.rank, slurm.local_rank, slurm.node_rank, slurm.slurm_job) == \
        ("gpu-07", 5, 1, 2, "77")


def test_merge_of_fewer_than_two_or_unknown_dirs_is_one_line_exit_2(tmp_path):
    done = CliRunner().invoke(app, ["merge", str(tmp_path)])
    assert done.exit_code == 2
    assert done.stderr.strip() == ("nsadiag: error: merge: give two or more run directories, "
                                   "one per host")
    done = CliRunner().invoke(app, ["merge", str(tmp_path), str(tmp_path / "missing")])
    assert done.exit_code == 2
    line = done.stderr.strip()
    assert line.startswith("nsadiag: error: merge: ") and len(line.splitlines()) == 1
    assert line.endswith(f"{tmp_path.name} holds no record.json (not an nsadiag run "
                         f"directory)")


# ---- two hosts ---------------------------------------------------------------------------------

REFUSED = unshare_refused()
two_hosts = pytest.mark.skipif(REFUSED is not None, reason=str(REFUSED))


@pytest.fixture
def hosts(tmp_path):
    """Two hosts; whatever still runs of them at the end of the test is killed."""
    made = make_hosts(tmp_path)
    yield made
    for host in made:
        if host.proc is not None and host.proc.poll() is None:
            kill_host(host)
            host.proc.communicate(timeout=60)


def _two_host_job(hosts, stuck: int, store_index: int = 0, stall_timeout: str = STALL_TIMEOUT
                  ) -> StoreAddress:
    """Start the job; where its store listens."""
    store = hosts[store_index]
    port = free_port(store.address)
    command = torchrun(SCRIPT, store, port, "--stuck-rank", str(stuck))
    for host in hosts:
        start_host(host, ["--stall-timeout", stall_timeout, "--no-redact"], command)
    return StoreAddress(store.address, port, "the job's store, read by the test")


def _published(address: StoreAddress) -> dict[str, dict]:
    """Each host's digest as published in the job's store now; {} while the store is not up
    (nsadiag.hosts.link: the keys the hosts share)."""
    link = HostLink(address, "the test", timeout_s=5)
    try:
        link.connect()
        return link.digests(link.hosts())
    except StoreGone:
        return {}


def _finish(hosts, exit_code: int = 1) -> list[dict]:
    found = []
    for host in hosts:
        code, _, err = host.communicate(timeout=300)
        assert code == exit_code, (host.name, code, err[-3000:])
        record = json.loads((host.run_dir / "record.json").read_text())
        report = (host.run_dir / "report.md").read_text()
        found.append({"record": record, "top": "\n".join(report.splitlines()[:6]),
                      "summary": json.loads((host.run_dir / "summary.json").read_text())})
    return found


def _assert_named(found: list[dict], rank: int, host: str, local: int) -> None:
    for seen in found:
        verdict = seen["record"]["verdict"]
        assert verdict["name"] == "STALL-COLLECTIVE", verdict["reasons"]
        assert "ERROR" not in seen["top"] and "CRASH" not in seen["top"]
        name = f"rank {rank} on {host} (local rank {local}, node {int(host[-1]) - 1})"
        assert f"{name}: the main thread polls `not os.path.exists(marker)` in a sleep loop " \
               f"at multihost_train.py:{POLL_LINE}" in seen["top"], seen["top"]
        assert verdict["reasons"][0].startswith(f"culprit: {name} never issued collective #1")
        assert f"waits in all_reduce #1 (DDP bucket 0, 4 tensors) for {name}" in \
            verdict["reasons"][0]
        assert [(c["rank"], c["host"]) for c in verdict["facts"]["culprit_ranks"]] == \
            [(rank, host)]
        hosts = seen["record"]["evidence"]["hosts"]
        assert hosts["shared"] and hosts["hosts"] == ["host1", "host2"]
        assert hosts["phase"] == {"host1": "captured", "host2": "captured"}
    # both hosts decided one stall: the first host's signal is the one both report
    assert found[0]["record"]["evidence"]["hosts"]["stall"] == \
        found[1]["record"]["evidence"]["hosts"]["stall"]


@two_hosts
def test_two_hosts_name_the_stuck_rank_on_the_second_host_and_merge_agrees(hosts):
    _two_host_job(hosts, stuck=3)
    found = _finish(hosts)
    _assert_named(found, 3, "host2", 1)
    # the Ranks table and summary.json name every rank by host, global, local, node rank
    for seen, host in zip(found, hosts, strict=True):
        report = (host.run_dir / "report.md").read_text()
        for rank, (name, local, node) in enumerate([("host1", 0, 0), ("host1", 1, 0),
                                                    ("host2", 0, 1), ("host2", 1, 1)]):
            assert f"| {name} | {rank} | {local} | {node} |" in report, report
        assert seen["summary"]["hosts"] == ["host1", "host2"]
        assert [(r["host"], r["local_rank"], r["node_rank"]) for r in
                seen["summary"]["ranks"]] == [("host1", 0, 0), ("host1", 1, 0),
                                              ("host2", 0, 1), ("host2", 1, 1)]
    # one timeline: a process per host, a thread per rank named by its host and ranks
    trace = json.loads((hosts[1].run_dir / "hosts-trace.json").read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace
               if e["name"] == "thread_name"}
    assert processes == {1: "host1", 2: "host2"}
    assert threads[(2, 3)] == "rank 3 on host2 (local rank 1, node 1)"
    assert sorted(threads) == [(1, 0), (1, 1), (2, 2), (2, 3)]
    waits = [(e["pid"], e["tid"]) for e in trace if e.get("name") == "all_reduce #1" and
             e["args"]["status"] == "open at the stop"]
    assert sorted(waits) == [(1, 0), (1, 1), (2, 2)]
    merged = nsadiag("merge", "--json", str(hosts[0].run_dir), str(hosts[1].run_dir))
    assert merged.returncode == 1, merged.stderr
    verdict = json.loads(merged.stdout)
    assert verdict["name"] == "STALL-COLLECTIVE"
    own = found[0]["record"]["verdict"]
    assert verdict["reasons"][0] == own["reasons"][0]
    assert verdict["facts"]["wait_chain"]["printed"] == own["facts"]["wait_chain"]["printed"]


@pytest.mark.hosts
@two_hosts
@pytest.mark.parametrize("stuck, host, local", [(1, "host1", 1), (0, "host1", 0)])
def test_the_culprit_on_the_stores_host_or_rank_0_is_named_by_both_hosts(hosts, stuck, host,
                                                                         local):
    _two_host_job(hosts, stuck)
    _assert_named(_finish(hosts), stuck, host, local)


def _published_after(store: StoreAddress, host: str, t: float) -> float:
    """Now (time.time()), once ``host`` has published after ``t``; 0 until then."""
    state = _published(store).get(host) or {}
    return time.time() if float(state.get("published_at") or 0.0) > t else 0.0


@pytest.mark.slow
@two_hosts
def test_a_host_killed_outright_is_named_by_the_other(hosts):
    store = _two_host_job(hosts, stuck=3, stall_timeout="60")
    waiting = hosts[0].run_dir

    def host1_in_all_reduce() -> bool:
        return sum('"kind":"collective"' in p.read_text()
                   for p in waiting.glob("proc-*/events.jsonl")) >= 2

    wait_for(while_hosts_live(hosts, host1_in_all_reduce), 240,
             "host1's two ranks to wait in all_reduce")
    # host2's ranks published in the store, and host1 having read them: host1 reads the
    # others right after each of its publications until it has seen every host with its
    # ranks, so its second publication after host2's is past that read. (Its ranks start
    # long before its nsadiag first publishes on a loaded machine: a host killed before
    # any of its ranks were heard of cannot be named.)
    seen = wait_for(while_hosts_live(hosts, lambda: len(
        (_published(store).get("host2") or {}).get("ranks") or []) == 2 and time.time()),
        120, "host2 to publish its two ranks")
    first = wait_for(while_hosts_live(hosts, lambda: _published_after(store, "host1", seen)),
                     60, "host1 to publish after host2's ranks were published")
    wait_for(while_hosts_live(hosts, lambda: _published_after(store, "host1", first)), 60,
             "host1 to publish again")
    kill_host(hosts[1])
    code, _, err = hosts[0].communicate(timeout=300)
    assert code == 1, err[-2000:]
    record = json.loads((hosts[0].run_dir / "record.json").read_text())
    verdict = record["verdict"]
    assert verdict["name"] == "CRASH", verdict["reasons"]
    assert verdict["reasons"][0].startswith("host host2 lost at "), verdict["reasons"]
    assert "its ranks 2, 3 last seen at: rank 2 on host2 (local rank 0, node 1)" in \
        verdict["reasons"][0]
    assert record["evidence"]["hosts"]["lost"] == ["host2"]


@pytest.mark.slow
@two_hosts
def test_a_healthy_two_host_job_is_ok_on_both_hosts(hosts):
    # no rank waits for a shard; a long stall timeout: a host that finishes first waits in
    # torchrun's exit barrier for the other, quietly
    _two_host_job(hosts, stuck=-1, stall_timeout="60")
    for seen in _finish(hosts, exit_code=0):
        assert seen["record"]["verdict"]["name"] == "OK", seen["record"]["verdict"]
        assert seen["record"]["evidence"]["hosts"]["lost"] == []
