"""The parts of `python -m nsa.train` (`nsa/train.py` is the entry point): options and
their checks, the process's runtime (torchrun, device, DDP), optimizer and schedule,
checkpoints, the heartbeat, and the training loop."""
