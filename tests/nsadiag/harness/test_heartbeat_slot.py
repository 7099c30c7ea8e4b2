"""A full disk never reads as a stall: once the heartbeat file refuses an append, its events
go to the slot beside it (nsadiag.harness.slot), the watcher reads progress and counts from
there, and a healthy run on a disk that fills ends OK with its true step count and a line
saying the disk filled."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nsadiag.harness import heartbeat
from nsadiag.harness.heartbeat import HeartbeatWriter
from nsadiag.harness.slot import SLOT_BYTES, read_slot, slot_path
from nsadiag.harness.streams import UNBOUNDED_STEPS, Stream
from tests.helpers import REPO


def _refusing_after(monkeypatch, writes: int) -> None:
    """The heartbeat file takes ``writes`` writes whole, then half of one, then none (a
    disk that fills)."""
    real = heartbeat.write_all
    calls = {"n": 0}

    def write_all(fd: int, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] <= writes:
            return real(fd, data)
        if calls["n"] == writes + 1:
            real(fd, data[:len(data) // 2])  # a torn line, as a disk filling mid-write
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(heartbeat, "write_all", write_all)


def test_events_after_a_refused_write_reach_the_watcher_through_the_slot(tmp_path,
                                                                        monkeypatch):
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path)
    stream = Stream("proc-1", path, UNBOUNDED_STEPS)
    assert slot_path(path).stat().st_size == SLOT_BYTES  # allocated before any loss
    _refusing_after(monkeypatch, 3)
    writer.start("build", pid=os.getpid())
    for step in range(3):
        writer.step = step
        writer.step_done(0.01, 0.005, 0.005)
    assert stream.add(stream.read_new())  # the file's three events, whole
    assert stream.counts == {"start": 1, "step": 2}
    for step in range(3, 500):  # far more than the slot holds, between two reads
        writer.step = step
        writer.step_done(0.01, 0.005, 0.005)
    writer.pulse({"progress": True})
    assert writer.lost is not None and "No space left on device" in writer.lost
    # the torn write was cut back: the file holds whole lines only
    assert path.read_bytes().endswith(b"\n")
    assert all(json.loads(line) for line in path.read_text().splitlines())
    writer.slot.write()  # what the next due rewrite does
    new = stream.read_new()
    assert new and max(e["seq"] for e in new) == 501  # start, 500 steps, the pulse
    assert stream.add(new)  # steps in the slot are progress
    assert stream.counts["step"] == 500 and stream.counts["pulse"] == 1
    assert stream.lost == writer.lost and stream.lost_t is not None
    assert stream.add(stream.read_new()) is False  # nothing new: no progress, no count
    assert stream.counts["step"] == 500
    writer.end("ok")
    writer.close()
    stream.add(stream.read_new())
    assert stream.counts["end"] == 1 and stream.finished


def test_a_slot_holds_nothing_until_a_loss_and_a_torn_slot_is_read_again_later(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path)
    writer.start("build")
    assert read_slot(path) is None
    writer.close()
    assert read_slot(path) is None
    with open(slot_path(path), "r+b") as f:
        f.write(b'{"lost":"x","lost_t":1,"counts":{"step":3},"ev')  # cut mid-document
    assert read_slot(path) is None


def test_a_heartbeat_that_is_not_a_regular_file_gets_no_slot():
    writer = HeartbeatWriter(Path("/dev/full"))  # every write fails, as on a full disk
    writer.start("forward", 0)
    assert writer.lost is not None and writer.slot.fd is None
    assert not os.path.exists("/dev/full.slot")
    writer.close()


FAST_LOOP = textwrap.dedent("""
    import sys, torch
    m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), 0.1)
    steps = int(sys.argv[1])
    for step in range(steps):
        loss = m(torch.randn(4, 8)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
        print(f"step {step + 1} of {steps}: loss {loss.item():.4f} " + "." * 150, flush=True)
""")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="mounts a small tmpfs in a mount namespace of its own (root)")
def test_a_healthy_run_on_a_disk_that_fills_ends_ok_with_its_true_step_count(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "fast.py"
    script.write_text(FAST_LOOP)
    steps = 20000
    shell = (f"mount -t tmpfs -o size=6m tmpfs {disk} && cd {REPO} && "
             f"{sys.executable} -m nsadiag.cli run --stall-timeout 8 --out {disk}/run -- "
             f"{sys.executable} {script} {steps} > {tmp_path}/out.txt 2> {tmp_path}/err.txt;"
             f" echo $? > {tmp_path}/rc.txt; cp {disk}/run/summary.json {disk}/run/report.md "
             f"{tmp_path}/; find {disk} -name '*.tmp' > {tmp_path}/tmp.txt")
    subprocess.run(["unshare", "-m", "sh", "-c", shell], timeout=600, check=True)
    err = (tmp_path / "err.txt").read_text()
    assert (tmp_path / "rc.txt").read_text().strip() == "0", err
    assert f"step {steps} of {steps}" in (tmp_path / "out.txt").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["verdict"] == "OK"
    assert summary["finding"]["proof"] == f"{steps:,} steps finished"
    report = (tmp_path / "report.md").read_text()
    assert "the run directory's disk filled: proc-" in report
    assert "/events.jsonl: events after #" in report and "No space left on device" in report
    assert "nsadiag run: stdout.txt: the copy stopped after" in err
    assert (tmp_path / "tmp.txt").read_text() == ""
