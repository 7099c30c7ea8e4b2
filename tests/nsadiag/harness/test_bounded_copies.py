"""What nsadiag keeps of a long run is bounded: 100 MiB of a command's output leaves its
first and last 16 MiB in stdout.txt with a line for what was left out (and the report says
so), and a loop of fast steps writes its heartbeat at a bounded rate once past its first
burst, with the step count still whole."""

from __future__ import annotations

import json
import subprocess
import sys

from nsadiag.harness import heartbeat
from nsadiag.harness.heartbeat import HeartbeatWriter
from nsadiag.harness.streams import UNBOUNDED_STEPS, Stream
from tests.helpers import REPO, checkout_env

HUNDRED_MIB = """
import sys
line = ("x" * 1023 + "\\n").encode()
sys.stdout.buffer.write(b"THE START\\n")
for i in range(100 * 1024):
    sys.stdout.buffer.write(line)
sys.stdout.buffer.write(b"THE END\\n")
"""


def test_a_hundred_mib_of_output_keeps_its_head_and_tail_only(tmp_path):
    out = tmp_path / "run"
    with open(tmp_path / "o", "wb") as stdout, open(tmp_path / "e", "wb") as stderr:
        done = subprocess.run([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(out),
                               "--", sys.executable, "-c", HUNDRED_MIB], cwd=REPO,
                              env=checkout_env(), stdout=stdout, stderr=stderr, timeout=600)
    err = (tmp_path / "e").read_text()
    assert done.returncode == 0, err
    kept = (out / "stdout.txt").read_bytes()
    assert len(kept) <= 40 * 2**20
    assert kept.startswith(b"THE START\n") and kept.endswith(b"THE END\n")
    total = 10 + 100 * 2**20 + 8
    dropped = total - 32 * 2**20
    assert f"\n[nsadiag: {dropped} bytes of the output left out here]\n".encode() in kept
    # the terminal's share is whole (with nsadiag's own lines after it)
    assert (tmp_path / "o").read_bytes()[:total].endswith(b"THE END\n")
    said = (f"stdout.txt: the output was {total:,} bytes; its first and last 16 MiB are "
            f"kept, the {dropped:,} bytes between them left out")
    assert said in err
    assert said in (out / "report.md").read_text()
    assert json.loads((out / "summary.json").read_text())["verdict"] == "OK"


def test_a_thinned_heartbeat_writes_one_step_event_for_many_and_keeps_the_count(
        tmp_path, monkeypatch):
    monkeypatch.setattr(heartbeat, "THIN_BURST_BYTES", 3000)
    monkeypatch.setattr(heartbeat, "THIN_RATE_BYTES_S", 0.0)
    monkeypatch.setattr(heartbeat, "THIN_EVERY_S", 0.0)  # every tick, to count them
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path, buffered=True)
    stream = Stream("proc-1", path, UNBOUNDED_STEPS)
    writer.start("build", pid=1)
    step = 0
    for _ in range(40):  # 40 sampler ticks of 50 steps each
        for _ in range(50):
            writer.step = step
            writer.step_done(0.001, 0.0005, 0.0005)
            step += 1
        writer.write_blocks()
        stream.add(stream.read_new())
    writer.end("ok")
    writer.close()
    stream.add(stream.read_new())
    events = [json.loads(line) for line in path.read_text().splitlines()]
    written = [e for e in events if e["kind"] == "step"]
    assert writer.thinned_at is not None
    assert len(written) < 100 and any(e.get("steps", 1) > 1 for e in written)
    assert sum(e.get("steps", 1) for e in written) == 2000 == stream.counts["step"]
    assert written[-1]["step"] == 1999 and stream.finished
    thinned = [e for e in written if e.get("steps", 1) > 1]
    assert all(e["rss"] and e["rss"] > 0 for e in thinned)  # read when written
