"""The sampler stress harness as a test (minutes long: ``pytest -m stress``, not in the
default run): bench/stress_sampler.py, one pair of runs without and with the sampler beside
two burners, must end with no crash and no failure counted by the sampler."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.stress
def test_the_sampler_survives_minutes_of_what_real_code_does(tmp_path):
    rows = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "stress_sampler.py"),
                           "--pairs", "1", "--seconds", "120", "--json", str(rows)],
                          capture_output=True, text=True, timeout=1800, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(rows.read_text())["rows"]
    assert [row["sampler"] for row in found] == [False, True]
    assert all(row["rc"] == 0 and row["rounds"] > 0 for row in found), found
    assert found[1]["sampler_failures"] == 0
