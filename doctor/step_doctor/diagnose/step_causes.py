"""Causes in the training step itself, outside the input pipeline: one function per cause.

Per-step overhead (Python, callbacks, dispatching the step) and XLA compiling the step again for
new shapes come from the host trace's steps (diagnose/input_wait.py, diagnose/xla.py); kernel
launches, copies, work placed on the host, a model too small for its device and float32 where
mixed precision would serve come from xprof's step breakdown, which exists only where the
profile has step markers (and compilation too, where xprof reports it and the trace shows none).
"""

from __future__ import annotations

from dataclasses import dataclass

from step_doctor.diagnose import analysis, xla
from step_doctor.diagnose.cpu_budget import Removal
from step_doctor.diagnose.profile_record import Profile, StepBreakdown
from step_doctor.diagnose.recommendation import Causes, ms, pct
from step_doctor.diagnose.stalls import left_out, working_step
from step_doctor.diagnose.wait_record import InputWait, Wait

TARGET_BATCH = 256
SPE = 16  # steps_per_execution suggested when the batch cannot grow


def per_step_overhead(wait: InputWait, causes: Causes) -> None:
    """Step time that is neither input wait nor the model's ops (nor compiling them): small-batch, else
    per-step-overhead."""
    overhead, batch, step = wait.overhead_ms, wait.batch_size, working_step(wait)
    if overhead <= 0 or xla.unseen_compiles(wait) or xla.unrecorded(wait):  # not told from XLA's time (diagnose/xla.py)
        return
    compiled = " nor compiling them" if wait.compile_ms else ""
    figures = (
        f"a step takes {ms(step)}{stall_words(wait)}; {ms(overhead)} of it ({pct(overhead, step)}) is neither waiting "
        f"for input nor running the model's ops{compiled} (Python, Keras callbacks, dispatching the step)"
    )
    if batch and batch < TARGET_BATCH:
        saved = overhead * (1 - batch / TARGET_BATCH)  # Python on the step's own thread: time and core-ms alike
        causes.add(
            "small-batch",
            f"Batches of {batch} make per-step overhead dominate" if overhead > step / 2 else f"Batch of {batch}",
            Removal(saved, saved, saved),
            f"{figures}: a cost paid every {batch} examples",
            f"`.batch({TARGET_BATCH})` (scale the learning rate with the batch); where memory does not allow it, run "
            f"several steps per call: `model.compile(..., steps_per_execution={SPE})`. In this template: "
            "pipeline.batch_size (`make sweep-batch` finds the largest that fits), train.steps_per_execution.",
            f"Estimate: per example, with the per-step overhead paid once per {TARGET_BATCH} examples and everything "
            "else growing with the batch; larger batches also use the device better, which this does not count.",
        )
    else:
        saved = overhead * (1 - 1 / SPE)
        causes.add(
            "per-step-overhead",
            "Per-step overhead",
            Removal(saved, saved, saved),
            figures,
            (
                f"Run several steps per call: with Keras, `model.compile(..., steps_per_execution={SPE})`; in a JAX "
                f"loop, `jax.lax.scan` the step over {SPE} batches stacked on the device, one dispatch for all of them."
                if wait.jax
                else f"Run several steps per call: `model.compile(..., steps_per_execution={SPE})`. In this template: "
                "train.steps_per_execution."
            ),
            f"Estimate: the per-step overhead paid once per {SPE} steps.",
        )


def stall_words(wait: Wait) -> str:
    """What the step figure leaves out on a busy machine (diagnose/stalls.py), said where it did."""
    stall = left_out(wait)
    if stall <= 0:
        return ""
    return f" without its {ms(stall)} stall (nothing of the process ran: other load, no cost of the step)"


@dataclass
class Breakdown:
    """xprof's step breakdown of one profile, as shares of its step time."""

    profile: Profile
    precision: str | None  # the run's train.precision where its config says, else None
    busy: float | None  # the device's share of the step where measured (diagnose/device.py)

    @property
    def figures(self) -> StepBreakdown:
        return self.profile.breakdown

    @property
    def step(self) -> float:
        return self.profile.step_time_ms

    def share(self, ms: float) -> float:
        return 100 * ms / self.step


def device_causes(profile: Profile, config: dict, busy: float | None, causes: Causes) -> None:
    """Causes from xprof's step breakdown: launches, compilation, copies, placement, device use, precision."""
    if not profile.has_step_markers or not profile.step_time_ms:
        return
    train = config.get("train")
    b = Breakdown(profile, train.get("precision") if isinstance(train, dict) else None, busy)
    small_kernels(b, causes)
    seen = xla.figures_of(profile.wait)
    if not (seen and seen.used):  # else the trace's (recompilation)
        compiled_per_xprof(b, causes)
    device_copies(b, causes)
    if b.busy is not None:
        host_placement(b, causes)
        model_too_small(b, causes)
        float32(b, causes)


def small_kernels(b: Breakdown, causes: Causes) -> None:
    launch = b.figures.kernel_launch_ms
    if b.share(launch) < 10:
        return
    causes.add(
        "small-kernels",
        "Too many small kernels",
        launch / 2,
        f"{b.share(launch):.1f}% of step time ({launch:.1f} ms) launches kernels",
        "Compile the step with XLA: `model.compile(..., jit_compile=True)` fuses kernels; run several steps per "
        "call: `steps_per_execution=16`. In this template: train.jit_compile: true, train.steps_per_execution.",
        "Estimate: half the launch time; XLA's gain depends on the model and the device.",
    )


STATIC_SHAPES = (
    "Give the step a few fixed shapes, so that each compiles once: bucket by length and pad to the bucket's "
    "boundary, `dataset.bucket_by_sequence_length(length_fn, bucket_boundaries, bucket_batch_sizes, "
    "pad_to_bucket_boundary=True, drop_remainder=True)` (its last boundary above the longest element); or pad every "
    "batch to one length, `padded_batch(batch_size, padded_shapes=([MAX_LEN], []), drop_remainder=True)` after "
    "cutting longer elements; and `drop_remainder=True` on `.batch()` (a smaller last batch is one more shape). "
    "Or leave the step uncompiled while shapes vary: `model.compile(..., jit_compile=False)`. In this template: "
    "pipeline.drop_remainder: true, train.jit_compile."
)


def recompilation(wait: InputWait, causes: Causes) -> None:
    """XLA compiling the step again for the new shapes its batches keep bringing (the trace's compile events)."""
    seen = wait.xla
    if not seen.churn:
        return
    step, compile_ms, each = working_step(wait), wait.compile_ms, seen.compile_each_ms
    shapes = seen.shapes or seen.compiles
    ran = seen.ran_shapes
    examples = f"; the steps ran it compiled for {', '.join(ran[:4])}{', ...' if len(ran) > 4 else ''}" if ran else ""
    process = f"; {seen.executables} executables of the step in the process so far" if seen.executables else ""
    causes.add(
        "recompilation",
        "The step is compiled again for every new shape",
        compile_ms,
        f"the step is compiled again for every new shape: {seen.compiles} compiles of {shapes} distinct shapes in "
        f"{seen.steps} steps, {ms(each)} each; compiling takes {ms(compile_ms)} of the {ms(step)} step "
        f"({pct(compile_ms, step)}){examples}{process}",
        STATIC_SHAPES,
        f"Estimate: the compile time measured in these steps removed, as with a fixed set of shapes compiled once each "
        f"(one compile of {ms(each)} per bucket at the start); padding to a bucket's boundary adds some compute, which "
        "this does not count.",
    )


def compiled_per_xprof(b: Breakdown, causes: Causes) -> None:
    """Compilation as xprof reports it (a profile whose trace shows no XLA: xprof's own compile figure)."""
    if b.share(b.figures.compile_ms) < 5:
        return
    causes.add(
        "recompilation",
        "The step is compiled again and again",
        b.figures.compile_ms,
        f"{b.share(b.figures.compile_ms):.1f}% of step time ({b.figures.compile_ms:.1f} ms) compiles",
        STATIC_SHAPES,
    )


def device_copies(b: Breakdown, causes: Causes) -> None:
    copies = b.figures.device_to_device_ms + b.figures.output_ms
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
    if b.share(b.figures.host_compute_ms) < 20:
        return
    causes.add(
        "host-placement",
        "Work placed on the host",
        b.figures.host_compute_ms / 2,
        f"{b.share(b.figures.host_compute_ms):.1f}% of step time is host compute while a device is present",
        "Check op placement (`tf.debugging.set_log_device_placement(True)`); move preprocessing into tf.data "
        "or onto the device.",
        "Estimate: half the host compute.",
    )


def model_too_small(b: Breakdown, causes: Causes) -> None:
    if b.busy >= 50 or (b.profile.input_bound_percent or 0.0) >= analysis.INPUT_BOUND_HIGH:
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
        b.figures.device_compute_ms / 3,
        f"the device computes {b.busy:.1f}% of each step" + (" in float32" if b.precision == "float32" else ""),
        "`keras.mixed_precision.set_global_policy('mixed_float16')` on tensor-core GPUs. In this template: "
        "train.precision: auto.",
        "Estimate: a third of device compute; tensor cores gain 2-3x on matmuls and convolutions, less elsewhere.",
    )
