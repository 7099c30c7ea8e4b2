"""A "pkg.module:factory" target that leaks every kind of secret the redaction hides: its
forward prints them to stdout and raises them in an exception message (see
tests/nsadiag/core/test_redact_planted.py, which also plants them in the environment)."""

from __future__ import annotations

import json
import socket

from torch import nn

from tests.diag_targets import TinyLM

ENV_SECRET_NAME = "MY_SERVICE_TOKEN"
ENV_SECRET_VALUE = "envplanted-7c1f9e2a"
PLANTED_USER = "zed-analyst"

SECRETS = {
    "internal host": "gpu-node-7.cluster.internal",
    "this host": socket.gethostname(),
    "this short host": socket.gethostname().split(".")[0],
    "ipv4": "10.12.0.7",
    "ipv6": "fe80::1ff:fe23:4567:890a",
    "short ipv6": "fe80::1",
    "documentation ipv6": "2001:db8::7",
    "user@host": "alice@build-box.example.com",
    "home directory user": f"/home/{PLANTED_USER}/train.py",
    "NAME=value": "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz",
    "github token": "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "aws key id": "AKIAIOSFODNN7EXAMPLE",
    "aws secret (yaml)": "aws_secret_access_key: wJalrXUtnFEMIK7MDENGbPxRfiCYsecret",
    "bearer header": "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.cGF5bG9hZA.c2ln",
    "python repr pair": "{'db_password': 'hunter2-planted'}",
    "json pair": '{"api_key": "json-planted-4411"}',
    "openai-style key": "sk-plantedabcdefghijklmnopqrst",
    "password assignment": "DB_PASSWORD=pa55word-planted",
    "environment value": ENV_SECRET_VALUE,
}
"""Each kind and how it is planted; ``LEAKS`` holds the part that must never be shown."""

LEAKS = {
    "internal host": "gpu-node-7", "this host": SECRETS["this host"],
    "this short host": SECRETS["this short host"], "ipv4": "10.12.0.7",
    "ipv6": "fe80::1ff:fe23", "short ipv6": "fe80::1", "documentation ipv6": "2001:db8::7",
    "user@host": "alice@build-box", "home directory user": PLANTED_USER,
    "NAME=value": "hf_abcdefghijklmnopqrstuvwxyz", "github token": "ghp_abcdefghijkl",
    "aws key id": "AKIAIOSFODNN7EXAMPLE", "aws secret (yaml)": "wJalrXUtnFEMIK7MDENG",
    "bearer header": "eyJhbGciOiJIUzI1NiJ9", "python repr pair": "hunter2-planted",
    "json pair": "json-planted-4411", "openai-style key": "sk-plantedabcdefghij",
    "password assignment": "pa55word-planted", "environment value": ENV_SECRET_VALUE,
}

MESSAGE = "; ".join(f"{kind}: {value}" for kind, value in SECRETS.items())


class Leaky(nn.Module):
    """TinyLM whose forward prints every secret and raises them (also as JSON)."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.lm = TinyLM(n_layers)

    def forward(self, ids):
        print(MESSAGE, flush=True)
        raise RuntimeError(f"{MESSAGE}; as JSON: {json.dumps(SECRETS)}")


def leaky(n_layers: int = 1) -> Leaky:
    return Leaky(n_layers)
