"""The input wait of one profile as a typed record: what input_wait.py measures and every cause reads.

`InputWait` holds the figures of the analysed steps (per step, in ms); `Unmeasured` says why there are none.
The causes, the verdict and the text read them by attribute (the profile holds it: profile_record.py), so a
misspelt figure is an AttributeError, never a silent None. `to_json` writes the `input_pipeline` object of the
`diagnose --json` document (its keys in this order, which the TensorBoard tab reads).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar


@dataclass
class Unmeasured:
    """No input wait measured: the profile shows no step to measure it in."""

    reason: str | None
    measured: ClassVar[bool] = False

    def to_json(self) -> dict:
        return {"measured": False, "reason": self.reason}


@dataclass
class InputWait:
    """The input wait per analysed step, the tf.data stages that made it, and the rest of the step.

    `measured` is False where no tf.data GetNext ran inside the steps (`reason` says so): the step figures stand,
    the input figures are None. The fields after `stages` are set by xla.apply and stalls.apply, and at the end of
    input_wait.analyze (None until then)."""

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
    per_step: list[dict]  # {"step", "step_ms", "input_ms", "compile_ms", "stall_ms"} per analysed step
    cpu_budget: int | None
    autotune: bool | None
    batch_size: int | None
    prefetch: list[dict]  # {"path", "injected", "buffer_limit"} per Prefetch stage
    unattributed_ms: float
    stages: list[dict]  # input_wait._stage_row per stage of the iterator tree
    xla: dict | None = None  # xla.measure
    compile_ms: float | None = None
    stall_ms: float | None = None
    stall: dict | None = None  # {"gaps_ms", "pipeline_ms", "stretched_steps", "stretched_ms"}: stalls.split
    replicas: int | None = None
    steps_per_window: int | None = None
    host_compute_ms: float | None = None
    device: dict | None = None  # activity.device_figures; None where the profile has no device

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


Wait = InputWait | Unmeasured
