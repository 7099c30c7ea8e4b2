"""Public training codebases nobody here wrote, run unchanged under `nsadiag run`.

    python3 -m venv /tmp/tp
    /tmp/tp/bin/pip install torch==2.13.0 rl_zoo3==2.9.2 trl==1.16.0
    python bench/third_party.py --python /tmp/tp/bin/python --work /tmp/tp-work

The codebases live in a virtualenv of their own, installed from PyPI, without nsadiag:
nsadiag, from this project's environment, watches that interpreter (as a tool installed on
its own would). Each codebase's own command line runs as its users run it, with random
weights and local data (no download at run time); only the data and the random model a
codebase reads are made here first (--work). Every command runs four times: plain and under
`nsadiag run`, on the machine as it is and with two `python -c 'while True: pass'`
burners, after one unmeasured run that fills the caches (inductor's compiled kernels, the
tokenized data set) for both. Reported, per codebase and load: the verdict, the time to
the verdict (the `nsadiag run` wall time), the recompiles each run logged
(TORCH_LOGS=recompiles), and the step-time overhead read from the codebase's own
throughput figure (watched over plain, less one; one pair, on a shared machine: read it
with the load beside it). Writes reports/third_party.md and .json.
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
from collections.abc import Callable
from dataclasses import dataclass
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


def _last_float(pattern: str) -> Callable[[str], float | None]:
    def read(text: str) -> float | None:
        found = re.findall(pattern, text)
        return float(found[-1]) if found else None
    return read


@dataclass
class Codebase:
    """One codebase: its command (the other interpreter's bin/ is BIN, the work folder
    WORK), what it needs made first, and the seconds per step its own output gives."""

    name: str
    argv: list[str]
    seconds_per_step: Callable[[str], float | None]
    prepare: str | None = None


def _per_step_from_fps(text: str) -> float | None:
    fps = _last_float(r"\|\s+fps\s+\|\s+([\d.]+)")(text)
    return 1.0 / fps if fps else None


def _per_step_from_runtime(steps: int) -> Callable[[str], float | None]:
    def read(text: str) -> float | None:
        runtime = _last_float(r"'train_runtime': '([\d.]+)'")(text)
        return runtime / steps if runtime else None
    return read


TRL_STEPS = 150
TRL = ["BIN/trl", "sft", "--model_name_or_path", "WORK/tiny-gpt2", "--dataset_name",
       "WORK/data", "--output_dir", "WORK/trl-out", "--max_steps", str(TRL_STEPS),
       "--per_device_train_batch_size", "4", "--max_length", "128", "--report_to", "none",
       "--logging_steps", "50", "--save_strategy", "no", "--use_cpu", "True",
       "--dataloader_num_workers", "0", "--seed", "0"]
CODEBASES = [
    Codebase("rl_zoo3 train (stable-baselines3 PPO, CartPole)",
             ["BIN/python", "-m", "rl_zoo3.train", "--algo", "ppo", "--env", "CartPole-v1",
              "-n", "2048", "--device", "cpu", "--eval-freq", "-1", "--seed", "0", "-f",
              "WORK/rl-logs"], _per_step_from_fps),
    Codebase("trl sft (transformers Trainer, GPT-2 2x64)", TRL,
             _per_step_from_runtime(TRL_STEPS), PREPARE_TRL),
    Codebase("trl sft --torch_compile (inductor)", [*TRL, "--torch_compile", "True"],
             _per_step_from_runtime(TRL_STEPS), PREPARE_TRL),
]


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


def measure(codebase: Codebase, python: Path, work: Path, burners: int) -> dict:
    bin_dir = str(python.parent)
    argv = [a.replace("BIN", bin_dir).replace("WORK", str(work)) for a in codebase.argv]
    tag = re.sub(r"\W+", "-", codebase.name)[:40] + f"-b{burners}"
    run(argv, False, work, tag + "-warm-up")  # caches (inductor, datasets) fall on neither
    spawned = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(burners)]
    try:
        plain = run(argv, False, work, tag + "-plain")
        watched = run(argv, True, work, tag + "-watched")
    finally:
        for burner in spawned:
            burner.kill()
            burner.wait()
    per_step = [codebase.seconds_per_step(r["output"]) for r in (plain, watched)]
    overhead = (per_step[1] / per_step[0] - 1) if all(per_step) else None
    for r in (plain, watched):
        r["tail"] = r.pop("output")[-600:]
    return {"codebase": codebase.name, "burners": burners, "command": argv, "plain": plain,
            "watched": watched, "step_s": per_step, "overhead": overhead}


def markdown(rows: list[dict], python: Path) -> str:
    lines = ["# Public training codebases under `nsadiag run`", "",
             "Each codebase installed from PyPI into its own virtualenv "
             f"(`{python}`: torch 2.13.0 CPU, rl_zoo3 2.9.2 with stable-baselines3, trl 1.16.0 "
             "with transformers), without nsadiag, and run by its own command line, unchanged, "
             "with random weights and local data; nsadiag watches that interpreter from this "
             "project's environment. Written by `bench/third_party.py`; TORCH_LOGS=recompiles "
             "in every run; the step time is the codebase's own figure (SB3's fps, the "
             "Trainer's train_runtime over its steps); one plain and one watched run per row, "
             "so the overhead moves with the load beside it.", "",
             "| codebase | load | verdict | time to verdict | recompiles plain / watched | "
             "step plain / watched | overhead | 1-min load (plain, watched) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = " / ".join("-" if s is None else f"{s * 1e3:.1f} ms" for s in r["step_s"])
        overhead = "-" if r["overhead"] is None else f"{r['overhead']:+.1%}"
        load = "quiet" if not r["burners"] else f"{r['burners']} burners"
        lines.append(f"| {r['codebase']} | {load} | {r['watched'].get('verdict')} | "
                     f"{r['watched']['wall_s']:.0f} s | {r['plain']['recompiles']} / "
                     f"{r['watched']['recompiles']} | {step} | {overhead} | "
                     f"{r['plain']['load'][0]:.1f}, {r['watched']['load'][0]:.1f} |")
    lines += ["", "Headlines:", ""]
    lines += [f"- {r['codebase']}, {r['burners']} burner(s): {r['watched'].get('headline')}"
              for r in rows]
    lines += ["", "Reading the overhead: the Trainer's train_runtime covers its first step, so "
              "for `--torch_compile` it holds Dynamo's tracing of the model, which traces "
              "nsadiag's (empty) hooks as well: a compile-time cost, not a step-time one (the "
              "steady compiled step costs +1.2 % CPU time, `reports/bench_overhead.md`). Not in "
              "the table: litgpt 0.5.13 (`litgpt pretrain`): it pins huggingface-hub<1.4, which "
              "trl's transformers 5 cannot import, and in a virtualenv of its own its compiled "
              "pretraining did not reach a logged iteration within five minutes here.", "",
              "Commands (BIN is the codebase's virtualenv, WORK the work folder):", ""]
    seen = set()
    for r in rows:
        if r["codebase"] not in seen:
            seen.add(r["codebase"])
            lines.append(f"- {r['codebase']}: `{' '.join(r['command'])}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # burners go in `finally`
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, required=True,
                        help="the interpreter of the codebases' virtualenv")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None, help="codebase name prefixes")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "third_party")
    parser.add_argument("--burners", nargs="+", type=int, default=[0, 2])
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    chosen = [c for c in CODEBASES if not args.only or
              any(c.name.startswith(p) for p in args.only)]
    for prepare in dict.fromkeys(c.prepare for c in chosen if c.prepare):
        subprocess.run([str(args.python), "-c", prepare, str(TEXT), str(args.work)],
                       check=True, capture_output=True, timeout=600)
    rows = []
    for codebase in chosen:
        for burners in args.burners:
            rows.append(measure(codebase, args.python, args.work, burners))
            r = rows[-1]
            print(f"{codebase.name} ({burners} burners): {r['watched'].get('verdict')} in "
                  f"{r['watched']['wall_s']:.0f} s, recompiles {r['plain']['recompiles']}/"
                  f"{r['watched']['recompiles']}, overhead {r['overhead']}", flush=True)
            args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    args.out.with_suffix(".md").write_text(markdown(rows, args.python))
    print(markdown(rows, args.python))
    if rows:
        known = [r["overhead"] for r in rows if r["overhead"] is not None]
        print(f"median overhead {statistics.median(known):+.1%}" if known else "")


if __name__ == "__main__":
    main()
