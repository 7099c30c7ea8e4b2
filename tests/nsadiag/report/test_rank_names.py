"""Every rank named by host, global, local and node rank: the per-rank table of the reports,
summary.json, the Chrome trace of a many-host job, and what redaction does with the job's
hosts (the report on the job's machines names them; a bundle gives each one pseudonym in
every file). Synthetic records of a 2 x 2 job, no processes."""

from __future__ import annotations

import dataclasses
import json
import re
import tarfile

import pytest
from typer.testing import CliRunner

from nsadiag.cli import app
from nsadiag.evidence import CommandFacts, DdpFacts, Evidence, ProcessOutcome
from nsadiag.finding.attach import AttachRecord, attach_finding
from nsadiag.harness.collectives import summarize
from nsadiag.hosts.merged import HostState, HostsView, decide_hosts
from nsadiag.hosts.trace import hosts_trace
from nsadiag.ranknames import RankNames, process_names, rank_names
from nsadiag.redact import GENERIC_HOSTS, Redactor, host_pseudonyms
from nsadiag.report.attach import build_attach_report
from nsadiag.report.bundle import write_bundle
from nsadiag.report.dispatch import render_run
from nsadiag.report.ranks import ranks_table
from nsadiag.rundir import TrialRecord, write_json, write_private_json
from nsadiag.runmeta import RunMeta
from nsadiag.spec import TrialSpec
from nsadiag.verdict.ranks import RankEvidence, decide_ranks
from nsadiag.verdict.thresholds import HOSTS_LOST_AFTER_S
from nsadiag.verdictfacts import VerdictFacts

T0 = 1000.0
HOSTS = ("host1", "host2")
NODES = {0: (0, 0, 0), 1: (0, 1, 0), 2: (1, 0, 1), 3: (1, 1, 1)}
"""global rank -> (index of its host in HOSTS, local rank, node rank) of the 2 x 2 job."""
THIS_FQDN = "host2.cluster.example.internal"


def _collective(n: int, edge: str, t: float) -> dict:
    return {"t": t, "kind": "collective", "edge": edge, "n": n, "op": "all_reduce",
            "origin": "ddp", "phase": "backward", "step": 1,
            "detail": "DDP bucket 0, 4 tensors", "shapes": [[100]] if edge == "start" else []}


def _rank(r: int, named: bool = True, hosts: tuple[str, str] = HOSTS) -> RankEvidence:
    """Rank ``r`` after one finished all_reduce; every rank but 3 waits in #2, rank 3
    polls in forward and never issued it."""
    events = [_collective(1, "start", T0 + 1), {**_collective(1, "end", T0 + 2),
                                                "status": "ok"}]
    if r != 3:
        events.append(_collective(2, "start", T0 + 3))
    module = {"t": T0 + 3, "kind": "module", "module": "blocks.0",
              "phase": "backward" if r != 3 else "forward", "step": 1, "edge": "enter"}
    host, local, node = NODES[r]
    names = {"host": hosts[host], "rank": r, "local_rank": local, "node_rank": node,
             "world_size": 4, "slurm_job": None} if named else None
    return RankEvidence(rank=r, pid=100 + r, events=[module, *events], event_counts={},
                        result=None, started=[e for e in events if e["edge"] == "start"],
                        collectives=summarize(events), names=names)


def _job() -> Evidence:
    outcome = ProcessOutcome(exit_code=None, signal=9, killed_by_runner=True,
                             kill_reason="stall", wall_s=20.0, ended_at=T0 + 10)
    return Evidence(spec={"command": ["torchrun", "train.py"], "stall_timeout_s": 10.0,
                          "deadline_s": 600.0, "subject": "the command"},
                    events=[], event_counts={}, result=None, outcome=outcome, stall=None,
                    expected_events_per_step=None, total_steps=0, stall_timeout_s=10.0)


def _view(ranks: list[RankEvidence], this: str, hosts: tuple[str, str] = HOSTS
          ) -> HostsView:
    states = {h: HostState(h, "captured", T0 + 9, [r for r in ranks if r.names and
                                                   r.names["host"] == h]) for h in hosts}
    return HostsView(this, "shared through the test's store", True, states,
                     {"host": hosts[0], "t": T0 + 8})


def _run_dir(tmp_path, this: int = 1, hosts: tuple[str, str] = HOSTS):
    """The run directory of ``hosts[this]`` in the 2 x 2 job, recorded as if this machine
    were that host (its FQDN: THIS_FQDN)."""
    run = tmp_path / hosts[this]
    run.mkdir()
    ranks = [_rank(r, hosts=hosts) for r in range(4)]
    view = _view(ranks, hosts[this], hosts)
    job = _job()
    verdict = decide_hosts(job, ranks, view)
    evidence = dataclasses.replace(job, ranks=[r.to_dict() for r in ranks],
                                   hosts=view.to_dict(),
                                   command=CommandFacts([], None, None, None))
    record = TrialRecord(dict(job.spec), evidence, verdict, str(run), 20.0)
    write_json(run / "run.json", {"command_name": "run", "argv": job.spec["command"]})
    write_json(run / "record.json", record.to_dict())
    write_json(run / "hosts-trace.json", hosts_trace(ranks, view, T0 + 10))
    write_private_json(run / "redaction.json", {"schema_version": 1, "users": [],
                                                "hosts": [hosts[this], THIS_FQDN],
                                                "secrets": []})
    (run / "stderr.txt").write_text(f"[rank2]: watchdog on {THIS_FQDN} ({hosts[this]})\n")
    return run, verdict


def _table(markdown: str) -> list[list[str]]:
    """The cells of the Ranks section's table."""
    section = markdown.split("## Ranks\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def test_the_table_names_host_global_local_and_node_rank_and_says_unknown():
    rows = [{"rank": 0, "host": "host1", "local_rank": 0, "node_rank": 0, "pid": 100,
             "state": "in-collective", "issued": 2},
            {"rank": 1, "host": None, "local_rank": None, "node_rank": None, "pid": None,
             "state": "unknown (no stacks)", "issued": 0}]
    lines = ranks_table(VerdictFacts.of({"ranks": rows}).ranks.ranks)
    assert lines[0].startswith("| host | rank | local rank | node rank | pid | state |")
    assert lines[2].startswith("| host1 | 0 | 0 | 0 | 100 | in-collective | 2 |")
    assert lines[3].startswith("| unknown | 1 | unknown | unknown | - | unknown (no stacks) |")


def test_a_many_host_report_names_every_host_even_this_one(tmp_path):
    run, verdict = _run_dir(tmp_path)
    rendered = render_run(run)
    report = (run / "report.md").read_text()
    cells = _table(report)
    assert cells[0][:4] == ["host", "rank", "local rank", "node rank"]
    assert [row[:4] for row in cells[2:]] == [[HOSTS[h], str(r), str(lo), str(no)]
                                             for r, (h, lo, no) in NODES.items()]
    culprit = "rank 3 on host2 (local rank 1, node 1)"
    assert verdict.reasons[0].startswith(f"culprit: {culprit} never issued collective #2")
    assert culprit in report
    assert f"collective #2 differs between ranks: {culprit} waits in no collective; rank 0 " \
           f"on host1 (local rank 0, node 0) waits in all_reduce #2" in report
    # this machine's name names its ranks; its FQDN still names nothing and stays hidden
    assert "watchdog on <host> (host2)" in report and THIS_FQDN not in report
    summary = json.loads((run / "summary.json").read_text())
    assert [(row["rank"], row["host"], row["local_rank"], row["node_rank"])
            for row in summary["ranks"]] == [(r, HOSTS[h], lo, no)
                                             for r, (h, lo, no) in NODES.items()]
    assert summary["hosts"] == ["host1", "host2"] == rendered.hosts


def test_a_single_host_ddp_report_names_its_host_and_an_unnamed_rank_is_unknown(tmp_path):
    ranks = [_rank(0), _rank(1, named=False)]
    job = _job()
    verdict = decide_ranks(job, ranks)
    evidence = dataclasses.replace(job, ranks=[r.to_dict() for r in ranks],
                                   ddp=DdpFacts(2, "gloo"))
    run = tmp_path / "ddp"
    spec = json.loads(TrialSpec(n_layers=1, seq_len=64, out_dir=str(run)).to_json())
    run.mkdir()
    write_json(run / "run.json", {"command_name": "ddp"})
    (run / "trials.jsonl").write_text(json.dumps(
        TrialRecord(spec, evidence, verdict, str(run), 20.0).to_dict()) + "\n")
    write_private_json(run / "redaction.json", {"schema_version": 1, "users": [],
                                                "hosts": ["host1"], "secrets": []})
    render_run(run)
    report = (run / "report.md").read_text()
    assert [row[:4] for row in _table(report)[2:]] == [["host1", "0", "0", "0"],
                                                      ["unknown", "1", "unknown", "unknown"]]
    assert "### Rank 0 on host1 (local rank 0, node 0)" in report
    assert "### Rank 1\n" in report
    summary = json.loads((run / "summary.json").read_text())
    assert summary["hosts"] == ["host1"]
    assert [(row["host"], row["local_rank"]) for row in summary["ranks"]] == \
        [("host1", 0), (None, None)]


def test_the_trace_has_one_process_per_host_and_a_thread_per_rank():
    ranks = [_rank(r) for r in range(4)]
    trace = hosts_trace(ranks, _view(ranks, "host2"), T0 + 10)["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace
               if e["name"] == "thread_name"}
    assert processes == {1: "host1", 2: "host2"}
    assert threads == {(1, 0): "rank 0 on host1 (local rank 0, node 0)",
                       (1, 1): "rank 1 on host1 (local rank 1, node 0)",
                       (2, 2): "rank 2 on host2 (local rank 0, node 1)",
                       (2, 3): "rank 3 on host2 (local rank 1, node 1)"}


def test_a_bundle_names_each_host_by_one_pseudonym_in_every_file(tmp_path):
    run, _ = _run_dir(tmp_path)
    with tarfile.open(write_bundle(run)) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
                 for m in tar.getmembers()}
    assert {"report.md", "summary.json", "record.json", "hosts-trace.json", "stderr.txt",
            "BUNDLE.txt"} <= set(files)
    for name, text in files.items():
        assert not re.search(r"\bhost[12]\b", text), name
        assert THIS_FQDN not in text and "cluster.example" not in text, name
    assert "rank 3 on host-2 (local rank 1, node 1)" in files["report.md"]
    assert [row[0] for row in _table(files["report.md"])[2:]] == \
        ["host-1", "host-1", "host-2", "host-2"]
    assert json.loads(files["summary.json"])["hosts"] == ["host-1", "host-2"]
    record = json.loads(files["record.json"])
    assert record["evidence"]["hosts"]["hosts"] == ["host-1", "host-2"]
    assert [r["names"]["host"] for r in record["evidence"]["ranks"]] == \
        ["host-1", "host-1", "host-2", "host-2"]
    trace = json.loads(files["hosts-trace.json"])["traceEvents"]
    assert {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"} == \
        {1: "host-1", 2: "host-2"}
    assert files["stderr.txt"] == "[rank2]: watchdog on <host> (host-2)\n"
    assert "host-1, host-2 (in the order of their first rank)" in files["BUNDLE.txt"]


def test_shown_hosts_give_way_to_user_names_and_cannot_be_forged():
    redactor = Redactor({"node7"}, {"alice"}, set(),
                        {"node7": "node7", "alice": "alice", "gpu-3.corp": "gpu-3.corp"})
    assert redactor.text("alice on node7 and gpu-3.corp, db-1.corp") == \
        "<user> on node7 and gpu-3.corp, <host>"
    # the marks that hold a shown name's place inside the redactor mean nothing in a record
    assert redactor.text("x\ue0000\ue001 \ue0009\ue001") == "x0 9"
    pseudonyms = host_pseudonyms(["node7", "node2", "node7"])
    assert pseudonyms == {"node7": "host-1", "node2": "host-2"}
    bundle = Redactor({"node7"}, set(), set(), pseudonyms)
    assert bundle.text("node2 waits for node7; node7.x") == "host-2 waits for host-1; host-1.x"
    # an internal domain goes with the name; a public one stays
    assert bundle.text("node2.cluster.internal, node2.example.com") == \
        "host-2, host-2.example.com"
    assert bundle.text(bundle.text("node2 node7")) == "host-2 host-1"


def _this_machine() -> str:
    """The name nsadiag gives this machine's ranks (nsadiag.ranknames)."""
    host = rank_names({}).host
    if len(host) < 2 or host.lower() in GENERIC_HOSTS:
        pytest.skip(f"this machine's name {host!r} is one redaction never hides")
    return host


def test_the_terminal_names_the_jobs_hosts_this_one_too(tmp_path):
    here = _this_machine()
    hosts = ("peer-7", here)
    runs = [_run_dir(tmp_path, i, hosts)[0] for i in (0, 1)]
    culprit = f"rank 3 on {here} (local rank 1, node 1)"
    done = CliRunner().invoke(app, ["report", str(runs[1])])
    assert done.exit_code == 0, done.output
    assert f"proof: collective #2 differs between ranks: {culprit} waits in no collective" \
        in done.stdout
    merged = CliRunner().invoke(app, ["merge", str(runs[0]), str(runs[1])])
    assert merged.exit_code == 1, merged.output
    assert merged.stdout.startswith(f"STALL-COLLECTIVE: culprit: {culprit} never issued "
                                    f"collective #2: rank 0 on peer-7 (local rank 0, node 0)")
    # a command whose report names no rank hides this machine's name as before
    cleared = CliRunner().invoke(app, ["report", str(runs[1] / "nowhere")])
    assert cleared.exit_code == 2, cleared.output
    assert f"/{here}/nowhere" not in cleared.stderr and "/<host>/nowhere" in cleared.stderr


def test_a_lost_host_keeps_its_ranks_in_the_table():
    ranks = [_rank(r) for r in range(4)]
    view = _view(ranks, "host1")
    view.states["host2"].phase = "live"
    view.stall, view.lost = None, ["host2"]
    job = dataclasses.replace(_job(), outcome=ProcessOutcome(
        exit_code=1, signal=None, killed_by_runner=False, kill_reason=None, wall_s=20.0,
        ended_at=T0 + 10))
    verdict = decide_hosts(job, ranks, view)
    assert verdict.name == "CRASH"
    assert [(row.rank, row.host, row.node_rank) for row in verdict.facts.ranks.ranks] \
        == [(0, "host1", 0), (1, "host1", 0), (2, "host2", 1), (3, "host2", 1)]


def test_a_host_silent_before_this_hosts_own_stall_is_named_lost_not_the_stall():
    # host2 was killed (its last publication at T0 + 2); host1's stall clock ran out at
    # T0 + 8, before its ranks lost their peers: host1 decided the stall itself, and host2
    # never captured
    ranks = [_rank(r) for r in range(4)]
    view = _view(ranks, "host1")
    view.stall = {"host": "host1", "t": T0 + 8 + HOSTS_LOST_AFTER_S}
    view.states["host2"].phase, view.states["host2"].published_at = "live", T0 + 2
    view.lost = ["host2"]
    verdict = decide_hosts(_job(), ranks, view)
    assert verdict.name == "CRASH", verdict.reasons
    assert verdict.reasons[0].startswith("host host2 lost at ")
    assert verdict.reasons[1].startswith("host host1 decided a stall at ")
    assert verdict.reasons[1].endswith(", after host(s) host2 had gone silent: its ranks "
                                       "waited for ranks that were gone")
    assert [row["host"] for row in verdict.facts.ranks.lost_hosts] == ["host2"]
    # a host that published up to the signal but did not capture in time is not gone: the
    # stall is decided over every host's ranks as last seen
    view.states["host2"].published_at = view.stall["t"] - HOSTS_LOST_AFTER_S / 2
    assert decide_hosts(_job(), ranks, view).name == "STALL-COLLECTIVE"


# ---- nsadiag attach --ranks: each rank named from its process's environment -----------------


def _environ(proc, pid: int, pairs: dict[str, str] | None) -> None:
    """A fake /proc/PID/environ under ``proc`` (NUL-separated NAME=VALUE); none for None."""
    (proc / str(pid)).mkdir(parents=True)
    if pairs is not None:
        (proc / str(pid) / "environ").write_bytes(
            b"\0".join(f"{k}={v}".encode() for k, v in pairs.items()) + b"\0")


def test_an_attached_processs_names_come_from_its_environment_unknown_where_not(tmp_path):
    _environ(tmp_path, 41, {"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1",
                            "PATH": "/bin", "ODD": "a=b"})
    _environ(tmp_path, 42, {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
                            "SLURMD_NODENAME": "node-2"})
    _environ(tmp_path, 43, {"PATH": "/bin"})
    _environ(tmp_path, 44, None)  # not ours to read, or gone
    assert process_names(41, tmp_path, "host2") == RankNames("host2", 3, 1, 1)
    assert process_names(42, tmp_path, "here") == RankNames("node-2", 5, 1, 2)
    assert process_names(43, tmp_path, "host2") == RankNames("host2")
    assert process_names(44, tmp_path, "host2") == RankNames("host2")


def test_the_attach_report_names_each_rank_by_host_local_and_node_rank(tmp_path):
    _environ(tmp_path, 41, {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"})
    _environ(tmp_path, 42, {"RANK": "1"})  # a launcher that gives RANK only
    waiting = {"name": "STALL-COLLECTIVE", "reasons": ["waits"], "facts": {}}
    processes = [{"pid": pid, "rank": rank, "cmdline": "python train.py",
                  "state": "waiting in a collective", "verdict": waiting,
                  "cpu_fraction": 0.01, "user_frame": "main (train.py:9)",
                  "collective_frame": "all_reduce (distributed_c10d.py:1)", "signature": "",
                  "names": process_names(pid, tmp_path, "host1").to_dict()}
                 for pid, rank in ((41, 0), (42, 1))]
    stored = {"verdict": {"name": "STALL-COLLECTIVE", "reasons": ["both wait"],
                          "facts": {"odd_ranks": []}},
              "state": "waiting in a collective", "processes": processes}
    attached, meta = AttachRecord.from_dict(stored), RunMeta(pid=40, duration_s=3.0,
                                                             ranks=True)
    markdown, summary = build_attach_report(attached, meta, attach_finding(attached, meta))
    section = markdown.split("## Processes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows[0] == ("| pid | host | rank | local rank | node rank | state | CPU | "
                       "collective | own frame |")
    assert rows[1].count("---") == 9
    assert rows[2].startswith("| 41 | host1 | 0 | 0 | 0 | **waiting in a collective** |")
    assert rows[3].startswith("| 42 | host1 | 1 | unknown | unknown | **waiting in")
    assert "### rank 0 on host1 (local rank 0, node 0) (pid 41): waiting in a collective" \
        in markdown
    assert [(p["host"], p["rank"], p["local_rank"], p["node_rank"])
            for p in summary["processes"]] == [("host1", 0, 0, 0), ("host1", 1, None, None)]
