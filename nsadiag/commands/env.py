"""nsadiag env: this machine as a diagnosis sees it, with what weakens the evidence."""

from __future__ import annotations

from typing import Any

from nsadiag.envinfo import collect_env
from nsadiag.triage.decide import env_problems


def env_report(device: str = "cpu") -> dict[str, Any]:
    """Versions, devices, profilers and permissions (nsadiag.envinfo.collect_env), and the
    problems that would weaken a diagnosis on ``device`` (missing py-spy, refused ptrace,
    a loaded machine, ...)."""
    env = collect_env()
    return {**env.as_dict(), "problems": env_problems(env, device)}
