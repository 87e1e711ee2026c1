"""Crashes, damaged data, bad values: the run resumes, explains itself, and leaves nothing half-written."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import (
    NO_PROFILE,
    ROOT,
    SHORT_RUN,
    TINY_DATA,
    TINY_MODEL,
    child_env,
    data_sets,
    fit_command,
    quiet,
    run_to_end,
    set_args,
    stop_after_first_epoch,
    train_command,
)
from train import config, models, sources
from train.core import outputs
from train.core.errors import UserError
from train.shards import records
from train.training import checkpoint, fit_loop

# Four epochs of the tiny model: room to crash, stop or go wrong between checkpoints.
FOUR_EPOCHS = SHORT_RUN + NO_PROFILE + TINY_MODEL + ["train.epochs=4"]


def deterministic_fit(name: str, runs: Path, data_dir: Path, *extra: str) -> list[str]:
    sets = data_sets(data_dir) + FOUR_EPOCHS + [f"runs_dir={runs}", "train.deterministic=true", *extra]
    return fit_command(sets, name=name)


def kill_after_checkpoint(command: list[str], run_dir: Path, mid_epoch: bool) -> None:
    """Start training and `kill -9` it as soon as a checkpoint of the wanted kind exists."""
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            found = checkpoint.latest(run_dir)
            if found and (found[1]["step_in_epoch"] > 0) == mid_epoch:
                break
            time.sleep(0.02)
        assert process.poll() is None, "training finished before it could be killed"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=30)


def final_weights(run_dir: Path) -> list[np.ndarray]:
    return [np.asarray(w) for w in keras.models.load_model(run_dir / "model.keras").get_weights()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "mid_epoch",
    [pytest.param(False, marks=pytest.mark.long), pytest.param(True, marks=pytest.mark.long)],
    ids=["at-epoch-end", "mid-epoch"],
)
def test_kill_9_then_rerun_resumes_and_ends_where_an_uninterrupted_run_ends(tiny_data_dir, tmp_path, mid_epoch):
    runs = tmp_path / "runs"
    extra = ["checkpoint.every_steps=3"] if mid_epoch else []
    run_to_end(deterministic_fit("straight", runs, tiny_data_dir, *extra))
    command = deterministic_fit("crashed", runs, tiny_data_dir, *extra)
    kill_after_checkpoint(command, runs / "crashed", mid_epoch)
    assert not (runs / "crashed" / "summary.json").exists()
    resumed = run_to_end(command)
    assert "resuming from" in resumed.stdout
    summary = json.loads((runs / "crashed" / "summary.json").read_text())
    straight = json.loads((runs / "straight" / "summary.json").read_text())
    assert summary["resumed_from"] and summary["epochs"] == 4
    assert len(summary["history"]["val_loss"]) == 4
    assert summary["val_loss"] == straight["val_loss"] and summary["val_accuracy"] == straight["val_accuracy"]
    for resumed_weight, straight_weight in zip(final_weights(runs / "crashed"), final_weights(runs / "straight")):
        np.testing.assert_array_equal(resumed_weight, straight_weight)


@pytest.mark.slow
def test_fresh_starts_over_and_another_config_is_not_mixed_in(tiny_sets, tmp_path):
    cfg = config.load(ROOT / "configs/optimized.yaml", tiny_sets + FOUR_EPOCHS + ["train.epochs=2"])
    saver_dir = cfg.run_dir
    fit_loop.run(cfg, log=quiet)
    (saver_dir / "summary.json").unlink()  # as if the run had died after its last checkpoint
    other = config.load(ROOT / "configs/optimized.yaml", tiny_sets + FOUR_EPOCHS + ["train.epochs=3"])
    with pytest.raises(UserError, match=r"unfinished run .* different config .*train.epochs.*--fresh"):
        fit_loop.run(other, log=quiet)
    summary = fit_loop.run(other, log=quiet, fresh=True)
    assert summary["resumed_from"] is None and len(summary["history"]["loss"]) == 3


@pytest.mark.slow
def test_checkpoints_are_written_atomically_and_partial_ones_are_ignored(tiny_sets):
    cfg = config.load(ROOT / "configs/optimized.yaml", tiny_sets + FOUR_EPOCHS + ["checkpoint.keep=2"])
    fit_loop.run(cfg, log=quiet)
    complete = checkpoint.list_checkpoints(cfg.run_dir)
    assert len(complete) == 2  # the newest two of four epochs
    half = cfg.run_dir / "checkpoints" / "step-99999999.tmp"
    half.mkdir()
    (half / "state.json").write_text("{")
    broken = cfg.run_dir / "checkpoints" / "step-99999998"
    broken.mkdir()  # no weights: not a complete checkpoint
    assert checkpoint.latest(cfg.run_dir)[0] == complete[-1]
    checkpoint.remove_partial(cfg.run_dir)
    assert not half.exists()


@pytest.mark.long
def test_interrupted_data_preparation_leaves_nothing_and_the_next_run_finishes(tmp_path):
    sets = [f"data.data_dir={tmp_path}", "data.num_train=4000", "data.num_val=500", "data.num_shards=4"]
    command = train_command("data", "--config", "configs/base.yaml", *set_args(sets))
    target = sources.SOURCES["synthetic"].dataset_dir(config.load(ROOT / "configs/base.yaml", sets).data, "")
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(target.parent.glob("incomplete.*/*")):
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert list(target.parent.glob("incomplete.*")), "the build was not caught in progress"
    assert not (target / "dataset_info.json").exists()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=child_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Removed the leftovers of an interrupted build" in result.stdout
    assert not list(target.parent.glob("incomplete.*"))
    spec = sources.locate(config.load(ROOT / "configs/base.yaml", sets).data)
    assert spec.num_train == 4000


@pytest.mark.long
def test_sigterm_mid_run_saves_a_checkpoint_exits_143_and_the_rerun_resumes_to_the_same_weights(
    tiny_data_dir, tmp_path
):
    """Preemption or `docker compose stop`: SIGTERM during training keeps the progress made since the last
    checkpoint, and the same command resumes it."""
    runs = tmp_path / "runs"
    extra = ["train.epochs=30"]  # long enough that the signal lands mid-run
    run_to_end(deterministic_fit("straight", runs, tiny_data_dir, *extra))
    command = deterministic_fit("stopped", runs, tiny_data_dir, *extra)
    status, stderr, seconds = stop_after_first_epoch(command, runs / "stopped")
    assert status == 143 and seconds < 10, (status, seconds, stderr[-2000:])
    assert "SIGTERM received: saving a checkpoint after the current step" in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM after step ") and "rerun the same command to resume" in last
    folder, state = checkpoint.latest(runs / "stopped")
    assert str(folder) in last and 0 < state["global_step"] < 30 * 8
    assert not (runs / "stopped" / "summary.json").exists()

    resumed = run_to_end(command)
    assert f"resuming from {folder}" in resumed.stdout
    summary = json.loads((runs / "stopped" / "summary.json").read_text())
    straight = json.loads((runs / "straight" / "summary.json").read_text())
    assert summary["resumed_from"] == str(folder) and len(summary["history"]["val_loss"]) == 30
    # A stop mid-epoch leaves that epoch's training metrics to the steps after the resume; validation
    # metrics and weights cover everything.
    for key in ("val_loss", "val_accuracy"):
        assert summary["history"][key] == straight["history"][key]
    assert summary["weights_sha256"] == straight["weights_sha256"]


@pytest.mark.slow
def test_a_step_that_never_ends_still_exits_after_the_grace_period():
    """Where the main thread is stuck (here: blocked reading a pipe) no step ends to save at: the watcher
    thread, woken through signal.set_wakeup_fd, exits with the signal's status after the grace period."""
    script = (
        "import os\n"
        "from train.training.guards import GracefulStop\n"
        "stop = GracefulStop(None, steps_per_epoch=8, epochs=2, grace_s=1.0)\n"
        "stop.install()\n"
        "read_fd, _ = os.pipe()\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    os.read(read_fd, 1)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 143 and time.monotonic() - sent < 10, stderr
        assert "no training step ended within 1 s of SIGTERM" in stderr
        assert "rerun the same command to resume" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


# --- damaged data ---------------------------------------------------------------------------


def copy_dataset(tiny_data_dir: Path, tmp_path: Path) -> tuple[Path, sources.DatasetSpec]:
    copy = tmp_path / "data"
    shutil.copytree(tiny_data_dir, copy)
    spec = sources.locate(config.load(ROOT / "configs/base.yaml", data_sets(copy)).data)
    return copy, spec


def copied_run(copy: Path, tmp_path: Path, *extra: str) -> list[str]:
    return data_sets(copy) + FOUR_EPOCHS + [f"runs_dir={tmp_path / 'runs'}", *extra]


def damage(path: str, kind: str) -> int:
    """Damage one shard; returns the index of the first damaged record."""
    data = bytearray(Path(path).read_bytes())
    offsets, offset = [], 0
    while offset < len(data):
        offsets.append(offset)
        length = int.from_bytes(data[offset : offset + 8], "little")
        offset += 16 + length
    victim = 5
    if kind == "truncated":
        Path(path).write_bytes(bytes(data[: offsets[victim] + 20]))
    elif kind == "bitflip":
        data[offsets[victim] + 40] ^= 0x10
        Path(path).write_bytes(bytes(data))
    elif kind == "bad_jpeg":
        payloads = [payload for _, payload in records.read_records(path)]
        example = tf.train.Example()
        example.ParseFromString(payloads[victim])
        example.features.feature["image"].bytes_list.value[0] = b"\xff\xd8 not really a jpeg"
        payloads[victim] = example.SerializeToString()
        with tf.io.TFRecordWriter(path) as writer:
            for payload in payloads:
                writer.write(payload)
    return victim


@pytest.mark.parametrize("preset", ["naive", "optimized"])
@pytest.mark.parametrize(
    "kind", ["truncated", "bitflip", pytest.param("bad_jpeg", marks=[pytest.mark.slow, pytest.mark.stack])]
)
def test_damaged_shard_stops_the_run_naming_shard_and_record(tiny_data_dir, tmp_path, preset, kind):
    copy, spec = copy_dataset(tiny_data_dir, tmp_path)
    shard = spec.train_files[1]
    victim = damage(shard, kind)
    cfg = config.load(ROOT / f"configs/{preset}.yaml", copied_run(copy, tmp_path))
    with pytest.raises(UserError) as error:
        fit_loop.run(cfg, log=quiet, build_hint="make data")
    message = str(error.value)
    assert f"{Path(shard).name} record {victim}" in message
    assert "Rebuild it" in message and "skip_corrupt=true" in message
    assert not list(cfg.run_dir.rglob("*.tmp")) and not (cfg.run_dir / "summary.json").exists()


@pytest.mark.parametrize(
    "preset",
    [
        pytest.param("naive", marks=pytest.mark.long),
        pytest.param("optimized", marks=[pytest.mark.slow, pytest.mark.stack]),
    ],
)
def test_skip_corrupt_trains_on_the_rest_and_counts_what_it_skipped(tiny_data_dir, tmp_path, preset):
    copy, spec = copy_dataset(tiny_data_dir, tmp_path)
    damage(spec.train_files[0], "bitflip")
    damage(spec.train_files[2], "bad_jpeg")
    damage(spec.val_files[3], "truncated")
    cfg = config.load(ROOT / f"configs/{preset}.yaml", copied_run(copy, tmp_path, "pipeline.skip_corrupt=true"))
    summary = fit_loop.run(cfg, log=quiet)
    assert summary["skipped_records"] == 3
    assert all("record 5" in detail for detail in summary["skipped_record_details"])
    tags = set()
    for path in (cfg.run_dir / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    assert "data/skipped_records" in tags


# --- guard rails ----------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="tests")
class NanAfter(keras.layers.Layer):
    """Passes its input through until `steps` training calls have run, then returns NaN."""

    def __init__(self, steps: int, **kwargs):
        super().__init__(**kwargs)
        self.steps = steps

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

    def call(self, x, training=None):
        if training:
            self.calls.assign_add(1.0)
        # Added, not multiplied: the gradient stays finite until the poison itself arrives.
        poison = keras.ops.where(self.calls > self.steps, float("nan"), 0.0)
        return x + keras.ops.cast(poison, x.dtype)

    def get_config(self):
        return {**super().get_config(), "steps": self.steps}


@models.register_model("nan_after_test")
def nan_after_test(input_shape, num_classes, steps: int = 10):
    inputs = keras.Input(shape=input_shape, dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = NanAfter(steps)(keras.layers.Dense(num_classes)(x))
    return keras.Model(inputs, x)


@pytest.mark.slow
@pytest.mark.stack
def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tiny_sets):
    cfg = config.load(
        ROOT / "configs/optimized.yaml", tiny_sets + FOUR_EPOCHS + ["model.name=nan_after_test", "model.steps=10"]
    )
    with pytest.raises(UserError, match=r"loss became nan at step 11 .*last good checkpoint is kept at") as error:
        fit_loop.run(cfg, log=quiet)
    assert "--fresh" in str(error.value)
    folder, state = checkpoint.latest(cfg.run_dir)
    assert state["global_step"] == 8  # the end of epoch 1; epoch 2 went bad at step 11
    restored = models.build_model("nan_after_test", (32, 32, 3), 6, {"steps": 10})
    restored.load_weights(folder / checkpoint.WEIGHTS, skip_mismatch=True)
    assert all(np.isfinite(np.asarray(w)).all() for w in restored.get_weights())
    assert not (cfg.run_dir / "summary.json").exists()


def test_out_of_memory_suggests_the_largest_batch_that_fit(tiny_sets, tmp_path, monkeypatch):
    """GPU memory is the hardware this machine lacks: the allocator's error is raised in its place."""
    cfg = config.load(ROOT / "configs/optimized.yaml", tiny_sets + FOUR_EPOCHS + ["pipeline.batch_size=96"])
    sweep_file = outputs.sweep_result(cfg.runs_dir)  # where `make sweep-batch` writes, under this config's runs_dir
    sweep_file.parent.mkdir(parents=True)
    sweep_file.write_text(json.dumps({"largest_batch_that_fit": 64}))

    def exhausted(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[512,64,64,32]")

    monkeypatch.setattr(keras.Model, "fit", exhausted)
    with pytest.raises(UserError, match=r"Out of memory at pipeline.batch_size=96 .*fit up to 64 .*batch_size=64"):
        fit_loop.run(cfg, log=quiet)
    sweep_file.unlink()
    with pytest.raises(UserError, match=r"make sweep-batch.*batch_size=48"):
        fit_loop.run(cfg, log=quiet)


def test_tiny_data_constants_match_the_fixture():
    assert TINY_DATA["data.num_train"] == 128  # the step counts above assume 8 steps of 16 per epoch


@pytest.mark.slow
def test_a_damaged_shard_is_caught_before_the_previous_run_is_touched(tiny_data_dir, tmp_path):
    copy, spec = copy_dataset(tiny_data_dir, tmp_path)
    cfg = config.load(ROOT / "configs/optimized.yaml", copied_run(copy, tmp_path))
    fit_loop.run(cfg, log=quiet)
    before = (cfg.run_dir / "summary.json").read_text()
    damage(spec.val_files[0], "truncated")
    with pytest.raises(UserError, match=r"record 5: truncated"):
        fit_loop.run(cfg, log=quiet)
    assert (cfg.run_dir / "summary.json").read_text() == before and (cfg.run_dir / "model.keras").exists()
