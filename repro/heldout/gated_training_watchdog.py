"""Training loop gated by a health watchdog: a background thread,
health_watchdog(), checks the environment (free disk space for checkpoints,
a sane config) and then sets the threading.Event `healthy`; the trainer runs
one warm-up step and then, before each epoch, waits on healthy.wait() so it
only continues once the watchdog has signed off. The defect: the watchdog
thread crashes early with a KeyError (it reads the missing config key
"ckpt_dir"), the exception only kills that thread, healthy.set() is never
called, and the trainer waits on healthy.wait() with no timeout forever.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/gated_training_watchdog.py
Cause words: healthy.wait | health_watchdog | ckpt_dir | KeyError
Next words: timeout | is_alive | ckpt_dir | propagate the exception
"""
import shutil
import threading
import time

import torch
import torch.nn as nn

CONFIG = {"checkpoint_dir": "/tmp", "min_free_gb": 0.1, "epochs": 5}
healthy = threading.Event()


def health_watchdog(cfg):
    time.sleep(0.2)
    free_gb = shutil.disk_usage(cfg["ckpt_dir"]).free / 2**30
    if free_gb < cfg["min_free_gb"]:
        raise RuntimeError(f"only {free_gb:.1f} GB free")
    healthy.set()


def run_epoch(model, opt, epoch):
    for step in range(50):
        x = torch.randn(128, 16)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss={loss.item():.4f}", flush=True)


def main():
    threading.Thread(target=health_watchdog, args=(CONFIG,), name="watchdog", daemon=True).start()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run_epoch(model, opt, "warmup")
    for epoch in range(CONFIG["epochs"]):
        healthy.wait()
        run_epoch(model, opt, epoch)
    print("training finished")


if __name__ == "__main__":
    main()
