r"""Training loop that fetches per-batch side features from a tiny local
feature-store service: serve_features() runs in a background thread on a
localhost socket, reads a request terminated by a blank line ("\n\n"), and
replies with a float vector; fetch_features() on the trainer side sends
"GET <batch_id>\n" and then blocks in sock.recv() for the reply. The defect is
a protocol mismatch: the client terminates its request with a single "\n",
so the server, which accepted the connection, keeps waiting in conn.recv()
for the rest of the request and never replies, while the client waits in
sock.recv() forever (no socket timeout is set).

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/feature_store_client.py
Cause words: recv | fetch_features | serve_features | delimiter
Next words: settimeout | blank line | terminate the request | same delimiter
"""
import socket
import struct
import threading

import torch
import torch.nn as nn

DIM = 16


def serve_features(srv):
    while True:
        conn, _ = srv.accept()
        with conn:
            buf = b""
            while b"\n\n" not in buf:
                chunk = conn.recv(1024)
                if not chunk:
                    break
                buf += chunk
            batch_id = int(buf.split()[1])
            g = torch.Generator().manual_seed(batch_id)
            conn.sendall(torch.randn(DIM, generator=g).numpy().tobytes())


def fetch_features(port, batch_id):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"GET {batch_id}\n".encode())
        data = b""
        while len(data) < 4 * DIM:
            data += sock.recv(4096)
    return torch.tensor(struct.unpack(f"{DIM}f", data[:4 * DIM]))


def main():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    threading.Thread(target=serve_features, args=(srv,), daemon=True).start()
    print(f"feature store listening on port {port}", flush=True)
    model = nn.Linear(32 + DIM, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100):
        x = torch.randn(64, 32)
        side = fetch_features(port, step).expand(64, DIM)
        loss = model(torch.cat([x, side], dim=1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss={loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
