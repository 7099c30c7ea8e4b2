"""Secrets in every form of tests/secret_forms.py are hidden, as text, as JSON and as a
Python repr; the ordinary text around them is kept; and a run that prints them to stdout
and stderr and raises them shares none of them: report.md, summary.json and every file of
its bundle (stdout.txt, stderr.txt, record.json, evidence.json, the processes' files)."""

from __future__ import annotations

import json
import sys
import tarfile

import pytest

from nsadiag.redact import redact, redact_obj
from nsadiag.secret_patterns import is_secret_name
from tests.helpers import nsadiag
from tests.secret_forms import FORMS, KEPT, PRINTER

NONE = dict(hosts=set(), users=set(), secrets=set())


def leaked(text: str) -> list[str]:
    return [form for form, (_, part) in FORMS.items() if part in text]


@pytest.mark.parametrize("form", FORMS)
def test_each_form_is_hidden_as_text_json_and_repr(form):
    text, part = FORMS[form]
    for written in (text, json.dumps(text), repr(text), json.dumps({"message": text})):
        out = redact(written, **NONE)
        assert part not in out, (written, out)
        assert redact(out, **NONE) == out  # idempotent
    assert part not in json.dumps(redact_obj({"lines": [text]}, **NONE))


def test_ordinary_text_is_kept():
    for text in KEPT:
        assert redact(text, **NONE) == text


def test_names_match_across_camel_snake_and_kebab_case():
    for name in ("accessToken", "access_token", "ACCESS-TOKEN", "AccessToken", "accesstoken",
                 "clientSecret", "privateKey", "APIKey", "AccountKey", "PGPASSWORD", "SSHPASS",
                 "sessionToken", "x-auth-token", "MYSQL_PWD"):
        assert is_secret_name(name), name
    for name in ("KeyError", "KeyboardInterrupt", "tokens", "max_tokens", "tokenizer", "monkey",
                 "bypass", "hotkey", "compass", "TokenizerFast", "pwd", "passes"):
        assert not is_secret_name(name), name
    assert not is_secret_name("pass", stored=False)  # "forward pass: 3.2 s"


def test_a_run_printing_every_form_shares_none(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PRINTER)
    out = tmp_path / "run"
    done = nsadiag("run", "--stall-timeout", "60", "--out", str(out), "--", sys.executable,
                   str(script))
    assert done.returncode == 1, done.stderr  # it raises: ERROR
    # nsadiag's own lines hide everything; the command's output passes through unchanged
    verdict = [line for line in (done.stdout + done.stderr).splitlines()
               if line.startswith(("ERROR", "proof:", "next:"))]
    assert verdict and leaked("\n".join(verdict)) == [], verdict
    for name in ("report.md", "summary.json"):
        assert leaked((out / name).read_text()) == [], name
    assert "RuntimeError" in (out / "report.md").read_text()
    bundled = nsadiag("report", str(out), "--bundle")
    assert bundled.returncode == 0, bundled.stderr
    assert leaked(bundled.stdout + bundled.stderr) == []
    (bundle,) = out.glob("*-redacted.tar.gz")
    seen = set()
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            if member.isfile() and not member.name.endswith(".png"):
                data = tar.extractfile(member).read().decode(errors="replace")
                assert leaked(data) == [], (member.name, leaked(data))
                seen.add(member.name.rsplit("/", 1)[-1])
    assert {"stdout.txt", "stderr.txt", "record.json", "evidence.json", "report.md"} <= seen
    # the run's raw copies keep what the command printed
    assert len(leaked((out / "stdout.txt").read_text())) == len(FORMS)


def test_host_address_and_user_forms_are_hidden():
    cases = {
        "host ip-10-0-3-17 joined": "host <host> joined",
        "ip-10-0-3-17.ec2.internal:29500": "<host>:29500",
        "curl http://0x0a000311/metrics": "curl http://<ip>/metrics",
        "dial //167772945:8080 failed": "dial //<ip>:8080 failed",
        r"C:\Users\carol\proj\train.py": r"C:\Users\<user>\proj\train.py",
        r'{"path": "C:\\Users\\carol\\x.py"}': r'{"path": "C:\\Users\\<user>\\x.py"}',
        "cp ~dave/data/x.bin .": "cp ~<user>/data/x.bin .",
    }
    for text, shown in cases.items():
        assert redact(text, **NONE) == shown, text
    for kept in ("took ~2 s", "cd ~/proj", "step 123456789 of 200000000", "x~y"):
        assert redact(kept, **NONE) == kept


def test_an_environment_secret_is_hidden_cased_encoded_and_split_over_two_lines():
    import base64

    value = "envPlanted-Value-8841"
    secrets = {"hosts": set(), "users": set(), "secrets": {value}}
    data = value.encode()
    for text in (value, value.upper(), value.lower(), base64.b64encode(data).decode(),
                 base64.urlsafe_b64encode(data).decode().rstrip("="),
                 f"token: {value[:7]}\n{value[7:]} end", f'"{value[:5]}\\n{value[5:]}"'):
        out = redact(f"logged {text} here", **secrets)
        assert "lanted" not in out.lower() and "<redacted>" in out, (text, out)
