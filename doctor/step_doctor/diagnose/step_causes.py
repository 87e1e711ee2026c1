"""Causes in the training step itself, outside the input pipeline: one function per cause.

Per-step overhead (Python, callbacks, dispatching the step) comes from the host trace's steps
(diagnose/input_wait.py); kernel launches, compilation, copies, work placed on the host,
a model too small for its device and float32 where mixed precision would serve come from
xprof's step breakdown, which exists only where the profile has step markers.
"""

from __future__ import annotations

from dataclasses import dataclass

from step_doctor.diagnose import analysis
from step_doctor.diagnose.recommendation import Causes, ms, pct
from step_doctor.diagnose.stalls import left_out, working_step

TARGET_BATCH = 256
SPE = 16  # steps_per_execution suggested when the batch cannot grow


def per_step_overhead(wait: dict, causes: Causes) -> None:
    """Step time that is neither input wait nor the model's ops: small-batch, else per-step-overhead."""
    overhead, batch, step = wait["overhead_ms"], wait.get("batch_size"), working_step(wait)
    if overhead <= 0:
        return
    figures = (
        f"a step takes {ms(step)}{stall_words(wait)}; {ms(overhead)} of it ({pct(overhead, step)}) is neither waiting "
        "for input nor running the model's ops (Python, Keras callbacks, dispatching the step)"
    )
    if batch and batch < TARGET_BATCH:
        causes.add(
            "small-batch",
            f"Batches of {batch} make per-step overhead dominate" if overhead > step / 2 else f"Batch of {batch}",
            overhead * (1 - batch / TARGET_BATCH),
            f"{figures}: a cost paid every {batch} examples",
            f"`.batch({TARGET_BATCH})` (scale the learning rate with the batch); where memory does not allow it, run "
            f"several steps per call: `model.compile(..., steps_per_execution={SPE})`. In this template: "
            "pipeline.batch_size (`make sweep-batch` finds the largest that fits), train.steps_per_execution.",
            f"Estimate: per example, with the per-step overhead paid once per {TARGET_BATCH} examples and everything "
            "else growing with the batch; larger batches also use the device better, which this does not count.",
        )
    else:
        causes.add(
            "per-step-overhead",
            "Per-step overhead",
            overhead * (1 - 1 / SPE),
            figures,
            f"Run several steps per call: `model.compile(..., steps_per_execution={SPE})`. In this template: "
            "train.steps_per_execution.",
            f"Estimate: the per-step overhead paid once per {SPE} steps.",
        )


def stall_words(wait: dict) -> str:
    """What the step figure leaves out on a busy machine (diagnose/stalls.py), said where it did."""
    stall = left_out(wait)
    if stall <= 0:
        return ""
    return f" without its {ms(stall)} stall (nothing of the process ran: other load, no cost of the step)"


@dataclass
class Breakdown:
    """xprof's step breakdown of one profile, as shares of its step time."""

    profile: dict
    precision: str | None  # the run's train.precision where its config says, else None
    busy: float | None  # the device's share of the step where measured (diagnose/device.py)

    @property
    def step(self) -> float:
        return self.profile["step_time_ms"]

    def share(self, key: str) -> float:
        return 100 * self.profile[key] / self.step


def device_causes(profile: dict, config: dict, busy: float | None, causes: Causes) -> None:
    """Causes from xprof's step breakdown: launches, compilation, copies, placement, device use, precision."""
    if not profile["has_step_markers"] or not profile["step_time_ms"]:
        return
    train = config.get("train")
    b = Breakdown(profile, train.get("precision") if isinstance(train, dict) else None, busy)
    small_kernels(b, causes)
    recompilation(b, causes)
    device_copies(b, causes)
    if b.busy is not None:
        host_placement(b, causes)
        model_too_small(b, causes)
        float32(b, causes)


def small_kernels(b: Breakdown, causes: Causes) -> None:
    if b.share("kernel_launch_ms") < 10:
        return
    causes.add(
        "small-kernels",
        "Too many small kernels",
        b.profile["kernel_launch_ms"] / 2,
        f"{b.share('kernel_launch_ms'):.1f}% of step time ({b.profile['kernel_launch_ms']:.1f} ms) launches kernels",
        "Compile the step with XLA: `model.compile(..., jit_compile=True)` fuses kernels; run several steps per "
        "call: `steps_per_execution=16`. In this template: train.jit_compile: true, train.steps_per_execution.",
        "Estimate: half the launch time; XLA's gain depends on the model and the device.",
    )


def recompilation(b: Breakdown, causes: Causes) -> None:
    if b.share("compile_ms") < 5:
        return
    causes.add(
        "recompilation",
        "The step is compiled again and again",
        b.profile["compile_ms"],
        f"{b.share('compile_ms'):.1f}% of step time ({b.profile['compile_ms']:.1f} ms) compiles",
        "Keep shapes static so the step is traced once: `.batch(256, drop_remainder=True)`, pad variable-length "
        "inputs to a few fixed sizes. In this template: pipeline.drop_remainder: true.",
    )


def device_copies(b: Breakdown, causes: Causes) -> None:
    copies = b.profile["device_to_device_ms"] + b.profile["output_ms"]
    if 100 * copies / b.step < 10:
        return
    causes.add(
        "device-copies",
        "Copies between devices or to the host",
        copies / 2,
        f"{100 * copies / b.step:.1f}% of step time ({copies:.1f} ms) copies between devices or to the host",
        "Keep tensors on the device; ship uint8 images and convert them on the device. In this template the "
        "models do (train/models.py).",
        "Estimate: half the copy time.",
    )


def host_placement(b: Breakdown, causes: Causes) -> None:
    if b.share("host_compute_ms") < 20:
        return
    causes.add(
        "host-placement",
        "Work placed on the host",
        b.profile["host_compute_ms"] / 2,
        f"{b.share('host_compute_ms'):.1f}% of step time is host compute while a device is present",
        "Check op placement (`tf.debugging.set_log_device_placement(True)`); move preprocessing into tf.data "
        "or onto the device.",
        "Estimate: half the host compute.",
    )


def model_too_small(b: Breakdown, causes: Causes) -> None:
    if b.busy >= 50 or (b.profile["input_bound_percent"] or 0.0) >= analysis.INPUT_BOUND_HIGH:
        return
    causes.add(
        "model-too-small",
        "Model too small for the device",
        0.0,
        f"the device computes only {b.busy:.1f}% of each step and input is not the cause",
        "Give each step more work: `.batch(256)`, `steps_per_execution=16`, XLA; or a larger model.",
    )


def float32(b: Breakdown, causes: Causes) -> None:
    if b.busy < 50 or b.precision not in (None, "float32"):
        return
    causes.add(
        "float32",
        "float32 where mixed precision would serve",
        b.profile["device_compute_ms"] / 3,
        f"the device computes {b.busy:.1f}% of each step" + (" in float32" if b.precision == "float32" else ""),
        "`keras.mixed_precision.set_global_policy('mixed_float16')` on tensor-core GPUs. In this template: "
        "train.precision: auto.",
        "Estimate: a third of device compute; tensor cores gain 2-3x on matmuls and convolutions, less elsewhere.",
    )
