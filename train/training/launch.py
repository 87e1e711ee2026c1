"""`python -m train launch`: run a command as N local processes of one multi-worker cluster.

    python -m train launch --workers 2 -- fit --config configs/optimized.yaml

starts N workers on this machine with TF_CONFIG on free localhost ports (the training itself
is multi_worker.py). Output is prefixed with the worker. When one fails, the others are
stopped. A stop request (Ctrl-C, SIGTERM) is passed on to every worker once: they agree on a
step, the chief saves a checkpoint there, and the launcher exits as they do (130 or 143);
rerunning the same command resumes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

from train.core.errors import UserError
from train.training import cluster

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A closed terminal hangs up on the launcher alone (the workers have their own sessions): pass it on as a stop.
FORWARDED = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGTERM}
STOPPED = {128 + signum for signum in STOP_SIGNALS}


EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"


def free_ports(count: int) -> list[int]:
    """Free localhost ports below the kernel's ephemeral range, where no outgoing connection is given one: a port
    picked inside it is free for anyone from the pick until the worker binds it seconds later (TensorFlow's
    import), and a worker that keeps connecting to a peer not listening yet can be handed that very port."""
    try:
        with open(EPHEMERAL) as ranges:
            low = int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    candidates = random.sample(range(low // 2, low), 200) if low >= 4096 else []
    sockets, ports = [], []
    try:
        for port in candidates + [0] * count:  # bind(0), inside the range, only where nothing below it is free
            if len(ports) == count:
                break
            sock = socket.socket()
            sockets.append(sock)
            try:
                sock.bind(("localhost", port))
            except OSError:
                continue
            ports.append(sock.getsockname()[1])
        return ports
    finally:
        for sock in sockets:
            sock.close()


def launch(workers: int, command: list[str], grace_s: float = 10.0, stop_grace_s: float | None = None) -> int:
    """Run `python -m train <command>` as `workers` local processes of one multi-worker cluster.

    Output is prefixed with the worker. When a worker fails, the others are stopped (they
    would wait for it in a collective) and the exit status says which one failed; they get
    `grace_s` to exit. After a stop request they get `stop_grace_s` (the trainer's own stop
    time plus a margin) to save and exit.
    """
    if workers < 1:
        raise UserError("--workers must be at least 1.")
    if not command:
        raise UserError(
            "Give the command the workers run after --, e.g. "
            "python -m train launch --workers 2 -- fit --config configs/optimized.yaml"
        )
    stop_grace_s = cluster.STOP_GRACE_S + 10.0 if stop_grace_s is None else stop_grace_s
    ports = free_ports(workers)
    addresses = [f"localhost:{port}" for port in ports]
    processes = [_start(index, addresses, command) for index in range(workers)]
    print(f"launched {workers} workers: {', '.join(addresses)}", flush=True)
    received: list[int] = []
    previous = _forward_signals(processes, received)
    try:
        failed, stopping = _wait(processes, received, stop_grace_s)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _end(processes, grace_s)
    if failed:
        index, code = failed
        print(
            f"error: worker {index} exited with status {code}; the other workers were stopped (they would wait for "
            "it forever). Its output is above; checkpoints written so far are kept, so rerunning the same command "
            "resumes.",
            file=sys.stderr,
            flush=True,
        )
        return 3
    if stopping:
        codes = [process.returncode for process in processes]
        print(
            f"stopped: every worker exited ({', '.join(map(str, codes))}) after the step they agreed on; rerun the "
            "same command to resume from the chief's checkpoint.",
            file=sys.stderr,
            flush=True,
        )
        return stopping
    print(f"all {workers} workers finished", flush=True)
    return 0


def _start(index: int, addresses: list[str], command: list[str]) -> subprocess.Popen:
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    process = subprocess.Popen(
        [sys.executable, "-m", "train", *command],
        env={**os.environ, "TF_CONFIG": json.dumps(tf_config)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        # Its own process group: a terminal's Ctrl-C reaches the launcher alone, which passes it on
        # once (a worker that got it twice would stop at once, without its checkpoint).
        start_new_session=True,
    )
    threading.Thread(target=_relay, args=(process, f"[worker {index}] "), daemon=True).start()
    return process


def _forward_signals(processes: list[subprocess.Popen], received: list[int]) -> dict:
    """Pass the first Ctrl-C, SIGTERM or hang-up on to every worker; a second one stops them at once."""

    def forward(signum, frame):
        again = bool(received)
        received.append(FORWARDED[signum])
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL if again else FORWARDED[signum])

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, forward) for signum in FORWARDED}


def _wait(processes: list[subprocess.Popen], received: list[int], stop_grace_s: float) -> tuple:
    """Until every worker has exited, one failed, or a stop ran out of time.

    Returns (failed, stopping): failed is (index, status) of a worker that failed outside a
    stop; stopping is the status to exit with after a stop (128 + the signal), else 0.
    """
    stop_since = None
    while True:
        codes = [process.poll() for process in processes]
        stopped = [code for code in codes if code in STOPPED]
        if (received or stopped) and stop_since is None:
            stop_since = time.monotonic()
        failed = next(((i, c) for i, c in enumerate(codes) if c not in (None, 0) and c not in STOPPED), None)
        if failed and stop_since is None:
            return failed, 0
        if all(code is not None for code in codes) or (
            stop_since is not None and time.monotonic() - stop_since > stop_grace_s
        ):
            break
        time.sleep(0.2)
    if stop_since is None:
        return None, 0
    return None, 128 + received[0] if received else max(stopped)


def _end(processes: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to whatever still runs, SIGKILL to whatever outlives `grace_s`."""
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


def _relay(process: subprocess.Popen, prefix: str) -> None:
    for line in process.stdout:
        sys.stdout.write(prefix + line)
        sys.stdout.flush()
