"""One profile's analysis as a typed record: what analysis.analyze_session finds and every cause, the verdict and the
text read.

`Profile` holds the step breakdown (xprof's, or the trace's where xprof saw no step or was skipped), the input share,
the tf.data stages that held the step and the input wait itself (wait_record.py, `wait`), read by attribute.
`to_json` writes the `profile` object of the `diagnose --json` document, its keys in the order the TensorBoard tab
and the template's run summaries know: the breakdown's ten figures inline after `steps`, the input wait as
`input_pipeline`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from step_doctor.diagnose.wait_record import Wait


@dataclass(frozen=True)
class StepBreakdown:
    """Per step, in ms: where the step time goes (xprof's names for its parts; input_ms is None where the steps
    read no tf.data input)."""

    step_time_ms: float
    input_ms: float | None
    host_compute_ms: float
    device_compute_ms: float
    device_to_device_ms: float
    device_collectives_ms: float
    kernel_launch_ms: float
    compile_ms: float
    output_ms: float
    other_ms: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SlowStage:
    """A tf.data stage ranked by the input wait it caused."""

    name: str  # its path in the iterator tree
    stage: str  # its kind
    self_time_ms: float
    self_time_percent: float
    step_percent: float
    count: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Profile:
    """The analysis of one profile session (diagnose/analysis.py)."""

    hardware_type: str
    has_step_markers: bool
    steps: int
    breakdown: StepBreakdown
    input_bound_percent: float | None
    xprof_input_percent: float | None
    device_busy_percent: float | None
    conclusion: str
    diagnostics: tuple[str, ...]
    session: str
    hosts: tuple[str, ...]
    steps_inferred: bool
    step_source: str | None
    slow_stages: tuple[SlowStage, ...]
    wait: Wait  # the input wait: `input_pipeline` in the document
    profile_mb: float
    analysis_seconds: float
    skipped: tuple[str, ...]
    stall_ms: float | None
    profiler_errors: tuple[str, ...]
    profiler_warnings: tuple[str, ...]
    large_profile: str | None

    @property
    def step_time_ms(self) -> float:
        return self.breakdown.step_time_ms

    def to_json(self) -> dict:
        return {
            "hardware_type": self.hardware_type,
            "has_step_markers": self.has_step_markers,
            "steps": self.steps,
            **self.breakdown.to_json(),
            "input_bound_percent": self.input_bound_percent,
            "xprof_input_percent": self.xprof_input_percent,
            "device_busy_percent": self.device_busy_percent,
            "conclusion": self.conclusion,
            "diagnostics": list(self.diagnostics),
            "session": self.session,
            "hosts": list(self.hosts),
            "steps_inferred": self.steps_inferred,
            "step_source": self.step_source,
            "slow_stages": [stage.to_json() for stage in self.slow_stages],
            "input_pipeline": self.wait.to_json(),
            "profile_mb": self.profile_mb,
            "analysis_seconds": self.analysis_seconds,
            "skipped": list(self.skipped),
            "stall_ms": self.stall_ms,
            "profiler_errors": list(self.profiler_errors),
            "profiler_warnings": list(self.profiler_warnings),
            "large_profile": self.large_profile,
        }
