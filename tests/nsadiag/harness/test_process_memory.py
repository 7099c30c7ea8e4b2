"""Every process's memory (nsadiag.harness.procmem), the fork notes of a DataLoader's
dataset (nsadiag.probes.forks), the copy-on-read finding (nsadiag.finding.copy_on_read) and
the memory cgroup's limit and OOM kills (nsadiag.harness.memlimit)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pytest

from nsadiag.finding.copy_on_read import MIN_GROWTH_BYTES, copy_on_read
from nsadiag.harness import memlimit, procmem
from nsadiag.harness.procmem import MemoryWatch, assigning_line, read_rollup
from nsadiag.probes.forks import dataset_containers, read_notes
from nsadiag.record.process_memory import (
    ForkedDataset,
    MemoryPoint,
    ProcessMemory,
    ProcessSeries,
)

MiB = 2**20


class Records:
    def __init__(self, n: int):
        rng = random.Random(0)
        self.records = [{"ids": [rng.randrange(1000, 9000) for _ in range(8)], "label": i}
                        for i in range(n)]
        self.table = np.zeros((n, 8), dtype=np.int64)  # one buffer: no object per item
        self.names = np.array([f"n{i}" for i in range(n)], dtype=object)
        self.few = [1, 2, 3]


class Wrapped:
    def __init__(self, inner: Records):
        self.dataset = inner


def test_dataset_containers_names_python_object_containers_largest_first() -> None:
    found = dataset_containers(Wrapped(Records(5000)))
    paths = [c["path"] for c in found]
    assert paths == ["dataset.records", "dataset.names"]  # numpy numbers and short lists out
    records = found[0]
    assert (records["type"], records["length"], records["item_type"]) == ("list", 5000, "dict")
    # a record: its dict, keys, the list of 8 ints and the ints (28 bytes each) at least
    assert records["estimated_bytes"] > 5000 * (8 * 28 + 64)


def test_a_forked_dataloader_worker_writes_its_dataset_note(tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        import torch
        from torch.utils.data import DataLoader, Dataset
        from nsadiag.probes import forks

        class Corpus(Dataset):
            def __init__(self):
                self.rows = [{{"x": float(i)}} for i in range(3000)]
            def __len__(self):
                return len(self.rows)
            def __getitem__(self, i):
                return torch.tensor(self.rows[i]["x"])

        forks.install(__import__("pathlib").Path(sys.argv[1]))
        for _ in DataLoader(Corpus(), batch_size=500, num_workers=2,
                            multiprocessing_context="fork"):
            pass
        """))
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, timeout=120)
    notes = read_notes(tmp_path)
    assert len(notes) == 2
    for note in notes:
        dataset = ForkedDataset.from_dict(note["dataset"])
        assert dataset.class_name == "Corpus" and dataset.length == 3000
        assert dataset.file == str(script)
        assert [(c.path, c.length, c.item_type) for c in dataset.containers] == \
            [("rows", 3000, "dict")]
        assert assigning_line(dataset, dataset.containers[0]) == \
            (10, 'self.rows = [{"x": float(i)} for i in range(3000)]')


def test_a_fork_that_is_not_a_dataloaders_notes_no_dataset(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        from nsadiag.probes import forks
        forks.install(__import__("pathlib").Path(sys.argv[1]))
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        """))
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, timeout=60)
    (note,) = read_notes(tmp_path)
    assert note["dataset"] is None and note["ppid"] != note["pid"]


def test_read_rollup_reads_this_process_and_none_for_a_gone_one() -> None:
    point = read_rollup(os.getpid(), 1.0)
    assert point is not None and point.rss > 0 and point.private > 0
    assert read_rollup(2**22 + 7, 1.0) is None


def test_memory_watch_keeps_points_and_processes_bounded(monkeypatch) -> None:
    monkeypatch.setattr(procmem, "MAX_POINTS", 8)
    watch = MemoryWatch()
    me = psutil.Process()
    for _ in range(20):
        watch.sample([me], every=True)
    (series,) = watch.series.values()
    assert 4 <= len(series.points) <= 8
    assert series.points[0].t <= series.points[-1].t
    monkeypatch.setattr(procmem, "MAX_SERIES", 2)
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
                for _ in range(3)]
    try:
        for child in children:
            watch.sample([me, psutil.Process(child.pid)], every=True)
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert len(watch.series) == 2 and watch.left_out == 2
    record = watch.record(Path("/nonexistent"))
    stored = json.loads(json.dumps(record.to_dict()))
    assert ProcessMemory.from_dict(stored).to_dict() == stored


def _series(pid: int, points: list[tuple[float, int, int]], forked_by: int | None = 10,
            dataset: ForkedDataset | None = None) -> ProcessSeries:
    return ProcessSeries(pid=pid, ppid=forked_by, command="python train.py", started=0.0,
                         points=tuple(MemoryPoint(t, p * MiB, s * MiB, p * MiB, 0, (p + s) * MiB)
                                      for t, p, s in points),
                         forked_by=forked_by, dataset=dataset)


DATASET = ForkedDataset.from_dict({
    "class": "Corpus", "file": "/home/u/train.py", "line": 12, "length": 300000,
    "containers": [{"path": "examples", "type": "list", "length": 300000,
                    "item_type": "dict", "estimated_bytes": 360 * MiB, "line": 14,
                    "code": "self.examples = []"}]})


def test_copy_on_read_found_in_a_worker_whose_private_grows_as_shared_falls() -> None:
    copying = _series(11, [(0, 40, 530), (5, 150, 420), (10, 270, 300)], dataset=DATASET)
    own_work = _series(12, [(0, 40, 530), (5, 200, 530), (10, 400, 530)], dataset=DATASET)
    parent = _series(10, [(0, 500, 0), (10, 200, 300)], forked_by=None)
    found = copy_on_read(ProcessMemory(1.0, (parent, copying, own_work)),
                         "DataLoader worker (pid 11) is killed by signal: Killed.")
    assert found is not None
    assert [w.series.pid for w in found.workers] == [11]  # not the one that allocates
    assert found.killed == 11 and found.what_failed
    assert found.attribute() == ("`Corpus.examples` (a list of 300,000 dict, about 360 MiB "
                                 "of Python objects)")
    culprit = found.culprit("train.py")
    assert (culprit.file, culprit.line, culprit.code) == ("train.py", 14, "self.examples = []")
    assert "40.0 MiB -> 270 MiB in 10 s" in found.proof()
    assert "530 MiB -> 300 MiB" in found.proof()
    assert "`examples`" in found.next_action() and "numpy array" in found.next_action()


def test_no_copy_on_read_below_the_growth_or_without_a_fork() -> None:
    small = _series(11, [(0, 40, 530), (10, 40 + MIN_GROWTH_BYTES // MiB - 1, 500)])
    unforked = _series(12, [(0, 40, 530), (10, 300, 270)], forked_by=None)
    one = _series(13, [(0, 40, 530)])
    assert copy_on_read(ProcessMemory(1.0, (small, unforked, one))) is None
    assert copy_on_read(None) is None
    found = copy_on_read(ProcessMemory(1.0, (_series(11, [(0, 40, 530), (9, 300, 270)]),)),
                         "worker pid 99 killed")
    assert found is not None and found.killed is None and found.container is None
    assert "not named" in found.cause() and "Keep what the forked workers" in \
        found.next_action()


def _cgroup_v1(tmp_path: Path, limit: int, kills: int) -> None:
    mount = tmp_path / "memory"
    (mount / "job").mkdir(parents=True, exist_ok=True)
    (mount / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (mount / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (mount / "job" / "memory.limit_in_bytes").write_text(str(limit))
    (mount / "job" / "memory.oom_control").write_text(f"oom_kill_disable 0\noom_kill {kills}\n")


def test_memory_limit_of_a_v1_cgroup_and_its_oom_kills(tmp_path: Path, monkeypatch) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 25 0:26 / {tmp_path / 'memory'} rw,relatime - cgroup cgroup "
                         f"rw,memory\n")
    own = tmp_path / "cgroup"
    own.write_text("4:memory:/job\n0::/\n")
    monkeypatch.setattr(memlimit, "MOUNTINFO", mountinfo)
    monkeypatch.setattr(memlimit, "OWN_CGROUP", own)
    _cgroup_v1(tmp_path, 700 * MiB, 0)
    before = memlimit.memory_limit()
    assert before == memlimit.MemoryLimit(700 * MiB, 0, "/job")
    _cgroup_v1(tmp_path, 700 * MiB, 1)
    after = memlimit.memory_limit()
    assert memlimit.killed_by_oom(before, after)
    assert not memlimit.killed_by_oom(after, after) and not memlimit.killed_by_oom(None, after)


def test_memory_limit_of_a_v2_cgroup(tmp_path: Path, monkeypatch) -> None:
    mount = tmp_path / "unified"
    (mount / "user" / "job").mkdir(parents=True)
    (mount / "user" / "memory.max").write_text(f"{900 * MiB}\n")
    (mount / "user" / "job" / "memory.max").write_text("max\n")
    (mount / "user" / "job" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\n"
                                                          "oom_kill 2\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"31 25 0:27 / {mount} rw - cgroup2 cgroup2 rw\n")
    own = tmp_path / "cgroup"
    own.write_text("0::/user/job\n")
    monkeypatch.setattr(memlimit, "MOUNTINFO", mountinfo)
    monkeypatch.setattr(memlimit, "OWN_CGROUP", own)
    assert memlimit.memory_limit() == memlimit.MemoryLimit(900 * MiB, 2, "/user/job")
    own.write_text("")
    assert memlimit.memory_limit() is None


@pytest.mark.parametrize("bad", [[1, 2], [1, 2, 3, 4, 5, "x"], "p"])
def test_a_malformed_point_is_one_type_error(bad) -> None:
    with pytest.raises(TypeError, match="points"):
        ProcessMemory.from_dict({"interval_s": 1, "series": [{"pid": 1, "points": [bad]}]})
