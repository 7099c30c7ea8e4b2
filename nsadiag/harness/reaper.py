"""The reaper: ``python -m nsadiag.harness.reaper OWNER_PID``, started by
nsadiag.harness.launch, kills what nsadiag launched once nsadiag is gone.

It forks at once and its first process exits, so the reaper is not a child of the owner.
Its stdin is the read end of a pipe whose only write end is in the owner (the nsadiag
process). Lines on it:

    token <token>   a job's token: every process whose environment holds
                    NSADIAG_OWNER=<token> belongs to the owner
    tree <pid>      a job's launcher: its descendants are recorded every WATCH_POLL_S
    done <token>    that job's processes were killed by the owner: forget it
    cgroup <path>   a job's cgroup (nsadiag.harness.cgroup): killed whole, then removed

End of file means the owner has exited or died (``kill -9`` included). Then every
process carrying a token not yet done and every recorded process still alive (same pid,
same start time) is frozen (SIGSTOP), the look is repeated until it finds no new one,
all are SIGKILLed, and the reaper exits. It never kills a process it was not told about.
"""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path

import psutil

from nsadiag.harness.cgroup import JobGroup
from nsadiag.harness.launch import alive, freeze_and_kill, token_carriers, wait_gone
from nsadiag.spec import WATCH_POLL_S


class Reaper:
    """The reaper's state: live tokens, launcher pids, recorded descendants."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.trees: dict[int, psutil.Process] = {}
        self.recorded: dict[int, psutil.Process] = {}
        self.groups: set[str] = set()

    def take(self, line: str) -> None:
        word, _, value = line.strip().partition(" ")
        if word == "token" and value:
            self.tokens.add(value)
        elif word == "cgroup" and value:
            self.groups.add(value)
        elif word == "done":
            self.tokens.discard(value)
            self.groups = {g for g in self.groups if os.path.isdir(g)}
            self.trees = {pid: p for pid, p in self.trees.items() if alive(p)}
            self.recorded = {pid: p for pid, p in self.recorded.items() if alive(p)}
        elif word == "tree" and value.isdigit():
            try:
                process = psutil.Process(int(value))
            except psutil.Error:
                return
            self.trees[process.pid] = process
            self.recorded[process.pid] = process

    def record(self) -> None:
        """Remember every live descendant of every live launcher."""
        self.trees = {pid: p for pid, p in self.trees.items() if alive(p)}
        for launcher in list(self.trees.values()):
            try:
                for child in launcher.children(recursive=True):
                    self.recorded.setdefault(child.pid, child)
            except psutil.Error:
                continue

    def victims(self) -> list[psutil.Process]:
        """Every process to end now: recorded and alive, or carrying a token, and their
        descendants."""
        found = {pid: p for pid, p in self.recorded.items() if alive(p)}
        for pid in token_carriers(self.tokens):
            try:
                found.setdefault(pid, psutil.Process(pid))
            except psutil.Error:
                continue
        for process in list(found.values()):
            try:
                for child in process.children(recursive=True):
                    found.setdefault(child.pid, child)
            except psutil.Error:
                continue
        return [p for p in found.values() if alive(p)]

    def reap(self) -> None:
        groups = [JobGroup(Path(g)) for g in self.groups]
        for group in groups:
            group.kill()
        wait_gone(freeze_and_kill(self.victims), timeout_s=3.0)
        for group in groups:
            group.remove()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("nsadiag.harness.reaper: usage: python -m nsadiag.harness.reaper OWNER_PID",
              file=sys.stderr)
        return 2
    if os.fork() > 0:
        os._exit(0)  # detach: the owner waits for this first process only
    reaper = Reaper()
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], WATCH_POLL_S)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break  # the owner is gone
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                reaper.take(line.decode(errors="replace"))
        reaper.record()
    reaper.reap()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
