"""The command line's surface: fast help without torch, a version, choices and an example
in every command's help, parser errors in one line, trial options declared once."""

import dataclasses
import re
import subprocess
import sys

import pytest

from nsadiag.cli import app
from nsadiag.cli.options import NSA_BACKENDS, SPEC_DEFAULTS, TrialOptions, trial_options
from nsadiag.spec import TrialSpec
from tests.helpers import nsadiag

COMMANDS = ("env", "sweep-layers", "sweep-seq", "isolate-branch", "triage", "compare", "ddp",
            "run", "memory", "trace", "check", "stacks", "attach", "report", "merge")


def test_help_imports_neither_torch_nor_pandas_nor_matplotlib():
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "nsadiag.cli", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "sweep-layers" in done.stdout
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "nsadiag.cli.app" in imported
    for heavy in ("torch", "pandas", "matplotlib", "numpy", "nsa"):
        assert heavy not in imported, heavy


def test_version():
    done = nsadiag("--version")
    assert done.returncode == 0 and re.fullmatch(r"nsadiag \d+\.\d+\.\d+\n", done.stdout)


def test_every_command_is_there_with_an_example():
    names = {c.name or c.callback.__name__: c for c in app.registered_commands}
    assert set(names) == set(COMMANDS)
    for name, command in names.items():
        assert (command.epilog or "").startswith(f"Example: nsadiag {name}"), name


def test_choices_are_listed_in_help():
    text = nsadiag("sweep-layers", "--help", env={"COLUMNS": "200", "PATH": ""}).stdout
    for choices in ("float32|bfloat16", "cpu|cuda|auto", "|".join(NSA_BACKENDS)):
        assert choices in text, choices
    assert "Example: nsadiag sweep-layers" in text
    ddp = nsadiag("ddp", "--help", env={"COLUMNS": "200", "PATH": ""}).stdout
    assert "--ddp-backend" in ddp and "gloo|nccl" in ddp and "|".join(NSA_BACKENDS) in ddp


def test_the_nsa_backends_listed_are_the_built_in_models():
    from nsa.config import BACKENDS

    assert NSA_BACKENDS == BACKENDS


@pytest.mark.parametrize("args, message", [
    (["sweep-layers", "--dtype", "int8"],
     "nsadiag: error: dtype: 'int8' is not one of 'float32', 'bfloat16' "
     "(see nsadiag sweep-layers --help)"),
    (["sweep-layers", "--seq-len", "0"],
     "nsadiag: error: seq-len: input should be greater than or equal to 1 "
     "(see nsadiag sweep-layers --help)"),
    (["sweep-layers", "--no-such-option"],
     "nsadiag: error: No such option: --no-such-option (see nsadiag sweep-layers --help)"),
    (["nope"], "nsadiag: error: No such command 'nope' (see nsadiag --help)"),
    (["stacks"], "nsadiag: error: Missing argument 'pid' (see nsadiag stacks --help)"),
    (["sweep-layers", "--out", ""], "nsadiag: error: out: must name a directory, got ''"),
    (["memory", "--out", "  "], "nsadiag: error: out: must name a directory, got ''"),
])
def test_parser_and_usage_errors_are_one_line_exit_2(args, message, tmp_path):
    done = nsadiag(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == message + "\n" and done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written, not even runs/


def test_no_arguments_prints_the_help():
    done = nsadiag()
    assert done.returncode == 0 and "Usage: nsadiag" in done.stdout


def test_trial_options_default_to_the_trial_spec():
    spec = TrialOptions().spec()
    assert spec == TrialSpec().validate()
    fields = {f.name for f in dataclasses.fields(TrialSpec)}
    assert set(SPEC_DEFAULTS) == fields - {"overrides"}  # a default_factory: {}
    options = TrialOptions(set_=["dim=64", "branches_unused=1,2"], memory_cap_mb=512,
                           stall_timeout=5, budget=30)
    spec = options.spec(n_layers=3)
    assert spec.n_layers == 3 and spec.overrides == {"dim": 64, "branches_unused": (1, 2)}
    assert spec.memory_cap_bytes == 512 * 2**20 and spec.stall_timeout_s == 5.0
    with pytest.raises(ValueError, match="stall-timeout: must be > 0 seconds, got nan"):
        TrialOptions(stall_timeout=float("nan")).spec()


def test_trial_options_hand_a_command_one_object():
    @trial_options(("target", "seq_len"), seq_len=4096)
    def command(trial: TrialOptions, layers: int = 1):
        return trial, layers

    import inspect

    params = inspect.signature(command).parameters
    assert list(params) == ["layers", "target", "seq_len"]
    assert params["seq_len"].default == 4096 and params["target"].default == "nsa"
    trial, layers = command(layers=2, target="pkg.mod:make", seq_len=64)
    assert layers == 2 and (trial.target, trial.seq_len, trial.dtype) == \
        ("pkg.mod:make", 64, "float32")
    with pytest.raises(ValueError, match="no trial option 'colour'"):
        trial_options(("colour",))


def test_a_preset_shapes_the_built_in_model_and_set_overrides_its_fields():
    from nsadiag.finding.commands import shape_options
    from nsadiag.recordspec import RecordSpec
    from nsadiag.spec import PRESETS

    spec = TrialOptions(preset="tiny", set_=["w=16"]).spec()
    assert spec.overrides == {**PRESETS["tiny"], "w": 16}
    # a reproduction command gives the preset back, with only what differs from it
    assert shape_options(RecordSpec(target="nsa", overrides=spec.overrides)) == [
        "--preset", "tiny", "--set", "w=16"]
    with pytest.raises(ValueError, match="^preset: shapes the built-in target nsa only"):
        TrialOptions(target="pkg.mod:make", preset="tiny").spec()
    from nsa.config import NSAConfig

    for name, shape in PRESETS.items():  # every preset is a valid NSA configuration
        assert NSAConfig().replace(**shape).validate().dim == shape["dim"], name


@pytest.mark.parametrize("command", ["sweep-layers", "triage", "trace", "check", "memory",
                                     "ddp", "sweep-seq", "isolate-branch"])
def test_steps_and_preset_mean_the_same_in_every_command_that_runs_the_model(command):
    text = nsadiag(command, "--help", env={"COLUMNS": "200", "PATH": ""}).stdout
    assert "--steps" in text and "--preset" in text and "tiny|small|paper" in text, command


def test_a_long_plan_says_its_worst_case_before_it_starts():
    from nsadiag.plan import check_plan, sweep_plan, triage_plan

    # the defaults: 12 layer counts at 600 s each can take two hours on a CPU
    assert sweep_plan("sweep-layers", 12, TrialSpec()) == (
        "nsadiag sweep-layers: 12 trials of up to 600 s each: at worst 2.0 h (each ends at "
        "its --budget; --budget and --layers bound it)")
    assert sweep_plan("sweep-layers", 2, TrialSpec(budget_s=20.0)) is None  # short: silent
    # every check of "all", causality twice (again at a longer sequence)
    assert "5 check runs of up to 600 s" in check_plan(TrialSpec(), "all")
    assert triage_plan(10.0).startswith("nsadiag triage: at worst 10 min")
