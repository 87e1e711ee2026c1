"""The doctor on a real GPU: a small Keras-on-JAX model trained twice, starved and fed, each profiled and diagnosed.

    python doctor/tools/gpu_check.py --out runs/gpu-check        (make gpu-check runs it here, on the CPU)

On a GPU host the two runs train on the GPU under `step-doctor profile`, which captures them with JAX's profiler
(CUPTI traces the device there); during each run's training this script samples NVML (utilization, and GPM's SM
activity where the GPU has it) with the doctor's own sampler, and `nvidia-smi` beside it, and then writes
`gpu_check.json` and `gpu_check.md`: the device's busy and idle shares read from the profile's GPU plane, the
verdict and first cause of each run, NVML's utilization and SM activity against nvidia-smi's own reading.

- starved: batches built in Python (a PyDataset that normalises every image in numpy), so the GPU waits for them.
- fed: the whole dataset placed on the device once, batches sliced there: nothing to wait for.

With no GPU it runs the same two runs on the CPU and says what it skipped (NVML, GPM, nvidia-smi, the device
plane). It needs no TensorFlow: only JAX, Keras and the doctor (docs/doctor.md, "JAX"; the GPU host takes the
doctor's and Keras's wheels beside its own JAX, `doctor/tools/gpu_check.sh`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

MODES = ("starved", "fed")
MARKS = "GPU_CHECK_MARKS"  # where the training run writes when its timed training began and ended


# ---- the training run (python gpu_check.py run MODE), under step-doctor profile ----------------------------------


def train(mode: str, seconds: float) -> None:
    os.environ["KERAS_BACKEND"] = "jax"
    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np

    batch, shape = 64, (32, 32, 3)

    class Starved(keras.utils.PyDataset):
        def __len__(self):
            return 100_000

        def __getitem__(self, index):
            rng = np.random.default_rng(index)
            images = rng.integers(0, 255, (batch, *shape)).astype(np.float32)
            for image in images:  # per image and row, in Python
                for row in image:
                    row -= row.mean()
                    row /= row.std() + 1e-6
            return images, rng.integers(0, 10, batch)

    class Fed(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.x = jax.random.normal(jax.random.PRNGKey(0), (64 * batch, *shape))
            self.y = jnp.arange(64 * batch) % 10

        def __len__(self):
            return 100_000

        def __getitem__(self, index):
            start = (index % 64) * batch
            return self.x[start : start + batch], self.y[start : start + batch]

    class Timed(keras.callbacks.Callback):
        """Trains for `seconds` after the first 20 steps, and records when that began and ended."""

        def __init__(self):
            super().__init__()
            self.step, self.began = 0, None

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            if self.step == 20:
                self.began = time.time()
            if self.began and time.time() - self.began >= seconds:
                self.model.stop_training = True
                Path(os.environ[MARKS]).write_text(
                    json.dumps({"began": self.began, "ended": time.time(), "steps": self.step - 20})
                )

    model = keras.Sequential(
        [
            keras.Input(shape),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = Starved() if mode == "starved" else Fed()
    model.fit(data, epochs=1, steps_per_epoch=100_000, verbose=0, callbacks=[Timed()])


# ---- the check ------------------------------------------------------------------------------------------------------


class Smi:
    """nvidia-smi's own utilization reading, every 200 ms, in a thread (where nvidia-smi exists)."""

    def __init__(self):
        self.readings: list[tuple[float, float]] = []
        self.process = None
        if shutil.which("nvidia-smi"):
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE,
                text=True,
            )
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                self.readings.append((time.time(), float(line.split(",")[0])))
            except ValueError:
                continue

    def mean(self, began: float, ended: float) -> float | None:
        values = [value for at, value in self.readings if began <= at <= ended]
        return statistics.mean(values) if values else None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()


def profile_run(mode: str, out: Path, seconds: float) -> dict:
    """One run under `step-doctor profile`: its diagnosis and when its timed training ran."""
    marks = out / f"{mode}.marks.json"
    logdir = out / mode
    shutil.rmtree(logdir, ignore_errors=True)  # this check's own folder: the last check's run is replaced
    marks.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "step_doctor",
        "profile",
        "--json",
        "--logdir",
        str(logdir),
        "--",
        sys.executable,
        os.path.abspath(__file__),
        "run",
        mode,
        "--seconds",
        str(seconds),
    ]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, MARKS: str(marks)})
    (out / f"{mode}.stderr.txt").write_text(done.stderr)
    document = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    runs = document.get("runs") or {}
    item = next(iter(runs.values()), {})
    return {
        "exit_status": done.returncode,
        "wall_s": time.time() - started,
        "marks": json.loads(marks.read_text()) if marks.exists() else None,
        "diagnosis": item,
        "error": document.get("error") or (None if done.returncode == 0 else done.stderr.strip()[-500:]),
    }


def summarize(mode: str, run: dict, sampler, smi: Smi) -> dict:
    item, marks = run["diagnosis"], run["marks"] or {}
    profile = item.get("profile") or {}
    recommendations = item.get("recommendations") or []
    busy = profile.get("device_busy_percent")
    row = {
        "mode": mode,
        "exit_status": run["exit_status"],
        "error": run["error"] or item.get("error"),
        "verdict": item.get("verdict"),
        "first_cause": recommendations[0]["cause"] if recommendations else None,
        "first_cause_gain": recommendations[0]["estimated_gain"] if recommendations else None,
        "hardware": profile.get("hardware_type"),
        "step_ms": profile.get("step_time_ms"),
        "input_percent": profile.get("input_bound_percent"),
        "device_busy_percent": busy,
        "device_idle_percent": None if busy is None else 100.0 - busy,
        "steps_timed": marks.get("steps"),
    }
    if marks:
        window = sampler.summary(since=marks["began"], until=marks["ended"])
        row.update(
            nvml_utilization_percent=window.get("gpu_utilization_percent"),
            gpm_sm_activity_percent=window.get("sm_activity_percent"),
            cpu_utilization_percent=(window.get("cpu_utilization_percent") or {}).get("mean"),
            nvidia_smi_utilization_percent=smi.mean(marks["began"], marks["ended"]),
        )
    return row


def _mean(figure):
    return figure.get("mean") if isinstance(figure, dict) else figure


def markdown(result: dict) -> str:
    def cell(value, unit=""):
        value = _mean(value)
        if value is None:
            return "n/a"
        return f"{value:.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"

    lines = [
        f"# gpu-check on {result['device']}",
        "",
        f"JAX {result['jax']}, Keras {result['keras']}; {result['seconds']:g} s of timed training per run.",
        "",
        "| run | verdict | first cause | step (ms) | waiting for input | device busy (GPU plane) | device idle "
        "| NVML utilization | GPM SM activity | nvidia-smi utilization | CPU |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["runs"]:
        lines.append(
            f"| {row['mode']} | {row['verdict']} | {row['first_cause'] or '-'} | {cell(row['step_ms'])} "
            f"| {cell(row['input_percent'], ' %')} | {cell(row['device_busy_percent'], ' %')} "
            f"| {cell(row['device_idle_percent'], ' %')} | {cell(row.get('nvml_utilization_percent'), ' %')} "
            f"| {cell(row.get('gpm_sm_activity_percent'), ' %')} "
            f"| {cell(row.get('nvidia_smi_utilization_percent'), ' %')} "
            f"| {cell(row.get('cpu_utilization_percent'), ' %')} |"
        )
    if result["skipped"]:
        lines += ["", "Skipped here: " + "; ".join(result["skipped"]) + "."]
    return "\n".join(lines) + "\n"


def check(out: Path, seconds: float) -> int:
    import importlib.metadata

    import jax

    from step_doctor import sampler as sampler_lib

    out.mkdir(parents=True, exist_ok=True)
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    device = f"{len(gpus)} x {gpus[0].device_kind}" if gpus else f"CPU only ({os.cpu_count()} cores)"
    sampler = sampler_lib.Sampler(interval_s=0.2)
    smi = Smi()
    skipped = []
    if not gpus:
        skipped.append("the GPU runs (JAX sees no GPU: both runs trained on the CPU, and no device plane was read)")
    if not sampler.gpu_available:
        skipped.append(f"NVML ({sampler.gpu_unavailable_reason or 'no GPU'})")
    elif sampler.gpm_unavailable_reason:
        skipped.append(f"GPM ({sampler.gpm_unavailable_reason})")
    if smi.process is None:
        skipped.append("nvidia-smi (not installed)")
    sampler.start()
    runs = []
    try:
        for mode in MODES:
            print(f"gpu-check: {mode} run on {device}...", flush=True)
            runs.append(summarize(mode, profile_run(mode, out, seconds), sampler, smi))
    finally:
        sampler.stop()
        smi.stop()
    result = {
        "device": device,
        "jax": jax.__version__,
        "keras": importlib.metadata.version("keras"),  # imported here, Keras would load its default backend
        "seconds": seconds,
        "runs": runs,
        "skipped": skipped,
    }
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "gpu_check.md").write_text(markdown(result))
    print(markdown(result))
    print(f"Written: {out}/gpu_check.json, {out}/gpu_check.md")
    return 0 if all(row["exit_status"] == 0 and row["verdict"] for row in runs) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", default="check", choices=["check", "run"])
    parser.add_argument("mode", nargs="?", choices=MODES)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-check"))
    parser.add_argument("--seconds", type=float, default=15.0, help="timed training per run (default: 15)")
    args = parser.parse_args(argv)
    if args.what == "run":
        train(args.mode, args.seconds)
        return 0
    return check(args.out, args.seconds)


if __name__ == "__main__":
    sys.exit(main())
