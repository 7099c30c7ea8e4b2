"""Planted secrets of every kind — in an exception message, in the target's stdout and in
the environment — reach no shared artefact and no terminal output: report.md,
summary.json, triage.json, the CI step summary, a redacted bundle, and everything
nsadiag prints. The raw trial directories keep them (that is where they were written)."""

import json
import os
import re
import tarfile

import pytest

from tests.helpers import nsadiag
from tests.secret_targets import ENV_SECRET_NAME, ENV_SECRET_VALUE, LEAKS, PLANTED_USER

TARGET = ["--target", "tests.secret_targets:leaky", "--seq-len", "16", "--steps", "1",
          "--stall-timeout", "30"]


def planted(*args, env_extra=None):
    """nsadiag ARGS with a secret and a user name planted in its environment; (the
    process, everything it printed)."""
    env = {**os.environ, ENV_SECRET_NAME: ENV_SECRET_VALUE, "USER": PLANTED_USER,
           **(env_extra or {})}
    done = nsadiag(*args, env=env, timeout=600)
    return done, done.stdout + done.stderr


def leaks(text: str) -> list[str]:
    """The kinds of planted secret found in ``text`` (a value shorter than 8 characters as
    a whole word: a short host name like "vm" is not found inside "nvml")."""
    return [kind for kind, value in LEAKS.items()
            if (value in text if len(value) >= 8 else
                re.search(rf"(?<![\w]){re.escape(value)}(?![\w])", text))]


def test_the_leaks_check_finds_every_planted_kind():
    from tests.secret_targets import MESSAGE

    assert leaks(MESSAGE + " " + ENV_SECRET_VALUE) == list(LEAKS)
    assert leaks("nvml vmstat c10::add KeyError") == []


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted") / "sweep"
    done, printed = planted("sweep-layers", "--layers", "1", *TARGET, "--out", str(out))
    return out, done, printed


def test_a_sweep_report_summary_and_terminal_hide_every_secret(sweep_run):
    out, done, printed = sweep_run
    assert done.returncode == 1, printed  # the target raises: ERROR
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failing"]["name"] == "ERROR"
    report = (out / "report.md").read_text()
    assert "RuntimeError" in report and "<redacted>" in report and "<ip>" in report
    assert leaks(report) == [] and leaks((out / "summary.json").read_text()) == []
    assert leaks(printed) == []
    # the raw trial directory keeps what the target wrote
    raw = (out / "trial-0" / "stdout.txt").read_text()
    assert {"ipv4", "github token", "python repr pair", "environment value"} <= set(leaks(raw))


def test_the_bundle_is_redacted_and_report_no_redact_shows_the_raw_values(sweep_run):
    out, _, _ = sweep_run
    done, printed = planted("report", str(out), "--bundle")
    assert done.returncode == 0, printed
    assert leaks(printed) == []
    (bundle,) = out.glob("*-redacted.tar.gz")
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        assert any(n.endswith("/report.md") for n in names)
        assert any(n.endswith("trial-0/stdout.txt") for n in names)
        left_out = tar.extractfile(next(m for m in tar if m.name.endswith("/BUNDLE.txt")))
        # nsadiag's manifest names every file a run writes: none is taken for a foreign one
        assert "not written by nsadiag" not in left_out.read().decode()
        for member in tar.getmembers():
            if member.name.endswith(".png"):
                continue  # the plots carry axis labels and run names, no record text
            text = tar.extractfile(member).read().decode(errors="replace")
            assert leaks(text) == [], member.name
    kept, printed = planted("report", str(out), "--no-redact")
    assert kept.returncode == 0
    assert "hunter2-planted" in (out / "report.md").read_text()
    assert "hunter2-planted" in printed or "10.12.0.7" in (out / "summary.json").read_text()


def test_a_triage_in_ci_mode_hides_every_secret(tmp_path):
    out = tmp_path / "triage"
    step_summary = tmp_path / "step-summary.md"
    done, printed = planted("triage", *TARGET, "--max-layers", "1", "--no-checks",
                            "--no-isolate", "--no-bisect", "--ci", "--out", str(out),
                            env_extra={"GITHUB_STEP_SUMMARY": str(step_summary)})
    assert done.returncode == 1, printed
    for name in ("report.md", "summary.json", "triage.json"):
        assert leaks((out / name).read_text()) == [], name
    assert "RuntimeError" in step_summary.read_text()
    assert leaks(step_summary.read_text()) == []
    assert leaks(printed) == []


def test_a_check_prints_and_writes_no_secret(tmp_path):
    out = tmp_path / "check"
    done, printed = planted("check", "causality", "--target", "tests.secret_targets:leaky",
                            "--seq-len", "16", "--out", str(out))
    assert done.returncode == 1, printed
    assert "causality" in printed
    for name in ("report.md", "summary.json"):
        assert leaks((out / name).read_text()) == [], name
    assert leaks(printed) == []
