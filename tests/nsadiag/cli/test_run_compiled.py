"""`nsadiag run` does not change how a model compiles: eager, ``torch.compile(model)``,
``model.compile()``, a model with a graph break in every block, and a compiled training
step that calls backward and the optimizer, trained under nsadiag, are compiled exactly as
often as without it (Dynamo's own counters: frames, graphs, graph breaks; and its log of
recompiles, TORCH_LOGS=recompiles), compute the same losses and print the same on stdout
and stderr.

The backend is aot_eager: the guards and recompiles in question are Dynamo's, the same for
every backend, and it spares the test a C++ compiler (bench/bench_overhead.py measures
inductor)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

from tests.helpers import nsadiag

SCRIPT = textwrap.dedent("""
    import torch
    import torch._dynamo
    from torch import nn
    from torch._dynamo.utils import counters

    class Block(nn.Module):
        def __init__(self, graph_break):
            super().__init__()
            self.mlp, self.graph_break = nn.Linear(16, 16), graph_break

        def forward(self, x):
            x = x + torch.tanh(self.mlp(x))
            if self.graph_break:
                torch._dynamo.graph_break()
            return x * 0.5

    class Net(nn.Module):
        def __init__(self, graph_break=False):
            super().__init__()
            self.blocks = nn.ModuleList(Block(graph_break) for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x.pow(2).mean()

    def train(mode):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = Net(graph_break=mode == "graph-break")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if mode in ("compiled", "graph-break"):
            model = torch.compile(model, backend="aot_eager")
        elif mode == "in-place":
            model.compile(backend="aot_eager")

        def step(x):
            loss = model(x)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        if mode == "compiled-step":
            step = torch.compile(step, backend="aot_eager")
        losses = [f"{step(torch.randn(4, 16)).item():.6f}" for _ in range(4)]
        seen = {"graphs": counters["stats"]["unique_graphs"],
                "graph_breaks": sum(counters["graph_break"].values())}
        print(mode, " ".join(losses), sorted(seen.items()), flush=True)
        print("frames", mode, dict(counters["frames"]), flush=True)

    for mode in ("eager", "compiled", "in-place", "graph-break", "compiled-step"):
        train(mode)
    """)


def _unstamped(stderr: str) -> str:
    """stderr without the time and process id of torch's log lines"""
    return re.sub(r"^([DIWEV])\d{4} [\d:.]+ \d+ ", r"\1 ", stderr, flags=re.M)


def _counts(stdout: str) -> tuple[list[str], dict[str, dict[str, int]]]:
    """(the lines of losses, graphs, graph breaks and recompiles; {mode: Dynamo's frame
    counts})"""
    lines = stdout.splitlines()
    frames = {line.split()[1]: eval(line.split(" ", 2)[2]) for line in lines  # noqa: S307
              if line.startswith("frames ")}
    return [line for line in lines if not line.startswith("frames ")], frames


def test_models_compile_as_often_under_nsadiag_as_without(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TORCH_LOGS": "recompiles"}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path, env=env)
    assert plain.returncode == 0, plain.stderr
    lines, frames = _counts(plain.stdout)
    assert [line.split()[0] for line in lines] == [
        "eager", "compiled", "in-place", "graph-break", "compiled-step"]
    assert "('graphs', 0)" in lines[0] and "('graphs', 1)" in lines[1]  # the counters count
    assert "('graph_breaks', 0)" in lines[1] and "('graph_breaks', 0)" not in lines[3]
    # the second block's forward recompiles (a guard on the module) when it graph-breaks
    assert plain.stderr.count("Recompiling function forward") == 1, plain.stderr
    out = tmp_path / "run"
    watched = nsadiag("run", "--out", str(out), "--", sys.executable, str(script),
                      cwd=tmp_path, env=env)
    assert watched.returncode == 0, watched.stderr
    watched_lines, watched_frames = _counts((out / "stdout.txt").read_text())
    assert watched_lines == lines
    assert _unstamped((out / "stderr.txt").read_text()) == _unstamped(plain.stderr)  # recompiles
    # every frame Dynamo compiled or skipped, but one: in a compiled training step, the
    # frame after the optimizer's graph break runs no op; without nsadiag Dynamo skips
    # it, and under nsadiag compiles it to nothing, since the optimizer's post-hook asked
    # torch.compiler.is_compiling() (its graphs, graph breaks and recompiles are the same)
    step = frames.pop("compiled-step")
    assert watched_frames.pop("compiled-step") == {"total": step["total"] - 1,
                                                   "ok": step["ok"] - 1}
    assert watched_frames == frames
    evidence = json.loads((out / "evidence.json").read_text())
    main = next(p for p in evidence["processes"] if p["name"] == evidence["main_process"])
    assert main["events"]["step"] == 4 * 4  # the optimizer steps of the modes that run it
    # the first model trained is the one watched: its blocks entered at each of 4 steps,
    # in aggregated module events
    enters = sum(event.get("edges", 1) for path in out.glob("proc-*/events.jsonl")
                 for event in map(json.loads, path.read_text().splitlines())
                 if event["kind"] == "module")
    assert main["events"]["module"] >= 1 and enters == 4 * 2
