"""A size no machine of this kind can take (ten thousand ranks, a hundred thousand layer
counts, more tokens than memory) is refused with one line naming the limit and the
machine's figure, before anything starts; --no-limits lets it through."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from nsadiag import limits
from nsadiag.cli.options import TrialOptions
from nsadiag.sweep import parse_layers
from tests.helpers import REPO, nsadiag


@pytest.mark.parametrize("args, says", [
    (["ddp", "--world-size", "10000"],
     f"world-size: 10000 ranks exceed this machine's limit of {4 * limits.usable_cpus()} "
     f"(4 per usable CPU, and it has {limits.usable_cpus()})"),
    (["sweep-layers", "--layers", "1-100000"],
     "layers: 100000 values mean 100000 trials, each a process of its own; the limit is 64"),
    (["sweep-layers", "--seq-len", "99999999999999999999"],
     "seq-len: 99999999999999999999 tokens x batch 1 need at least"),
    (["triage", "--max-layers", "100000"], "max-layers: 100000 layers exceed the limit of"),
    (["memory", "--seq-len", "4000000000", "--batch", "8"], "of memory; --no-limits"),
])
def test_a_size_beyond_the_machine_is_refused_in_one_line(tmp_path, args, says):
    out = tmp_path / "run"
    # the limit is checked before anything else; a target that cannot import would stop a
    # nsadiag without limits before it launched the work, so a regression here fails safely
    done = nsadiag(*args, "--target", "no_such_module:make", "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr
    assert "--no-limits runs it anyway" in done.stderr
    assert not out.exists()


def test_the_memory_limit_names_this_machines_memory():
    with pytest.raises(ValueError) as refused:
        limits.check_tokens(10**12, 1)
    assert f"this machine has {limits.machine_memory() / 2**30:.3g} GiB of memory" in \
        str(refused.value)


def test_no_limits_lets_a_size_through():
    huge = TrialOptions(seq_len=99999999999999999999, no_limits=True)
    assert huge.spec().seq_len == 99999999999999999999
    with pytest.raises(ValueError, match="seq-len: .* need at least"):
        TrialOptions(seq_len=99999999999999999999).spec()
    many = parse_layers("1-100000")
    assert len(many) == 100000
    TrialOptions(no_limits=True).within_limits(limits.check_layer_counts, many)
    with pytest.raises(ValueError, match="limit is 64 per sweep"):
        TrialOptions().within_limits(limits.check_layer_counts, many)


def test_a_layer_range_is_not_built_when_it_is_absurd(tmp_path):
    def one_gib():  # a range read by building its list would take the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    done = subprocess.run([sys.executable, "-m", "nsadiag.cli", "sweep-layers", "--layers",
                           "1-99999999999999", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          preexec_fn=one_gib)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("nsadiag: error: layers: '1-99999999999999' names more than "
                           "1000000 layer counts\n")
