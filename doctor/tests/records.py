"""Typed doctor records for tests that build them by hand: each with the figures a test gives, the others empty."""

from __future__ import annotations

import dataclasses

from step_doctor.diagnose.device import DeviceView
from step_doctor.diagnose.diagnosis import RunDiagnosis
from step_doctor.diagnose.profile_record import Profile, StepBreakdown
from step_doctor.diagnose.recommendation import SPEED, Recommendation
from step_doctor.diagnose.wait_record import (
    InputWait,
    Stage,
    StageFunctions,
    Stall,
    Unmeasured,
    Wait,
    XlaFigures,
)


def xla(**figures) -> XlaFigures:
    """XLA's figures: not used."""
    empty = dict(
        used=False,
        recorded=True,
        runs_per_step=0.0,
        compile_ms=0.0,
        compile_steps=0,
        compiles=0,
        compile_each_ms=None,
        lowering_each_ms=None,
        per_step_ms=(),
        steps=10,
        shapes=0,
        programs=0,
        ran_shapes=(),
        churn=False,
        warm_up=None,
        executables=0,
        modules=0,
        compiled_shapes=(),
    )
    return XlaFigures(**{**empty, **figures})


def functions(**figures) -> StageFunctions:
    """A stage's function calls."""
    empty = dict(calls_per_step=1.0, work_ms=0.0, wall_ms=0.0, concurrency=None, threads=1, ops_ms={}, top_ops=())
    return StageFunctions(**{**empty, **figures})


def stage(path: str, kind: str, **fields) -> Stage:
    """A stage of the iterator tree: synchronous, not pass-through, no cost."""
    empty = dict(
        ops=(),
        user_ops=(),
        injected=False,
        params={},
        asynchronous=False,
        pass_through=False,
        threads=1,
        instances=1,
        calls_per_step=1.0,
        busy_ms=0.0,
        blocking_ms=0.0,
        blocking_percent=0.0,
        fill_ms=0.0,
        fills=0,
        pulled_per_fill=0,
        element_mb=None,
        functions=None,
    )
    return Stage(path, kind, **{**empty, **fields})


def wait(**figures) -> InputWait:
    """A measured input wait."""
    empty = dict(
        measured=True,
        reason=None,
        step_source="markers",
        inferred=False,
        function=None,
        steps=10,
        steps_left_out=1,
        step_ms=0.0,
        input_ms=0.0,
        input_percent=None,
        getnext_per_step=1.0,
        getnext_floor_ms=None,
        compute_ms=0.0,
        overhead_ms=0.0,
        per_step=(),
        cpu_budget=None,
        autotune=None,
        batch_size=None,
        prefetch=(),
        unattributed_ms=0.0,
        stages=(),
        xla=xla(),
        compile_ms=0.0,
        stall_ms=0.0,
        stall=Stall(gaps_ms=0.0, pipeline_ms=0.0, stretched_steps=0, stretched_ms=0.0),
        replicas=1,
        steps_per_window=1,
        host_compute_ms=0.0,
        device=None,
    )
    return InputWait(**{**empty, **figures})


def profile(of: Wait | None = None, **fields) -> Profile:
    """A profile of the input wait `of` (none measured where None)."""
    empty = dict(
        hardware_type="CPU_ONLY",
        has_step_markers=True,
        steps=10,
        breakdown=StepBreakdown(*[0.0] * len(dataclasses.fields(StepBreakdown))),
        input_bound_percent=None,
        xprof_input_percent=None,
        device_busy_percent=None,
        conclusion="",
        diagnostics=(),
        session="",
        hosts=(),
        steps_inferred=False,
        step_source=None,
        slow_stages=(),
        wait=of or Unmeasured("no steps in this test's profile"),
        profile_mb=0.0,
        analysis_seconds=0.0,
        skipped=(),
        stall_ms=None,
        profiler_errors=(),
        profiler_warnings=(),
        large_profile=None,
    )
    return Profile(**{**empty, **fields})


def recommendation(cause: str, estimated_gain: float, kind: str = SPEED, **fields) -> Recommendation:
    empty = dict(title=cause, score=0.0, removes_ms=0.0, evidence="", fix="")
    return Recommendation(cause=cause, kind=kind, estimated_gain=estimated_gain, **{**empty, **fields})


def run(verdict: str, recommendations=(), of: Profile | None = None, **fields) -> RunDiagnosis:
    """A run's diagnosis (of a profile without figures where `of` is None)."""
    empty = dict(
        device=DeviceView(cpu_only=True, busy_percent=None, unmeasured=None),
        latent=(),
        how_to_capture=None,
        unmeasured=None,
        notes=(),
    )
    return RunDiagnosis(verdict, of or profile(), recommendations=tuple(recommendations), **{**empty, **fields})
