"""What a run's reports hide is decided when the run is recorded and stored with it, so a
report re-rendered later, from a shell without the run's environment, hides the same;
values after credential-like flags, URL user information with punctuation and
credential-like keys among a traceback's locals are hidden too."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import textwrap
from pathlib import Path

from nsadiag.redact import argv_secret_values, redact, redact_obj
from nsadiag.report.dispatch import render_run
from nsadiag.rundir import TrialRecord, append_record, prepare_run_dir, release_run_dir
from nsadiag.spec import TrialSpec
from nsadiag.verdict import Verdict
from tests.helpers import evidence_of, nsadiag

WANDB = "wandbkey-5f0c1e9d2b7a"
TOKEN = "tok-77c0ffee-planted"
PASSWORD = "pw-S3cret!x"
DB_PASSWORD = "S3cret-db!pass"
LOCAL_PASS = "hunter2-local"
NONE = dict(hosts=set(), users=set(), secrets=set())


def test_flag_values_url_userinfo_and_pass_keys_are_hidden():
    hidden = {
        TOKEN: f"python train.py --token {TOKEN} --lr 3e-4",
        PASSWORD: f"python train.py --password '{PASSWORD}'",
        "abcdef12": "train.py --api-key=abcdef12",
        "qwerty99": '["python", "x.py", "--db-password", "qwerty99"]',
        "zxcvbn77": "['--hf-token', 'zxcvbn77']",
        "S3cret-db": f"DATABASE_URL=postgres://admin:{DB_PASSWORD}@db.example.com:5432/x",
        "w0rd": "mysql://root:p@ss:w0rd@10.0.0.2/db",
        "S3cret": f"connect admin:{DB_PASSWORD}@dbhost failed",
        LOCAL_PASS: f"locals: {{'pass': '{LOCAL_PASS}', 'step': 3}}",
        "hunter9": "pass = 'hunter9'",
    }
    for value, text in hidden.items():
        out = redact(text, **NONE)
        assert value not in out, (text, out)
        assert redact(out, **NONE) == out  # idempotent
    kept = ["forward pass: 3.2 s", "--tokenizer gpt2 --max-tokens 100", "python -c pass",
            "https://github.com/org/repo", "at 12:34:56", "--lr 3e-4"]
    for text in kept:
        assert redact(text, **NONE) == text, text
    data = {"argv": ["python", "x.py", "--token", TOKEN, "--lr", "1"],
            "locals": {"pass": LOCAL_PASS, "step": 3}}
    assert redact_obj(data, **NONE) == {
        "argv": ["python", "x.py", "--token", "<redacted>", "--lr", "1"],
        "locals": {"pass": "<redacted>", "step": 3}}
    assert argv_secret_values(["x", "--token", TOKEN, f"--password={PASSWORD}",
                               "--lr", "3e-4"]) == {TOKEN, PASSWORD}


def _leaky_record(run: Path) -> None:
    spec = json.loads(TrialSpec(n_layers=1, out_dir=str(run / "trial-0")).to_json())
    message = f"wandb login failed with key {WANDB}"
    evidence = {"events": [], "result": {"status": "error", "exception": {
        "type": "RuntimeError", "message": message, "traceback": f"RuntimeError: {message}"}},
        "outcome": {"exit_code": 1}}
    verdict = Verdict("ERROR", [f"the child raised RuntimeError: {message}"])
    append_record(run / "trials.jsonl",
                  TrialRecord(spec, evidence_of(spec, evidence), verdict, str(run / "trial-0"),
                              1.0))
    (run / "run.json").write_text(json.dumps({"command_name": "sweep-layers"}))


def test_a_rerender_from_a_clean_shell_hides_what_the_run_recorded(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("WANDB_API_KEY", WANDB)
    prepare_run_dir(run)  # the run is recorded here, with the key in its environment
    release_run_dir(run)
    _leaky_record(run)
    render_run(run)
    assert WANDB not in (run / "report.md").read_text()
    monkeypatch.delenv("WANDB_API_KEY")  # later, another shell
    render_run(run)
    for name in ("report.md", "summary.json"):
        assert WANDB not in (run / name).read_text(), name
    assert oct((run / "redaction.json").stat().st_mode & 0o777) == "0o600"


SCRIPT = textwrap.dedent(f"""
    import os, sys
    print("args:", " ".join(sys.argv[1:]), flush=True)
    print("key:", os.environ["WANDB_API_KEY"], flush=True)
    print("db: postgres://admin:{DB_PASSWORD}@db.example.com/x", flush=True)
    step, pass_ = 3, "{LOCAL_PASS}"
    raise RuntimeError(f"locals {{{{'pass': {{pass_!r}}, 'step': {{step}}}}}}")
""")


def test_a_run_hides_flag_values_everywhere_and_a_later_report_keeps_them_hidden(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_API_KEY": WANDB}
    done = nsadiag("run", "--stall-timeout", "60", "--out", str(out), "--", sys.executable,
                   str(script), "--token", TOKEN, "--password", PASSWORD, env=env)
    assert done.returncode == 1, done.stderr  # the script raises: ERROR
    planted = (WANDB, TOKEN, PASSWORD, DB_PASSWORD, LOCAL_PASS)
    # the command's own output passes through unchanged; nsadiag's lines hide everything
    script_lines = ("args:", "key:", "db:", "Traceback", "  ", "RuntimeError")
    printed = [line for line in (done.stdout + done.stderr).splitlines()
               if not line.startswith(script_lines)]
    assert any("watching" in line for line in printed)
    assert any(line.startswith("ERROR (crashed)") for line in printed), printed
    assert [p for p in planted if p in "\n".join(printed)] == [], printed
    for name in ("report.md", "summary.json"):
        text = (out / name).read_text()
        assert [p for p in planted if p in text] == [], name
    clean = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    again = nsadiag("report", str(out), "--bundle", env=clean)
    assert again.returncode == 0, again.stderr
    assert [p for p in planted if p in again.stdout + again.stderr] == []
    for name in ("report.md", "summary.json"):
        text = (out / name).read_text()
        assert [p for p in planted if p in text] == [], name
    (bundle,) = out.glob("*-redacted.tar.gz")
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read().decode(errors="replace")
            assert [p for p in planted if p in data] == [], member.name
    # the raw copies keep what the command printed
    assert WANDB in (out / "stdout.txt").read_text()
