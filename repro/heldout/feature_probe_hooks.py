"""Trains a small MLP classifier while collecting intermediate
activations for a later linear-probe analysis: register_probes() attaches a
forward hook to every Linear layer, and the hook appends the layer's output to
the global FEATURES dict of lists, keyed by module name. The defect: the hook
keeps every step's full output tensor forever, never cleared and without
.detach() (so each entry also stays attached to its autograd graph);
several MB more are pinned every step until an allocation fails under the memory
limit.

Expected verdict: OOM
Run: nsadiag run -- bash -c 'ulimit -v 3000000; exec python repro/heldout/feature_probe_hooks.py'
Cause words: FEATURES | save_output | forward hook | append
Next words: detach | clear FEATURES | cpu() | bounded
"""
from collections import defaultdict

import torch
import torch.nn as nn

FEATURES = defaultdict(list)


def register_probes(model):
    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            def save_output(module, inputs, output, name=name):
                FEATURES[name].append(output)
            handles.append(mod.register_forward_hook(save_output))
    return handles


def main():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(512, 2048), nn.ReLU(),
        nn.Linear(2048, 2048), nn.ReLU(),
        nn.Linear(2048, 10),
    )
    register_probes(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100_000):
        x = torch.randn(1024, 512)
        y = torch.randint(0, 10, (1024,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            n = sum(len(v) for v in FEATURES.values())
            print(f"step {step} loss={loss.item():.4f} stored={n}", flush=True)


if __name__ == "__main__":
    main()
