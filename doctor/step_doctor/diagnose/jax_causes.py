"""Causes of a JAX-made profile (jax_steps.py), with fixes in JAX's terms.

tf.data feeding JAX steps is diagnosed as any tf.data pipeline is (input_causes.py: the same stages, the same knobs);
what is JAX's own is here: batches built in Python (a generator, a PyDataset, a Grain loader without workers), batches
copied to the device by the step itself, and the jitted step compiled again for new shapes.
"""

from __future__ import annotations

from step_doctor.diagnose.recommendation import Causes, ms, pct
from step_doctor.diagnose.stalls import working_step
from step_doctor.diagnose.wait_record import InputWait, Wait

PREFETCH_TO_DEVICE = (
    "keep a batch or two on the device ahead of the step: build them in a background thread and `jax.device_put` "
    "them there (`flax.jax_utils.prefetch_to_device(iterator, 2)` does both)"
)


def jax_causes(wait: Wait, causes: Causes) -> None:
    """Add the JAX causes of one profile to `causes`."""
    if not isinstance(wait, InputWait) or wait.jax is None:
        return
    python_input(wait, causes)
    host_to_device(wait, causes)
    recompilation(wait, causes)


def python_input(wait: InputWait, causes: Causes) -> None:
    """The step waits for batches built in Python: the user's frame that built them, with its line."""
    jax = wait.jax
    if jax.tf_data or not jax.python_input or not wait.input_ms:
        return
    top, step = jax.python_input[0], working_step(wait)
    where = f"{top.file}:{top.line}" if top.file and top.line else top.frame
    causes.add(
        "python-input",
        f"Batches built in Python: {top.function} ({where})",
        wait.input_ms,
        f"the model had nothing to run for {ms(wait.input_ms)} of each {ms(step)} step ({pct(wait.input_ms, step)}) "
        f"while the step's thread fetched its batch in Python ({ms(jax.fetch_ms)} a step, {ms(jax.overlapped_ms)} "
        f"of it beside the model's work); {top.share:.0%} of that wait in `{top.function}` at {where}",
        "Build the batches off the training thread and ahead of the step: write the per-example work as a tf.data "
        "pipeline (`.map(fn, num_parallel_calls=tf.data.AUTOTUNE)`, `.batch()`, `.prefetch(tf.data.AUTOTUNE)`; "
        "Keras on JAX and `tfds.as_numpy` both iterate it); with Grain, its map in worker processes (a dataset's "
        "`.mp_prefetch(grain.MultiprocessingOptions(num_workers=4))`, a `DataLoader`'s `worker_count=4`); with Keras, "
        "a `PyDataset(workers=4, use_multiprocessing=True)`; then " + PREFETCH_TO_DEVICE + ".",
        "Estimate: the wait removed, as where each batch is ready when the step asks for it; the work moves to other "
        "cores, which on a host without an accelerator are the cores the model runs on.",
        stage=where,
    )


def host_to_device(wait: InputWait, causes: Causes) -> None:
    """The step copies its batch to the device itself (DevicePut on the step's thread)."""
    copies, step = wait.jax.h2d_ms, working_step(wait)
    if not wait.device or copies < 0.1 * step:
        return
    causes.add(
        "host-to-device",
        "Each batch is copied to the device by the step",
        copies,
        f"the step's thread spends {ms(copies)} of each {ms(step)} step ({pct(copies, step)}) putting its batch on "
        "the device (DevicePut) before the step can run",
        "Copy batches while the previous step runs: " + PREFETCH_TO_DEVICE + "; ship compact dtypes (uint8 images, "
        "int32 token ids) and convert them on the device.",
        "Estimate: the copy time on the step's thread removed; the copy itself still takes the link's time.",
    )


def recompilation(wait: InputWait, causes: Causes) -> None:
    """The jitted step compiled again in most steps: its batches keep bringing new shapes."""
    seen, step = wait.xla, working_step(wait)
    if not seen.churn or not wait.compile_ms:
        return
    causes.add(
        "recompilation",
        f"The jitted step is compiled again for every new shape ({wait.jax.function or 'the step'})",
        wait.compile_ms,
        f"JAX traced, lowered and compiled the step {seen.compiles} times in {seen.steps} steps "
        f"({ms(seen.compile_each_ms or 0.0)} each): {ms(wait.compile_ms)} of each {ms(step)} step "
        f"({pct(wait.compile_ms, step)})",
        "Give the jitted step a few fixed shapes, so that each compiles once: pad every batch to a fixed size (or to a "
        "few bucket sizes) and mask the padding in the loss, drop the last partial batch (`drop_remainder=True`); "
        "pass sizes that decide shapes as static arguments (`jax.jit(f, static_argnums=...)`) only where they take "
        "few values. `jax.config.update('jax_log_compiles', True)` names each compile's shapes.",
        "Estimate: the compile time measured in these steps removed; padding adds some compute, which this does not "
        "count.",
    )
