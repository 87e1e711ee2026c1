"""The input wait of one profile as a typed record: what input_wait.py measures and every cause reads.

`InputWait` holds the figures of the analysed steps (per step, in ms), each of its parts a record of its own: the
steps (StepFigures), the tf.data stages (Stage, with their function calls: StageFunctions, and the Prefetch stages:
PrefetchStage), XLA in the steps (XlaFigures, xla.py), the stall (Stall, stalls.py) and the devices (DeviceFigures,
activity.py); `Unmeasured` says why there are none. All are frozen and built once, by input_wait.analyze. The causes,
the verdict and the text read them by attribute (the profile holds the record: profile_record.py), so a misspelt
figure is an AttributeError, never a silent None. `to_json` writes the `input_pipeline` object of the
`diagnose --json` document, its keys in the order of the fields (which the TensorBoard tab reads).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar


def _json(value: Any) -> Any:
    """A record's value as JSON: records by their to_json, tuples as lists."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, list | tuple):
        return [_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _json(item) for key, item in value.items()}
    return value


class _Record:
    """to_json: the fields in order, each as JSON."""

    def to_json(self) -> dict:
        return {f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Unmeasured(_Record):
    """No input wait measured: the profile shows no step to measure it in."""

    reason: str | None
    measured: ClassVar[bool] = False

    def to_json(self) -> dict:
        return {"measured": False, "reason": self.reason}


@dataclass(frozen=True)
class StepFigures(_Record):
    """One analysed step, in ms."""

    step: str  # its name: the marker's ("train 3"), a batch's, or the execution's
    step_ms: float
    input_ms: float
    compile_ms: float  # XLA compiling in it (xla.py)
    stall_ms: float  # time in it with no recorded work (stalls.py)


@dataclass(frozen=True)
class PrefetchStage(_Record):
    path: str
    injected: bool  # by tf.data (autotune), not written by the user
    buffer_limit: Any  # as the trace records it (a number, or "-1" for AUTOTUNE), None where it records none


@dataclass(frozen=True)
class StageFunctions(_Record):
    """What a stage's function calls did per step: CPU, wall time, calls at a time, threads, ops."""

    calls_per_step: float
    work_ms: float  # the calls' time summed
    wall_ms: float  # the time in which any of them ran
    concurrency: float | None  # work / wall: calls at a time
    threads: int
    ops_ms: dict[str, float]  # by category (tf_names.op_category), most first
    top_ops: tuple[tuple[str, float], ...]  # (op type, ms), most first, five at most


@dataclass(frozen=True)
class Stage(_Record):
    """One stage of the tf.data iterator tree, its parameters and what it cost per analysed step."""

    path: str  # its place in the tree, e.g. "Iterator::Root::Prefetch::MapAndBatch"
    kind: str
    ops: tuple[str, ...]  # the dataset ops it stands for, e.g. "fused(MapDataset:7,BatchDatasetV2:8)"
    user_ops: tuple[str, ...]  # those ops' kinds as the user wrote them, "injected" for tf.data's own
    injected: bool
    params: dict[str, Any]  # as the trace records them: parallelism, buffer_limit, batch_size, shapes, types, ...
    asynchronous: bool  # it hands its input to threads of its own (`async` in the document)
    pass_through: bool  # no work of its own: never a cause
    threads: int
    instances: int
    calls_per_step: float
    busy_ms: float
    blocking_ms: float  # the input wait charged to it
    blocking_percent: float
    fill_ms: float  # a shuffle buffer's fills
    fills: int
    pulled_per_fill: float  # 0 where it never filled
    element_mb: float | None
    functions: StageFunctions | None

    def to_json(self) -> dict:
        return {("async" if key == "asynchronous" else key): value for key, value in super().to_json().items()}


@dataclass(frozen=True)
class Stall(_Record):
    """Step time with no recorded work, per step (stalls.py)."""

    gaps_ms: float
    pipeline_ms: float  # the part of it in which the input pipeline's threads ran
    stretched_steps: int
    stretched_ms: float


@dataclass(frozen=True)
class DeviceFigures(_Record):
    """Per analysed step, averaged over the devices (activity.py)."""

    devices: tuple[str, ...]
    busy_ms: float
    kernels_per_step: float
    h2d_ms: float
    d2h_ms: float
    d2d_ms: float
    launch_ms: float  # on the host


@dataclass(frozen=True)
class XlaWarmUp(_Record):
    """The steps left out because they compiled while the steps reuse a few shapes (xla.py)."""

    steps: int
    compiles: int
    compile_each_ms: float


@dataclass(frozen=True)
class XlaFigures(_Record):
    """XLA in the analysed steps (xla.py)."""

    used: bool
    recorded: bool  # False: XLA ran the steps, and the trace holds none of its events
    runs_per_step: float
    compile_ms: float
    compile_steps: int
    compiles: int
    compile_each_ms: float | None
    lowering_each_ms: float | None
    per_step_ms: tuple[float, ...]
    steps: int
    shapes: int  # distinct batch shapes read in the analysed steps (0: not shown)
    programs: int  # distinct executables run in the analysed steps (0: the trace does not say)
    ran_shapes: tuple[str, ...]  # the shapes of those, in the order they were compiled
    churn: bool
    warm_up: XlaWarmUp | None
    executables: int  # alive in the process when the capture ended, of the step's module
    modules: int
    compiled_shapes: tuple[str, ...]


@dataclass(frozen=True)
class PythonInput(_Record):
    """A frame of the user's own code that fetched batches while the model had nothing to run (jax_steps.py)."""

    frame: str  # as the Python tracer names it: "my_train.py:42 batches"
    file: str | None
    line: int | None
    function: str
    ms: float  # per step, of the input wait
    share: float  # of the input wait


@dataclass(frozen=True)
class JaxFigures(_Record):
    """A JAX-made profile's steps, per step (jax_steps.py): the jitted step, its dispatch, its fetches."""

    function: str | None  # the jitted step: "PjitFunction(train_step)"
    tf_data: bool  # batches from tf.data (its stages in InputWait.stages), else from Python
    fetch_ms: float  # fetching batches on the Python thread ...
    overlapped_ms: float  # ... of which while the model ran (no wait)
    dispatch_ms: float  # dispatching the jitted step
    h2d_ms: float  # jax.device_put / DevicePut of the batches
    python_input: tuple[PythonInput, ...]  # where tf_data is False: the user's frames that fetched


@dataclass(frozen=True)
class InputWait(_Record):
    """The input wait per analysed step, the tf.data stages that made it, and the rest of the step.

    `measured` is False where no tf.data GetNext ran inside the steps (`reason` says so): the step figures stand,
    the input figures are None. Compile time (xla.py) and the stall (stalls.py) are already taken out of
    `overhead_ms` and `compute_ms`."""

    measured: bool
    reason: str | None
    step_source: str
    inferred: bool
    function: str | None
    steps: int
    steps_left_out: int
    step_ms: float
    input_ms: float | None
    input_percent: float | None
    getnext_per_step: float
    getnext_floor_ms: float | None
    compute_ms: float
    overhead_ms: float
    per_step: tuple[StepFigures, ...]
    cpu_budget: int | None
    autotune: bool | None
    batch_size: int | None
    prefetch: tuple[PrefetchStage, ...]
    unattributed_ms: float
    stages: tuple[Stage, ...]  # nearest the consumer first
    xla: XlaFigures
    compile_ms: float
    stall_ms: float
    stall: Stall
    replicas: int
    steps_per_window: int
    host_compute_ms: float
    device: DeviceFigures | None  # None where the profile has no device
    jax: JaxFigures | None = None  # a JAX-made profile's own figures (written only where there are some)

    def to_json(self) -> dict:
        found = super().to_json()
        if found["jax"] is None:
            del found["jax"]
        return found


Wait = InputWait | Unmeasured
