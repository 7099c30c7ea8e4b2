"""Errors whose message names their cause get that cause and its fix, each tested on the
message as the library writes it; an exit with a code and no traceback is said as an exit
code, at the script's own call that exits with it."""

from __future__ import annotations

import json
import sys

import pytest

from nsadiag.finding.known_fixes import KNOWN_FIXES, fixes_for
from nsadiag.finding.trial import next_action
from nsadiag.verdict.known import KNOWN_ERRORS, explain_exception
from nsadiag.verdictfacts import VerdictFacts
from tests.helpers import checkout_env, nsadiag

MESSAGES = [
    ("RuntimeError", "unable to allocate shared memory(shm) for file </torch_4021_1_0>: No "
                     "space left on device (28)", "dataloader-shared-memory", "--shm-size"),
    ("RuntimeError", "DataLoader worker (pid 812) is killed by signal: Bus error. It is "
                     "possible that dataloader's workers are out of shared memory.",
     "dataloader-shared-memory", "/dev/shm"),
    ("torch.distributed.DistNetworkError", "The server socket has failed to listen on any "
     "local network address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: "
     "address already in use", "address-in-use", "free port"),
    ("OSError", "[Errno 24] Too many open files: '/data/shard-0013.bin'",
     "too-many-open-files", "ulimit -n"),
    ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                     "waiting 1800000ms for recv operation to complete", "collective-timeout",
     "never reached the collective"),
    ("RuntimeError", "CUDA error: device-side assert triggered", "cuda-device-assert",
     "CUDA_LAUNCH_BLOCKING=1"),
]


@pytest.mark.parametrize("kind, message, known, fix_words", MESSAGES,
                         ids=[m[2] + str(i) for i, m in enumerate(MESSAGES)])
def test_a_known_message_gets_its_cause_and_its_fix(kind, message, known, fix_words):
    explained = explain_exception(kind, message)
    assert explained is not None and explained["known"] == known
    said = next_action("ERROR", VerdictFacts.of({"exception_type": kind,
                                                 "known_error": known}), None)
    assert fix_words in said and said == fixes_for(known)[0][:1].upper() + \
        fixes_for(known)[0][1:] + "."


def test_every_known_error_has_a_fix_and_ordinary_errors_none():
    assert {name for name, _, _ in KNOWN_ERRORS} <= set(KNOWN_FIXES)
    for message in ("expected scalar type Float but found Half", "list index out of range",
                    "No space left on device: '/ckpt/model.pt'"):
        assert explain_exception("RuntimeError", message) is None, message


def test_an_exit_code_without_a_traceback_is_said_as_the_programs_own_exit(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('val loss diverged: 9.1e+03')\n"
                      "if True:\n    sys.exit(3)\n")
    out = tmp_path / "run"
    done = nsadiag("run", "--out", str(out), "--", sys.executable, str(script),
                   env=checkout_env())
    assert done.returncode == 1, done.stderr
    finding = json.loads((out / "summary.json").read_text())["finding"]
    assert finding["proof"] == ("exit code 3 with no Python exception; the last line it "
                                "printed: `val loss diverged: 9.1e+03`")
    assert finding["culprit"]["where"] == "train.py:4"
    assert finding["next_action"].startswith("The program ended itself with exit code 3 at "
                                             "train.py:4 (`sys.exit(3)`)")
    assert "exception" not in finding["next_action"].split(":")[0]
