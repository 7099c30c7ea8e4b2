"""nsadiag's helper processes never import from the user's current directory: a json.py,
select.py, psutil.py or secrets.py there is neither run nor in the way, and a helper that
cannot start is one true line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nsadiag.harness import launch
from nsadiag.harness.helpers import PACKAGE_ROOT, failure_line, helper_popen

SHADOWS = ("json", "select", "psutil", "secrets", "signal", "runpy")


def test_a_run_from_a_directory_full_of_shadowing_modules_is_unaffected(tmp_path):
    cwd = tmp_path / "project"
    cwd.mkdir()
    ran = tmp_path / "ran.txt"
    for name in SHADOWS:
        (cwd / f"{name}.py").write_text(f"open({str(ran)!r}, 'a').write('{name}\\n')\n"
                                        f"raise SystemExit('the user\\'s {name}.py')\n")
    # the installed command, as a user types it (`python -m nsadiag.cli` would itself put
    # the directory on its path)
    console = Path(sys.executable).parent / "nsadiag"
    if not console.exists():
        pytest.skip("no installed nsadiag command beside this interpreter")
    done = subprocess.run([str(console), "run", "--out", str(tmp_path / "run"), "--",
                           sys.executable, "-I", "-c", "print(1)"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1\n") or "1\n" in done.stdout
    assert not ran.exists(), ran.read_text()


def test_a_helper_runs_in_nsadiags_own_directory_with_it_first_on_the_path():
    started = helper_popen("nsadiag.harness.reaper", "1", drop=("NSADIAG_RUN_DIR",))
    assert started["cwd"] == PACKAGE_ROOT
    assert started["env"]["PYTHONPATH"].split(":")[0] == PACKAGE_ROOT
    assert started["args"][:3] == [sys.executable, "-m", "nsadiag.harness.reaper"]
    assert "NSADIAG_RUN_DIR" not in started["env"]


def test_a_reaper_that_cannot_start_is_one_line_naming_why(monkeypatch):
    real = launch.helper_popen
    monkeypatch.setattr(launch, "helper_popen",
                        lambda module, *args, **kw: real("nsadiag.no_such_helper", *args, **kw))
    with pytest.raises(ValueError) as raised:
        launch._Reaper()._start()
    said = str(raised.value)
    assert len(said.splitlines()) == 1
    assert said.startswith("nsadiag's reaper (the helper that ends what a command leaves "
                           "behind) did not start: ")
    assert "No module named nsadiag.no_such_helper" in said and said.endswith("(exit code 1)")


def test_failure_line_without_output_is_the_exit_status():
    assert failure_line(b"", 3) == "exit code 3"
    assert failure_line(b"", -9) == "killed by signal 9"
    assert failure_line(b"Traceback\n  x\nImportError: y\n\n", 1) == "ImportError: y (exit code 1)"
