"""Public training codebases nobody here wrote, run unchanged under `nsadiag run`.

    python3 -m venv /tmp/tp
    /tmp/tp/bin/pip install torch==2.13.0 rl_zoo3==2.9.2 trl==1.16.0
    python bench/third_party.py --python /tmp/tp/bin/python --work /tmp/tp-work \
        --only rl_zoo3 trl
    python3 -m venv /tmp/chem
    /tmp/chem/bin/pip install torch==2.13.0 chemprop==2.3.1
    python bench/third_party.py --python /tmp/chem/bin/python --work /tmp/chem-work \
        --only chemprop

(and so on: each codebase's `install` says what its virtualenv holds). The codebases live
in virtualenvs of their own, installed from PyPI, without nsadiag: nsadiag, from this
project's environment, watches that interpreter (as a tool installed on its own would).
Each codebase's own command line runs as its users run it, with random weights and local
data (no download at run time); only the data and the random model a codebase reads are
made here first (--work). Every command runs --pairs times (5) plain and under
`nsadiag run`, alternately, after one unmeasured run that fills the caches (inductor's
compiled kernels, the tokenized data set) for both, on the machine as it is (--burners 2
adds two `python -c 'while True: pass'` burners). Reported, per codebase and load: the
verdicts, the whole run's wall time (the `nsadiag run` wall time is the time to the verdict),
the recompiles each run logged (TORCH_LOGS=recompiles), and the step-time overhead read
from the codebase's own throughput figure (watched over plain, less one, per pair: the
median and the range, with the load beside them). Rows measured here replace the same
rows of reports/third_party.json and the others are kept, each with the time it was
measured; reports/third_party.md is written from them all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "nsa" / "texts" / "kjv_genesis_exodus.txt"

PREPARE_TRL = """
import json, sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
text, out = Path(sys.argv[1]), Path(sys.argv[2])
lines = [line.strip() for line in text.read_text().splitlines() if line.strip()]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=512,
                                                   special_tokens=["<unk>", "<eos>"]))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>",
                               pad_token="<eos>")
fast.save_pretrained(out / "tiny-gpt2")
torch.manual_seed(0)
GPT2LMHeadModel(GPT2Config(vocab_size=len(fast), n_positions=256, n_embd=64, n_layer=2,
                           n_head=2, bos_token_id=fast.eos_token_id,
                           eos_token_id=fast.eos_token_id)).save_pretrained(out / "tiny-gpt2")
(out / "data").mkdir(parents=True, exist_ok=True)
chunks = [" ".join(lines[i:i + 4]) for i in range(0, len(lines), 4)]
(out / "data" / "train.jsonl").write_text("".join(json.dumps({"text": c}) + "\\n"
                                                  for c in chunks))
"""

PREPARE_CHEMPROP = """
import csv, random, sys
from pathlib import Path
from rdkit import Chem, RDLogger
from rdkit.Chem import Crippen
RDLogger.DisableLog("rdApp.*")
out = Path(sys.argv[2]) / "chem-data"
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
parts = ["C", "C", "C", "N", "O", "c1ccccc1", "C(=O)", "C(C)", "Cl", "F"]
logp = {}
while len(logp) < 2500:
    mol = Chem.MolFromSmiles("".join(rng.choice(parts) for _ in range(rng.randint(2, 12))))
    if mol is not None:
        logp.setdefault(Chem.MolToSmiles(mol), Crippen.MolLogP(mol))
with open(out / "logp.csv", "w", newline="") as f:
    rows = csv.writer(f)
    rows.writerow(["smiles", "logp"])
    rows.writerows(logp.items())
"""

MACE_CONFIGS, MACE_VALID_FRACTION, MACE_BATCH = 200, 0.1, 8
PREPARE_MACE = f"""
import sys
from pathlib import Path
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.io import write
out = Path(sys.argv[2]) / "mace-data"
out.mkdir(parents=True, exist_ok=True)
frames = []
for seed in range({MACE_CONFIGS}):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 1, 1)
    atoms.rattle(stdev=0.1, seed=seed)
    atoms.calc = EMT()
    atoms.info["REF_energy"] = atoms.get_potential_energy()
    atoms.arrays["REF_forces"] = atoms.get_forces()
    atoms.calc = None
    frames.append(atoms)
write(out / "train.xyz", frames, format="extxyz")
"""


def _last_float(pattern: str) -> Callable[[str], float | None]:
    def read(text: str) -> float | None:
        found = re.findall(pattern, text)
        return float(found[-1]) if found else None
    return read


@dataclass
class Codebase:
    """One codebase: what its virtualenv holds (`pip install` arguments), its command (that
    interpreter's bin/ is BIN, the work folder WORK), the seconds per step its own output
    gives and where they come from, and the script (run by that interpreter with the text
    and WORK) that makes its data and random model first."""

    name: str
    install: str
    argv: list[str]
    seconds_per_step: Callable[[str], float | None]
    step_source: str
    prepare: str | None = None


def _per_step_from_fps(text: str) -> float | None:
    fps = _last_float(r"\|\s+fps\s+\|\s+([\d.]+)")(text)
    return 1.0 / fps if fps else None


def _per_step_from_runtime(steps: int) -> Callable[[str], float | None]:
    def read(text: str) -> float | None:
        runtime = _last_float(r"'train_runtime': '([\d.]+)'")(text)
        return runtime / steps if runtime else None
    return read


def _per_step_from_last_epoch_rate(text: str) -> float | None:
    """Lightning's rich progress bar, as printed when the output is not a terminal: its last
    training epoch's rate ("Epoch 9/9 ━━━ 32/32 0:00:04 • 0:00:00 6.56it/s")."""
    rate = _last_float(r"Epoch \d+/\d+ [^\n]*?([\d.]+)it/s")(text)
    return 1.0 / rate if rate else None


def _per_step_from_epoch_stamps(steps_per_epoch: int) -> Callable[[str], float | None]:
    """MACE logs a time-stamped line at the end of each epoch ("2026-01-01 10:00:06.189 INFO:
    Epoch 0: ..."): the time from the first to the last, over the steps in between."""
    def read(text: str) -> float | None:
        stamps = [datetime.fromisoformat(s) for s in
                  re.findall(r"^(\S+ \S+) INFO: Epoch \d+:", text, re.MULTILINE)]
        if len(stamps) < 2:
            return None
        return (stamps[-1] - stamps[0]).total_seconds() / ((len(stamps) - 1) * steps_per_epoch)
    return read


def _per_step_from_loop_s(steps: int) -> Callable[[str], float | None]:
    """bench/gil_loop.py's JSON line: the timed loop's wall seconds over its steps."""
    def read(text: str) -> float | None:
        loop_s = _last_float(r'"loop_s": ([\d.]+)')(text)
        return loop_s / steps if loop_s else None
    return read


SMALL_STEPS = 400
SMALL = ["BIN/python", str(ROOT / "bench" / "gil_loop.py"), str(SMALL_STEPS)]
SMALL_STEP = (f"the timed loop's wall time (loop_s) over its {SMALL_STEPS} steps (the compiled "
              "model's compile and first eight steps come before that loop)")
TRL_STEPS = 150
TRL_INSTALL = "torch==2.13.0 rl_zoo3==2.9.2 trl==1.16.0"
TRL = ["BIN/trl", "sft", "--model_name_or_path", "WORK/tiny-gpt2", "--dataset_name",
       "WORK/data", "--output_dir", "WORK/trl-out", "--max_steps", str(TRL_STEPS),
       "--per_device_train_batch_size", "4", "--max_length", "128", "--report_to", "none",
       "--logging_steps", "50", "--save_strategy", "no", "--use_cpu", "True",
       "--dataloader_num_workers", "0", "--seed", "0"]
TRL_STEP = "the Trainer's train_runtime over its --max_steps (in the command)"
# drop_last: MACE trains on the configurations left after the validation split, whole batches
MACE_STEPS_PER_EPOCH = (MACE_CONFIGS - int(MACE_VALID_FRACTION * MACE_CONFIGS)) // MACE_BATCH
CODEBASES = [
    Codebase("small modules (64 blocks of Linear, LayerNorm, GELU; bench/gil_loop.py)",
             "torch==2.13.0", SMALL, _per_step_from_loop_s(SMALL_STEPS), SMALL_STEP),
    Codebase("small modules, torch.compile (inductor)", "torch==2.13.0", [*SMALL, "--compile"],
             _per_step_from_loop_s(SMALL_STEPS), SMALL_STEP),
    Codebase("rl_zoo3 train (stable-baselines3 PPO, CartPole)", TRL_INSTALL,
             ["BIN/python", "-m", "rl_zoo3.train", "--algo", "ppo", "--env", "CartPole-v1",
              "-n", "2048", "--device", "cpu", "--eval-freq", "-1", "--seed", "0", "-f",
              "WORK/rl-logs"], _per_step_from_fps, "SB3's fps"),
    Codebase("trl sft (transformers Trainer, GPT-2 2x64)", TRL_INSTALL, TRL,
             _per_step_from_runtime(TRL_STEPS), TRL_STEP, PREPARE_TRL),
    Codebase("trl sft --torch_compile (inductor)", TRL_INSTALL, [*TRL, "--torch_compile", "True"],
             _per_step_from_runtime(TRL_STEPS), TRL_STEP, PREPARE_TRL),
    Codebase("chemprop train (Lightning Trainer, D-MPNN)", "torch==2.13.0 chemprop==2.3.1",
             ["BIN/chemprop", "train", "-i", "WORK/chem-data/logp.csv", "-s", "smiles",
              "--target-columns", "logp", "-t", "regression", "-o", "OUT",
              "--epochs", "10", "-n", "0", "--accelerator", "cpu", "--devices", "1",
              "--data-seed", "0", "--pytorch-seed", "0"],
             _per_step_from_last_epoch_rate, "Lightning's it/s over the last epoch",
             PREPARE_CHEMPROP),
    Codebase("mace_run_train (MACE potential, e3nn)", "torch==2.13.0 mace-torch==0.3.16",
             ["BIN/mace_run_train", "--name", "mace", "--train_file", "WORK/mace-data/train.xyz",
              "--valid_fraction", str(MACE_VALID_FRACTION), "--E0s", "average", "--model",
              "MACE", "--hidden_irreps", "16x0e+16x1o", "--r_max", "4.0",
              "--num_interactions", "2", "--batch_size", str(MACE_BATCH), "--max_num_epochs",
              "25", "--device", "cpu", "--default_dtype", "float32", "--energy_key",
              "REF_energy", "--forces_key", "REF_forces", "--seed", "0", "--work_dir",
              "OUT"], _per_step_from_epoch_stamps(MACE_STEPS_PER_EPOCH),
             f"MACE's epoch time stamps over {MACE_STEPS_PER_EPOCH} steps an epoch (with the "
             "epoch's validation)", PREPARE_MACE),
]


READING = (
    "Reading the overhead: the rows with one pair were measured on 2026-11-26 and 27, "
    "before the block hooks only counted and before runs were paired five times. The "
    "quiet rows with more pairs were measured on 2026-11-28 and 29 on a machine otherwise "
    "near idle (load 0.3 to 1.6 on 2 CPUs), after the memory marks found their caller at "
    "the depth they found it at before, their readings kept to 0.3 % of the wall time and "
    "a large profile was written less often (docs/observer.md, \"Marks that jump to their "
    "frame\"): small modules eager and compiled (10 pairs each, 23:39-23:44 UTC), trl sft "
    "--torch_compile (5 pairs, 23:49-23:52), trl sft (10 pairs, 23:54-23:59) and chemprop "
    "(3 epochs, 10 pairs, 23:59-00:03); every watched run was OK with the plain runs' "
    "recompiles (none). The same rows before that change (21:03-21:12 UTC, 5 pairs each): "
    "small modules +3.7 % eager and +6.4 % compiled, trl sft +4.9 %, --torch_compile "
    "+2.2 %, chemprop +1.3 %; before the work counters stopped hooking parameters' "
    "AccumulateGrad nodes (18:13-18:24 UTC): +9.1 %, +11.5 %, -2.9 %, +5.4 %, +1.6 %; "
    "before the memory marks and phase starts were bounded (12:27-13:03 UTC): +29.6 %, "
    "+25.0 %, +5.4 %, +5.3 %, +6.1 %. A single pair can stray far from the median, so a "
    "change of a few percent is not resolved by five pairs: five pairs of trl sft and of "
    "chemprop run just before the ten in the table gave +8.0 % (-2.3 to +9.9) and +6.3 % "
    "(+4.3 to +35.1), and chemprop's steps, plain and watched alike, took 47 to 52 ms in "
    "some runs against 37 to 41 ms in the others. The compiled small-modules loop over "
    "2,000 steps, in 19 random-order rounds of plain and `nsadiag run` before and after the "
    "change, gave 1.048 and 1.019 of plain (medians; the loops' counters were also read "
    "less often then, taken back since), and timed inside one process nsadiag's calls took "
    "3.6 % of that loop's wall time before and 2.5 % after. The Trainer's train_runtime "
    "covers its first step, so for `--torch_compile` it holds Dynamo's tracing of the "
    "model, which traces nsadiag's (empty) hooks as well: a compile-time cost, not a "
    "step-time one (the steady compiled step: `reports/bench_overhead.md`). Not in the "
    "table: litgpt 0.5.13 (`litgpt pretrain`): it pins huggingface-hub<1.4, which trl's "
    "transformers 5 cannot import, and in a virtualenv of its own its compiled "
    "pretraining did not reach a logged iteration within five minutes here.")


CHEMPROP_WARMUP_EPOCHS = 2
"""chemprop train's default --warmup-epochs: it refuses --epochs not above it."""


def with_lengths(codebase: Codebase, trl_steps: int | None, chemprop_epochs: int | None
                 ) -> Codebase:
    """``codebase`` with the trl runs' --max_steps and chemprop's --epochs as given (None:
    as in CODEBASES), to fit a measurement into the time a quiet machine is available."""
    argv = list(codebase.argv)
    per_step = codebase.seconds_per_step
    if trl_steps is not None and "--max_steps" in argv:
        argv[argv.index("--max_steps") + 1] = str(trl_steps)
        per_step = _per_step_from_runtime(trl_steps)
    if chemprop_epochs is not None and codebase.name.startswith("chemprop"):
        argv[argv.index("--epochs") + 1] = str(chemprop_epochs)
    return replace(codebase, argv=argv, seconds_per_step=per_step)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run(argv: list[str], watched: bool, work: Path, tag: str) -> dict:
    env = {**os.environ, "TORCH_LOGS": "recompiles", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache")}  # this run's own
    run_dir = work / "runs" / tag
    command = ([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(run_dir), "--",
                *argv] if watched else argv)
    before, started = load_average(), time.monotonic()
    # a session of its own, as `nsadiag run` gives the command: the scheduler shares the
    # CPU between sessions (autogroups), so a plain run left in this one would get less
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work,
                          timeout=3600, start_new_session=True)
    found = {"returncode": done.returncode, "wall_s": round(time.monotonic() - started, 1),
             "load": [before, load_average()]}
    output = done.stdout + done.stderr
    if watched:
        summary = json.loads((run_dir / "summary.json").read_text())
        output = ((run_dir / "stdout.txt").read_text(errors="replace")
                  + (run_dir / "stderr.txt").read_text(errors="replace"))
        found.update(verdict=summary["verdict"], headline=summary["headline"])
    found.update(recompiles=output.count("Recompiling function"), output=output)
    return found


def measure(codebase: Codebase, python: Path, work: Path, burners: int, pairs: int) -> dict:
    tag = re.sub(r"\W+", "-", codebase.name)[:40] + f"-b{burners}"

    def command(run_tag: str) -> list[str]:  # OUT: a folder of the run's own
        return [a.replace("BIN", str(python.parent)).replace("WORK", str(work))
                .replace("OUT", str(work / "out" / run_tag)) for a in codebase.argv]

    run(command(tag + "-warm-up"), False, work, tag + "-warm-up")  # caches fall on neither
    spawned = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(burners)]
    measured_pairs = []
    try:
        for pair in range(pairs):  # alternated: the machine's drift falls on both alike
            plain = run(command(f"{tag}-plain-{pair}"), False, work, f"{tag}-plain-{pair}")
            watched = run(command(f"{tag}-watched-{pair}"), True, work,
                          f"{tag}-watched-{pair}")
            per_step = [codebase.seconds_per_step(r["output"]) for r in (plain, watched)]
            for r in (plain, watched):
                r["tail"] = r.pop("output")[-600:]
            overhead = (per_step[1] / per_step[0] - 1) if all(per_step) else None
            measured_pairs.append({"plain": plain, "watched": watched, "step_s": per_step,
                                   "overhead": overhead})
            print(f"  pair {pair}: step {per_step}, overhead {overhead}, verdict "
                  f"{watched.get('verdict')}, load {plain['load'][0]:.1f}", flush=True)
    finally:
        for burner in spawned:
            burner.kill()
            burner.wait()
    known = [p["overhead"] for p in measured_pairs if p["overhead"] is not None]
    measured = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"codebase": codebase.name, "burners": burners, "command": command(tag + "-plain-0"),
            "python": str(python), "measured": measured, "pairs": measured_pairs,
            "overhead": statistics.median(known) if known else None}


def pairs_of(row: dict) -> list[dict]:
    """A row's pairs (a row measured before pairs were kept holds one, at its top level)."""
    if "pairs" in row:
        return row["pairs"]
    return [{key: row[key] for key in ("plain", "watched", "step_s", "overhead")}]


def merged(kept: list[dict], measured: list[dict]) -> list[dict]:
    """The rows of `kept` that `measured` does not measure again, and `measured`, in the
    order of CODEBASES (a codebase no longer there is dropped)."""
    by_key = {(r["codebase"], r["burners"]): r for r in [*kept, *measured]}
    order = [c.name for c in CODEBASES]
    return sorted((r for r in by_key.values() if r["codebase"] in order),
                  key=lambda r: (order.index(r["codebase"]), r["burners"]))


def markdown(rows: list[dict]) -> str:
    codebases = {c.name: c for c in CODEBASES}
    lines = ["# Public training codebases under `nsadiag run`", "",
             "Each codebase installed from PyPI into a virtualenv of its own (torch 2.13.0 CPU; "
             "what else each holds is listed under the table), without nsadiag, and run by its "
             "own command line, unchanged, with random weights and local data; nsadiag watches "
             "that interpreter from this project's environment. Written by "
             "`bench/third_party.py`; TORCH_LOGS=recompiles in every run; the step time is the "
             "codebase's own figure (listed under the table). Each row's runs alternate, plain "
             "then watched, after one unmeasured run; the overhead is the median over the "
             "pairs of watched over plain, less one, with the range beside it; the whole run's "
             "wall time includes nsadiag's start and its report.", "",
             "| codebase | load | pairs | verdicts | step plain / watched (medians) | overhead "
             "(median) | range | whole run plain / watched (medians) | recompiles plain / "
             "watched | 1-min load | measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pairs = pairs_of(r)
        steps = [statistics.median(p["step_s"][i] for p in pairs) if
                 all(p["step_s"][i] for p in pairs) else None for i in (0, 1)]
        step = " / ".join("-" if s is None else f"{s * 1e3:.1f} ms" for s in steps)
        known = [p["overhead"] for p in pairs if p["overhead"] is not None]
        overhead = "-" if r["overhead"] is None else f"{r['overhead']:+.1%}"
        spread = f"{min(known):+.1%} to {max(known):+.1%}" if known else "-"
        walls = " / ".join(f"{statistics.median(p[side]['wall_s'] for p in pairs):.1f} s"
                           for side in ("plain", "watched"))
        verdicts = ", ".join(f"{n} {v}" for v, n in Counter(
            str(p["watched"].get("verdict")) for p in pairs).items())
        recompiles = " / ".join(",".join(sorted({str(p[side]["recompiles"]) for p in pairs}))
                                for side in ("plain", "watched"))
        loads = [x for p in pairs for side in ("plain", "watched") for x in p[side]["load"]]
        load = "quiet" if not r["burners"] else f"{r['burners']} burners"
        lines.append(f"| {r['codebase']} | {load} | {len(pairs)} | {verdicts} | {step} | "
                     f"{overhead} | {spread} | {walls} | {recompiles} | "
                     f"{min(loads):.1f}-{max(loads):.1f} | {r['measured']} |")
    lines += ["", "Headlines:", ""]
    lines += [f"- {r['codebase']}, {r['burners']} burner(s): "
              f"{pairs_of(r)[-1]['watched'].get('headline')}" for r in rows]
    lines += ["", READING, "", "Each codebase: its virtualenv (`pip install` arguments; BIN is "
              "its bin/, WORK the work folder), its step time, its command:", ""]
    for name in dict.fromkeys(r["codebase"] for r in rows):
        first = next(r for r in rows if r["codebase"] == name)
        lines.append(f"- {name}: `pip install {codebases[name].install}`; step: "
                     f"{codebases[name].step_source}; `{' '.join(first['command'])}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # burners go in `finally`
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, required=True,
                        help="the interpreter of the codebases' virtualenv")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None, help="codebase name prefixes")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "third_party")
    parser.add_argument("--burners", nargs="+", type=int, default=[0])
    parser.add_argument("--pairs", type=int, default=5,
                        help="alternated plain and watched runs per codebase and load")
    parser.add_argument("--trl-steps", type=int, default=None,
                        help=f"the trl runs' --max_steps (default {TRL_STEPS})")
    parser.add_argument("--chemprop-epochs", type=int, default=None,
                        help="chemprop's --epochs (default 10; its step time is its last "
                             "epoch's)")
    args = parser.parse_args()
    if args.chemprop_epochs is not None and args.chemprop_epochs <= CHEMPROP_WARMUP_EPOCHS:
        parser.error(f"--chemprop-epochs must be above chemprop's {CHEMPROP_WARMUP_EPOCHS} "
                     f"warm-up epochs (chemprop refuses fewer)")
    args.work.mkdir(parents=True, exist_ok=True)
    chosen = [with_lengths(c, args.trl_steps, args.chemprop_epochs) for c in CODEBASES
              if not args.only or any(c.name.startswith(p) for p in args.only)]
    for prepare in dict.fromkeys(c.prepare for c in chosen if c.prepare):
        subprocess.run([str(args.python), "-c", prepare, str(TEXT), str(args.work)],
                       check=True, capture_output=True, timeout=600)
    saved = args.out.with_suffix(".json")
    kept = json.loads(saved.read_text()) if saved.exists() else []
    rows = []
    for codebase in chosen:
        for burners in args.burners:
            rows.append(measure(codebase, args.python, args.work, burners, args.pairs))
            print(f"{codebase.name} ({burners} burners): median overhead "
                  f"{rows[-1]['overhead']}", flush=True)
            saved.write_text(json.dumps(merged(kept, rows), indent=1))
    report = markdown(merged(kept, rows))
    args.out.with_suffix(".md").write_text(report)
    print(report)
    known = [r["overhead"] for r in rows if r["overhead"] is not None]
    if known:
        print(f"median overhead of the rows measured now {statistics.median(known):+.1%}")

if __name__ == "__main__":
    main()
