"""Reports hide host names, IP addresses, user names and secret-looking values by default;
--no-redact keeps them."""

import json
import socket

from nsadiag.redact import redact
from nsadiag.report.dispatch import render_run
from nsadiag.rundir import TrialRecord, append_record
from nsadiag.spec import TrialSpec
from nsadiag.verdict import Verdict
from tests.helpers import evidence_of, nsadiag

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
    verdict = Verdict("ERROR", [f"the child raised RuntimeError: {message}"])
    append_record(tmp_path / "trials.jsonl",
                  TrialRecord(spec, evidence_of(spec, evidence), verdict,
                              str(tmp_path / "trial-0"), 1.0))
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
    kept = nsadiag("report", str(run), "--no-redact")
    assert kept.returncode == 0, kept.stderr
    assert SECRETS["ipv4"] in (run / "report.md").read_text()
    hidden = nsadiag("report", str(run))
    assert hidden.returncode == 0, hidden.stderr
    assert SECRETS["ipv4"] not in (run / "report.md").read_text()


def test_every_notation_of_a_secret_is_hidden_and_look_alikes_are_kept():
    hidden = {
        "fe80::1": "link-local fe80::1 up", "::1": "bind [::1]:29500",
        "2001:db8::7": "peer 2001:db8::7,", "fe80::1%eth0": "via fe80::1%eth0 ",
        "AbCd/xyz+": "aws_secret_access_key: AbCd/xyz+",
        "AbCd'": "aws_secret_access_key = 'AbCd'",
        "eyJhbGc.x.y": "Authorization: Bearer eyJhbGc.x.y",
        "dXNlcjpw": "authorization: Basic dXNlcjpw",
        "tok3nvalue1": "curl -H 'X: Bearer tok3nvalue1'",
        "hunter2": "{'db_password': 'hunter2'}",
        "hunter3": '{\\"password\\": \\"hunter3\\"}',
        "hunter4": 'config {"Api-Key": "hunter4"}',
        "q w": 'password="q w"',
        "sk-abcdefghijklmnopqrstuv": "key sk-abcdefghijklmnopqrstuv",
        "plantedvalue": "got plantedvalue back",
    }
    for value, text in hidden.items():
        out = redact(text, hosts=set(), users=set(), secrets={"plantedvalue"})
        assert value not in out, (text, out)
    kept = ["repro.per_token_loop:make", "KeyError: 'n_layers'", "c10::add(", "x[::2]",
            "at 12:34:56", "--set: expected key=value", "basic training loop",
            "tokens: 512 per step", "std::vector<int>", "c10d::ProcessGroupGloo::run"]
    for text in kept:
        assert redact(text, hosts=set(), users=set(), secrets=set()) == text, text


def test_the_bare_short_host_name_and_secret_environment_values(monkeypatch):
    from nsadiag.redact import machine_names, secret_env_values

    monkeypatch.setattr(socket, "gethostname", lambda: "trainbox-42.cluster.example.com")
    monkeypatch.setattr(socket, "getfqdn", lambda: "trainbox-42.cluster.example.com")
    hosts, _ = machine_names()
    assert "trainbox-42" in hosts and "trainbox-42.cluster.example.com" in hosts
    text = redact("on trainbox-42 and trainbox-42.cluster.example.com", users=set(),
                  secrets=set())
    assert "trainbox" not in text
    values = secret_env_values({"MY_SERVICE_TOKEN": "abcdef123", "PWD": "/work/x",
                                "SHORT_KEY": "1", "PATH": "/usr/bin"})
    assert values == {"abcdef123"}


def test_json_is_redacted_value_by_value():
    from nsadiag.redact import redact_obj

    data = {"message": 'failed: {"password": "p1"} from 10.0.0.1', "HF_TOKEN": "abc",
            "rows": [{"aws_secret_access_key": "k2"}], "n": 3}
    out = redact_obj(data, hosts=set(), users=set(), secrets=set())
    assert out == {"message": 'failed: {"password": "<redacted>"} from <ip>',
                   "HF_TOKEN": "<redacted>", "rows": [{"aws_secret_access_key": "<redacted>"}],
                   "n": 3}
