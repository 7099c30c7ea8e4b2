"""Reports hide host names, IP addresses, user names and secret-looking values by default;
--no-redact keeps them."""

import json
import socket
import subprocess
import sys

from nsadiag.report.dispatch import render_run
from nsadiag.report.redact import redact
from nsadiag.rundir import TrialRecord, append_record
from nsadiag.spec import TrialSpec

SECRETS = {
    "host": "gpu-node-7.cluster.internal",
    "this_host": "trainbox-42",
    "ipv4": "10.12.0.7",
    "ipv6": "fe80::1ff:fe23:4567:890a",
    "user": "zed-analyst",
    "token": "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz",
    "token_value": "hf_abcdefghijklmnopqrstuvwxyz",
    "github": "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "password": "secret-pass-99",
}


def test_redact_hides_every_kind_and_keeps_ordinary_text():
    text = (f"connect to {SECRETS['host']} ({SECRETS['ipv4']}, {SECRETS['ipv6']}) from "
            f"{SECRETS['this_host']} as {SECRETS['user']} failed; {SECRETS['token']} "
            f"DB_PASSWORD={SECRETS['password']} \"GITHUB_TOKEN\": \"{SECRETS['github']}\" "
            f"ubuntu@216.81.248.67 /home/{SECRETS['user']}/train.py "
            f"/tmp/pytest-of-{SECRETS['user']}/x "
            f"root cause in c10::add at 12:34:56, torch.nn.functional, user-defined")
    out = redact(text, hosts={SECRETS["this_host"]}, users={SECRETS["user"]})
    for value in ("gpu-node-7", "trainbox", "10.12.0.7", "fe80::", "zed-analyst",
                  "hf_abc", "ghp_", "secret-pass", "216.81", "ubuntu@"):
        assert value not in out, value
    assert "<host>" in out and "<ip>" in out and "<user>" in out and "<redacted>" in out
    # ordinary words, C++ names, clock times and module paths survive
    for kept in ("root cause", "c10::add", "12:34:56", "torch.nn.functional", "user-defined",
                 "train.py"):
        assert kept in out, kept


def test_redacted_json_stays_valid_json():
    data = {"m": f"{SECRETS['token']}", "path": f"/home/{SECRETS['user']}",
            "API_KEY": "abc", "ok": "blocks.0 forward"}
    out = json.loads(redact(json.dumps(data), hosts=set(), users={SECRETS["user"]}))
    assert out == {"m": "HF_TOKEN=<redacted>", "path": "/home/<user>", "API_KEY": "<redacted>",
                   "ok": "blocks.0 forward"}


def _leaky_run(tmp_path):
    """A run directory whose one trial failed with a message that names everything."""
    message = (f"rendezvous with {SECRETS['host']}:29500 ({SECRETS['ipv4']}) from "
               f"{SECRETS['this_host']} failed for {SECRETS['user']}; {SECRETS['token']}")
    spec = json.loads(TrialSpec(n_layers=1, out_dir=str(tmp_path / "trial-0")).to_json())
    evidence = {"events": [], "event_counts": {}, "stall": None,
                "result": {"status": "error", "steps_done": 0,
                           "exception": {"type": "RuntimeError", "message": message,
                                         "traceback": f"RuntimeError: {message}"}},
                "outcome": {"exit_code": 1}}
    verdict = {"name": "ERROR", "reasons": [f"the child raised RuntimeError: {message}"],
               "facts": {}}
    append_record(tmp_path / "trials.jsonl",
                  TrialRecord(spec, evidence, verdict, str(tmp_path / "trial-0"), 1.0))
    return tmp_path


def _machine(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: SECRETS["this_host"])
    for name in ("USER", "LOGNAME"):
        monkeypatch.setenv(name, SECRETS["user"])


def test_reports_are_redacted_by_default_and_kept_with_no_redact(tmp_path, monkeypatch):
    _machine(monkeypatch)
    run = _leaky_run(tmp_path)
    render_run(run)
    for name in ("report.md", "summary.json"):
        text = (run / name).read_text()
        assert "RuntimeError" in text
        for kind in ("host", "this_host", "ipv4", "user", "token_value"):
            assert SECRETS[kind] not in text, (name, kind)
    json.loads((run / "summary.json").read_text())
    render_run(run, no_redact=True)
    text = (run / "report.md").read_text()
    for kind in ("host", "this_host", "ipv4", "user", "token"):
        assert SECRETS[kind] in text, kind


def test_report_command_no_redact_option(tmp_path):
    run = _leaky_run(tmp_path)
    kept = subprocess.run([sys.executable, "-m", "nsadiag.cli", "report", str(run),
                           "--no-redact"], capture_output=True, text=True, timeout=120)
    assert kept.returncode == 0, kept.stderr
    assert SECRETS["ipv4"] in (run / "report.md").read_text()
    hidden = subprocess.run([sys.executable, "-m", "nsadiag.cli", "report", str(run)],
                            capture_output=True, text=True, timeout=120)
    assert hidden.returncode == 0, hidden.stderr
    assert SECRETS["ipv4"] not in (run / "report.md").read_text()
