"""Scaling out on one CPU machine: two logical CPUs, two local worker processes, a local tf.data service.

Every test that starts processes bounds them with timeouts and kills what is left, even
when a worker dies.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, build_pipeline, data_sets, run_cli
from train import config
from train.input import service
from train.training import checkpoint, fit_loop
from train.training.launch import EPHEMERAL, free_ports
from train.workloads.image import pipeline

QUICK = [
    "train.epochs=2",
    "profile.enabled=false",
    "monitor.enabled=false",
    "model.name=tiny",
    "model.width=4",
    "train.precision=float32",
    "train.deterministic=true",
    "pipeline.shuffle_buffer=16",
]


def sets_args(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_bound():
    """The launcher's ports: distinct, free, and (where the kernel says its range) below the ports outgoing
    connections are given, so no connection takes one before its worker binds it."""
    ports = free_ports(4)
    assert len(set(ports)) == 4
    if os.path.exists(EPHEMERAL):
        low = int(Path(EPHEMERAL).read_text().split()[0])
        assert all(port < low for port in ports), (ports, low)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("localhost", port))


@pytest.mark.long
def test_mirrored_over_two_logical_cpus_matches_one_device(tiny_data_dir, tmp_path):
    # Without augmentation: distributing a dataset rebatches it, so batch-indexed augmentation draws
    # differ between the runs; what is compared here is the strategy's arithmetic.
    base = (
        data_sets(tiny_data_dir)
        + QUICK
        + [f"runs_dir={tmp_path}", "train.scale_learning_rate=false", "pipeline.augment=none"]
    )
    single = run_cli(
        "fit",
        "--config",
        "configs/optimized.yaml",
        "--name",
        "single",
        *sets_args(base + ["pipeline.batch_size=32", "train.strategy=default"]),
        timeout=300,
    )
    mirrored = run_cli(
        "fit",
        "--config",
        "configs/optimized.yaml",
        "--name",
        "mirrored",
        *sets_args(base + ["pipeline.batch_size=16", "train.strategy=mirrored", "train.cpu_replicas=2"]),
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    assert mirrored.returncode == 0, mirrored.stderr[-2000:]
    one = json.loads((tmp_path / "single" / "summary.json").read_text())
    two = json.loads((tmp_path / "mirrored" / "summary.json").read_text())
    assert two["replicas"] == 2 and two["global_batch_size"] == 32 == one["global_batch_size"]
    for key in ("loss", "val_loss"):
        for a, b in zip(one["history"][key], two["history"][key]):
            assert abs(a - b) <= 0.01 * abs(a), (key, one["history"][key], two["history"][key])


def launch_command(tiny_data_dir: Path, runs: Path, epochs: int = 2) -> list[str]:
    items = (
        data_sets(tiny_data_dir)
        + QUICK
        + [
            f"runs_dir={runs}",
            "pipeline.batch_size=8",
            f"train.epochs={epochs}",
            "train.strategy=multi_worker",
            "train.collective_timeout_s=30",
        ]
    )
    return [
        sys.executable,
        "-m",
        "train",
        "launch",
        "--workers",
        "2",
        "--",
        "fit",
        "--config",
        "configs/optimized.yaml",
        "--name",
        "mw",
        *sets_args(items),
    ]


@pytest.mark.long
@pytest.mark.timeout(360)
def test_a_dying_worker_stops_the_run_with_a_clear_error_in_bounded_time(tiny_data_dir, tmp_path):
    launcher = subprocess.Popen(
        launch_command(tiny_data_dir, tmp_path, epochs=400),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 180
        for line in launcher.stdout:
            if "epoch 1/" in line or time.monotonic() > deadline:
                break
        victims = [
            child
            for child in psutil.Process(launcher.pid).children()
            if 'index": 1' in child.environ().get("TF_CONFIG", "")
        ]
        assert victims, "worker 1 was not found"
        killed_at = time.monotonic()
        victims[0].send_signal(signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=120)
        assert time.monotonic() - killed_at < 60
        assert launcher.returncode == 3
        assert "worker 1 exited with status -9" in stderr and "the other workers were stopped" in stderr
    finally:
        for child in psutil.Process(os.getpid()).children(recursive=True):
            if child.pid != os.getpid():
                child.kill()
        launcher.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_ctrl_c_on_the_launcher_stops_every_worker_after_one_step_with_a_checkpoint(tiny_data_dir, tmp_path):
    """The launcher passes one SIGINT on to each worker (in their own process groups, so a terminal's Ctrl-C
    reaches them only through it); they agree on a step, the chief saves there, all exit 130."""
    launcher = subprocess.Popen(
        launch_command(tiny_data_dir, tmp_path, epochs=400),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 180
        for line in launcher.stdout:
            if "epoch 2/" in line or time.monotonic() > deadline:
                break
        workers = psutil.Process(launcher.pid).children()
        launcher.send_signal(signal.SIGINT)
        stdout, stderr = launcher.communicate(timeout=120)
        assert launcher.returncode == 130, stderr[-3000:]
        assert "stopped: every worker exited (130, 130)" in stderr
        assert all(not worker.is_running() for worker in workers)
        stops = re.findall(r"stopped by SIGINT \(received here\) after step (\d+)", stdout)
        assert len(stops) == 2 and stops[0] == stops[1], stdout[-3000:]
        assert checkpoint.latest(tmp_path / "mw")[1]["global_step"] == int(stops[0])
    finally:
        for child in psutil.Process(os.getpid()).children(recursive=True):
            child.kill()
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait(timeout=30)


@pytest.mark.long
@pytest.mark.timeout(360)
def test_without_the_launcher_a_worker_whose_peer_dies_stops_with_a_clear_error(tiny_data_dir, tmp_path):
    """As on real hosts: nothing watches the workers, the survivor must notice by itself."""
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    command = launch_command(tiny_data_dir, tmp_path, epochs=400)
    command = [sys.executable, "-m", "train", *command[command.index("--") + 1 :]]
    workers = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
            },
        )
        for index in range(2)
    ]
    try:
        deadline = time.monotonic() + 180
        for line in workers[0].stdout:
            if "epoch 2/" in line or time.monotonic() > deadline:
                break
        workers[1].kill()
        killed_at = time.monotonic()
        _, stderr = workers[0].communicate(timeout=120)
        assert time.monotonic() - killed_at < 60
        assert workers[0].returncode == 3, stderr[-2000:]
        message = stderr.strip().splitlines()[-1]
        assert message.startswith("error: [mw worker 0] lost contact with worker 1"), message
        assert "restart every worker with the same command" in message and "checkpoints" in message
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait(timeout=30)


def examples(dataset) -> Counter:
    return Counter(hashlib.sha1(image.tobytes()).hexdigest() for images, _ in dataset for image in images.numpy())


@pytest.mark.timeout(360)
@pytest.mark.parametrize("mode, times", [("parallel_epochs", 2), ("distributed_epoch", 1)])
def test_data_service_with_two_workers_serves_each_example_the_expected_number_of_times(tiny_spec, mode, times):
    knobs = config.load(ROOT / "configs/optimized.yaml", ["pipeline.augment=none"]).pipeline
    local = examples(build_pipeline(tiny_spec, knobs, training=False, batch_size=16, files=tiny_spec.train_files))
    with service.LocalCluster(workers=2) as cluster:
        served_knobs = config.load(
            ROOT / "configs/optimized.yaml",
            ["pipeline.augment=none", f"pipeline.data_service={cluster.target}", f"pipeline.data_service_mode={mode}"],
        ).pipeline
        dataset = build_pipeline(tiny_spec, served_knobs, training=False, batch_size=16, files=tiny_spec.train_files)
        served = examples(pipeline.to_service(dataset, served_knobs, job_name=f"count-{mode}"))
    assert set(served) == set(local) and len(local) == tiny_spec.num_train
    assert set(served.values()) == {times}


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_trainer_fed_by_a_local_dispatcher_and_two_workers_trains(tiny_sets):
    with service.LocalCluster(workers=2) as cluster:
        cfg = config.load(
            ROOT / "configs/optimized.yaml",
            tiny_sets
            + QUICK
            + ["pipeline.batch_size=16", f"pipeline.data_service={cluster.target}", "train.deterministic=false"],
        )
        summary = fit_loop.run(cfg, log=lambda message: None)
    assert summary["examples_per_sec"] > 0 and "tf.data service" in summary["pipeline"]


@pytest.mark.long
@pytest.mark.timeout(360)
def test_losing_every_data_service_worker_ends_the_trainer_in_bounded_time(tiny_data_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ports = free_ports(2)
    dispatcher = subprocess.Popen(
        [sys.executable, "-m", "train", "data-service", "dispatcher", "--port", str(ports[0])],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "train",
            "data-service",
            "worker",
            "--port",
            str(ports[1]),
            "--dispatcher",
            f"localhost:{ports[0]}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    items = (
        data_sets(tiny_data_dir)
        + QUICK
        + [
            f"runs_dir={tmp_path}",
            "pipeline.batch_size=16",
            "train.epochs=500",
            "train.deterministic=false",
            f"pipeline.data_service=grpc://localhost:{ports[0]}",
            "train.stall_timeout_s=15",
        ]
    )
    trainer = subprocess.Popen(
        [sys.executable, "-m", "train", "fit", "--config", "configs/optimized.yaml", *sets_args(items)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        for line in trainer.stdout:
            if line.startswith("Epoch 3/") or time.monotonic() > deadline:
                break
        worker.kill()
        killed_at = time.monotonic()
        _, stderr = trainer.communicate(timeout=120)
        assert time.monotonic() - killed_at < 90
        assert trainer.returncode == 3
        assert "no training step finished for 15 s" in stderr and "tf.data service" in stderr
        assert (tmp_path / "optimized" / "checkpoints").is_dir()  # kept for a resume
    finally:
        for process in (trainer, worker, dispatcher):
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


def start_service_pair(env) -> tuple[subprocess.Popen, subprocess.Popen]:
    """A dispatcher and a worker as a user starts them, each ready (its first line printed)."""
    ports = free_ports(2)
    dispatcher = subprocess.Popen(
        [sys.executable, "-m", "train", "data-service", "dispatcher", "--port", str(ports[0])],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert dispatcher.stdout.readline().startswith("tf.data service dispatcher: grpc://")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "train",
            "data-service",
            "worker",
            "--port",
            str(ports[1]),
            "--dispatcher",
            f"localhost:{ports[0]}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert worker.stdout.readline().startswith("tf.data service worker")
    return dispatcher, worker


@pytest.mark.slow
@pytest.mark.timeout(360)
@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(signal.SIGTERM, marks=pytest.mark.long),
        pytest.param(signal.SIGTERM, marks=pytest.mark.long),
        pytest.param(signal.SIGINT, marks=pytest.mark.long),
    ],
)
def test_data_service_servers_stop_on_the_first_signal(stop):
    """Both servers, signalled together as `docker compose stop` does, exit 0 within 5 s, every time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dispatcher, worker = start_service_pair(env)
    try:
        time.sleep(1.0)  # TensorFlow's server threads are up and the worker has registered
        sent = time.monotonic()
        worker.send_signal(stop)
        dispatcher.send_signal(stop)
        for process, role in ((dispatcher, "dispatcher"), (worker, "worker")):
            out, _ = process.communicate(timeout=max(0.1, sent + 5.0 - time.monotonic()))
            assert process.returncode == 0 and f"{role} stopped" in out
        assert time.monotonic() - sent < 5.0
    finally:
        for process in (dispatcher, worker):
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
