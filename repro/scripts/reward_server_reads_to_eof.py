"""Defect: the client waits for a reply that the server never sends, because the server
reads the request body until end of file.

A plain training script (no nsadiag import). Each step scores the model's outputs with a
small HTTP service that the script starts itself (the same file, run with `serve`), as RL
and distillation setups do with a reward or teacher server. The handler reads the body
with `self.rfile.read()`, which returns only at end of file; the client sends the body and
keeps the connection open to read the reply, so each waits for the other. The first step
never ends.

Expected verdict: DEADLOCK; the wait chain: the main thread waits to read a TCP connection
to the server at the `urlopen` line -> the other end is held by the server process -> the
server waits at `self.rfile.read()`:

    nsadiag run --stall-timeout 5 -- python repro/scripts/reward_server_reads_to_eof.py
"""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import torch
from torch import nn


class ScoreHandler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (the http.server name)
        body = self.rfile.read()  # until end of file: the client never sends it
        scores = [float(len(x)) for x in json.loads(body)]
        reply = json.dumps(scores).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def serve(port: int) -> None:
    HTTPServer(("127.0.0.1", port), ScoreHandler).serve_forever()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_up(port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300  # it imports torch first: slow on a busy machine
    while time.monotonic() < deadline and server.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the score server did not start")


def score(port: int, outputs: torch.Tensor) -> torch.Tensor:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/score",
                                     data=json.dumps(outputs.tolist()).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:
        return torch.tensor(json.loads(reply.read()))


def main() -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "serve", str(port)])
    try:
        wait_until_up(port, server)
        model = nn.Linear(8, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(20):
            outputs = model(torch.randn(16, 8))
            rewards = score(port, outputs.detach())
            loss = -(outputs.mean(dim=1) * rewards).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    finally:
        server.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[2]))
    else:
        main()
