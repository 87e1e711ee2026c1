"""`python -m train launch`: run a command as N local processes of one multi-worker cluster.

    python -m train launch --workers 2 -- fit --config configs/optimized.yaml

starts N workers on this machine with TF_CONFIG on free localhost ports (the training itself
is multi_worker.py). Output is prefixed with the worker; when one fails, the others are stopped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from train.core.errors import UserError


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def launch(workers: int, command: list[str], grace_s: float = 10.0) -> int:
    """Run `python -m train <command>` as `workers` local processes of one multi-worker cluster.

    Output is prefixed with the worker. When a worker fails, the others are stopped (they
    would wait for it in a collective) and the exit status says which one failed.
    """
    if workers < 1:
        raise UserError("--workers must be at least 1.")
    if not command:
        raise UserError(
            "Give the command the workers run after --, e.g. "
            "python -m train launch --workers 2 -- fit --config configs/optimized.yaml"
        )
    ports = free_ports(workers)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    processes = []
    for index in range(workers):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        process = subprocess.Popen(
            [sys.executable, "-m", "train", *command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=_relay, args=(process, f"[worker {index}] "), daemon=True).start()
        processes.append(process)
    print(f"launched {workers} workers: {', '.join(cluster['worker'])}", flush=True)
    failed = None
    try:
        while True:
            codes = [process.poll() for process in processes]
            failed = next(((i, c) for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed or all(code == 0 for code in codes):
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        failed = (-1, 130)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    if failed:
        index, code = failed
        who = "interrupted" if index < 0 else f"worker {index} exited with status {code}"
        print(
            f"error: {who}; the other workers were stopped (they would wait for it forever). Its output is above; "
            "checkpoints written so far are kept, so rerunning the same command resumes.",
            file=sys.stderr,
            flush=True,
        )
        return 3
    print(f"all {workers} workers finished", flush=True)
    return 0


def _relay(process: subprocess.Popen, prefix: str) -> None:
    for line in process.stdout:
        sys.stdout.write(prefix + line)
        sys.stdout.flush()
