"""Every text file nsadiag writes is valid UTF-8: a lone surrogate (an undecodable byte of a
program's exception or output) becomes U+FFFD, never the raw byte."""

from __future__ import annotations

import sys

from nsadiag.rundir import valid_utf8, write_text
from tests.helpers import checkout_env, nsadiag


def test_lone_surrogates_are_written_as_the_replacement_character(tmp_path):
    path = write_text(tmp_path / "report.md", "bad \udcff byte, \ud800 alone, é kept\n")
    data = path.read_bytes()
    assert data.decode("utf-8") == "bad \ufffd byte, \ufffd alone, é kept\n"
    assert valid_utf8("plain") == b"plain"


def test_an_exception_with_an_undecodable_byte_leaves_a_valid_report(tmp_path):
    script = tmp_path / "sur.py"
    script.write_text('raise ValueError("bad " + b"\\xff".decode("utf-8", "surrogateescape") '
                      '+ " byte")\n')
    done = nsadiag("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(script),
                   env=checkout_env())
    assert done.returncode == 1, done.stderr
    for name in ("report.md", "summary.json", "record.json"):
        text = (tmp_path / "run" / name).read_bytes().decode("utf-8")  # raises if invalid
        assert "\udcff" not in text
    assert "**Proof:** ValueError: bad \ufffd byte" in \
        (tmp_path / "run" / "report.md").read_text()
