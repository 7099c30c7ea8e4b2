import json
import os
import sys

from nsadiag.envinfo import collect_env, ptrace_permission, triton_kernels
from tests.helpers import nsadiag


def test_env_reports_cpu_build_cleanly():
    report = collect_env()
    assert report.packages["torch"] != "not installed"
    import torch

    if not torch.cuda.is_available():
        assert report.cuda.startswith("not available on this device")
        assert report.devices == []
    assert any(word in ptrace_permission() for word in ("allowed", "children only", "refused"))


def test_env_says_how_the_triton_backend_would_run(monkeypatch):
    import importlib.util

    import torch

    line = triton_kernels(torch.cuda.is_available())
    if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
        assert line.startswith("triton kernels: CPU interpreter")  # conftest turns it on
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert triton_kernels(False) == ("triton kernels: not usable (triton is not installed: "
                                     "pip install -e '.[triton]')")
    assert any(n.startswith("triton kernels:") for n in collect_env().notes)


def test_env_command_prints_json_without_traceback():
    done = nsadiag("env", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["python"] == sys.version.split()[0]
    assert isinstance(data["problems"], list) and data["usable_cpus"] >= 1
    assert len(data["load_average"]) == 3
    assert "Traceback" not in done.stderr


def test_env_command_prints_a_table_with_the_load_and_the_problems():
    done = nsadiag("env", env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "load_average" in rows and "usable_cpus" in rows and "problems" in rows


def test_unknown_command_exits_2_without_traceback():
    done = nsadiag("sweep-everything")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
