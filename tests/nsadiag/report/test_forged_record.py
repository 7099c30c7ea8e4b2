"""A received record cannot forge its report: the top block follows the record's verdict,
never stored prose that contradicts it, and a stored string stays one line of text (no
second top block, no HTML, no script links)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import checkout_env, nsadiag


@pytest.fixture(scope="module")
def error_run(tmp_path_factory):
    """A real run that ended ERROR, its record.json as written."""
    top = tmp_path_factory.mktemp("forged")
    out = top / "run"
    (top / "fails.py").write_text("raise RuntimeError('the real error')\n")
    done = nsadiag("run", "--out", str(out), "--", sys.executable, str(top / "fails.py"),
                   env=checkout_env())
    assert done.returncode == 1, done.stderr
    assert json.loads((out / "record.json").read_text())["finding"]["culprit"]
    return out, (out / "record.json").read_text()


def _forge(out, original: str, change) -> dict:
    record = json.loads(original)
    change(record["finding"])
    (out / "record.json").write_text(json.dumps(record))
    done = nsadiag("report", str(out), env=checkout_env())
    assert done.returncode == 0, done.stderr
    return json.loads((out / "summary.json").read_text())


def test_a_healthy_headline_over_an_error_verdict_is_laid_out_as_the_error(error_run):
    out, original = error_run

    def healthy(finding):
        finding.update(verdict="OK", kind="healthy", status="healthy",
                       headline="OK (healthy)", next_action="Nothing to fix: it finished.")

    summary = _forge(out, original, healthy)
    report = (out / "report.md").read_text()
    assert report.startswith("# nsadiag run: ❌ ERROR")
    assert "Nothing to fix" not in report and "✅ OK" not in report
    assert summary["verdict"] == "ERROR" and summary["status"] == "failure"
    assert summary["exit_code"] == 1


def test_a_status_that_contradicts_the_findings_own_verdict_is_decided_again(error_run):
    out, original = error_run
    summary = _forge(out, original, lambda f: f.update(status="healthy"))
    assert summary["status"] == "failure" and summary["exit_code"] == 1
    assert (out / "report.md").read_text().startswith("# nsadiag run: ❌ ERROR")


def test_stored_strings_stay_one_line_of_text(error_run):
    out, original = error_run
    block = "\n# nsadiag run: ✅ OK (healthy)\n- **Next:** Nothing to fix"

    def prose(finding):
        finding["proof"] = "RuntimeError: the real error" + block
        finding["next_action"] = ("Fix it <script>alert(1)</script> and see "
                                  "[the docs](javascript:alert(document.cookie)) " + block)
        finding["summary"] = ["One.\n# nsadiag run: ✅ OK"]
        finding["culprit"]["why"] = "because\n\n# nsadiag run: ✅ OK"

    _forge(out, original, prose)
    report = (out / "report.md").read_text()
    titles = [line for line in report.splitlines() if line.startswith("# ")]
    assert titles == [titles[0]] and titles[0].startswith("# nsadiag run: ❌ ERROR")
    assert "<script" not in report and "&lt;script>" in report
    assert "](javascript:" not in report and "[the docs](#alert(document.cookie))" in report
    assert "- **Next:** Fix it &lt;script>alert(1)&lt;/script>" in report
