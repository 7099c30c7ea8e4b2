"""Fine-tunes a small convolutional encoder, warm-starting it from a
"pretrained" checkpoint that a background thread loads while the main thread
builds the optimizer. WeightLoader.run() builds the checkpoint dict, calls
model.load_state_dict() and only then sets self.ready = True; the main thread
waits for it with a bare busy loop `while not loader.ready: pass` (no sleep,
no Event, no join). The defect: the checkpoint was saved from an encoder with
32 output channels while this model has 64, so load_state_dict() raises a
size-mismatch RuntimeError inside the loader thread; the thread dies (its
traceback is printed) before setting ready, and the main thread spins on the
flag forever, holding one CPU core at 100%.

Expected verdict: STALL-BUSY
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/pretrained_encoder_warmstart.py
Cause words: while not loader.ready | busy loop | ready flag | load_state_dict | size mismatch
Next words: threading.Event | join the loader thread | propagate the exception | Event.wait with timeout | fix the channel count
"""
import threading

import torch
import torch.nn as nn


def make_encoder(channels):
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(),
        nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10),
    )


class WeightLoader(threading.Thread):
    def __init__(self, model):
        super().__init__(name="weight-loader", daemon=True)
        self.model = model
        self.ready = False

    def run(self):
        torch.manual_seed(42)
        pretrained = make_encoder(32).state_dict()
        self.model.load_state_dict(pretrained)
        self.ready = True


def main():
    model = make_encoder(64)
    loader = WeightLoader(model)
    loader.start()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    print("waiting for pretrained weights...", flush=True)
    while not loader.ready:
        pass
    print("weights loaded, fine-tuning", flush=True)
    for step in range(30):
        x = torch.randn(16, 3, 32, 32)
        y = torch.randint(0, 10, (16,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
