"""What a recommendation is, how its gain is estimated, and the one builder every cause uses.

A recommendation names one cause a profile shows, in the input pipeline (input_causes.py) or in
the step itself (step_causes.py), with this profile's figures, the step time its fix would remove
and the estimated gain: step time / (step time - time removed), per example. A cause that changes
what the model learns removes no time and ranks first; the others rank by the time they remove,
and one estimated to gain less than MIN_GAIN is left out. A structural defect of a run that is not
input-bound is LATENT: listed after them, with what it would cost where the step is faster.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from step_doctor.diagnose.dataset_sources import SourceLine
from step_doctor.diagnose.proofs import Proof

MIN_GAIN = 1.05  # leave out fixes that would gain less than this (a share of step time, not a duration)
MOST_REMOVED = 0.95  # never promise more than 20x from one fix
SPEED, CORRECTNESS, LATENT = "speed", "correctness", "latent"


def gain(step_ms: float, removed_ms: float) -> float:
    """The estimated speed-up per example of a fix that removes `removed_ms` of a `step_ms` step."""
    removed = min(max(removed_ms, 0.0), MOST_REMOVED * step_ms)
    return round(step_ms / (step_ms - removed), 2) if step_ms > 0 else 1.0


def ms(value: float) -> str:
    return f"{value:.1f} ms" if value >= 0.95 else f"{value:.2f} ms"


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


@dataclass(frozen=True)
class Recommendation:
    cause: str  # a stable name: "python-in-map", "no-prefetch", ...
    title: str
    kind: str  # SPEED; CORRECTNESS: it changes what is learned; LATENT: costs little at this step time
    score: float  # percent of step time the fix removes
    removes_ms: float
    estimated_gain: float
    evidence: str  # this profile's figures
    fix: str  # plain tf.data / Keras first, then this template's knob
    caveat: str | None = None  # what the estimate assumes, what the trace cannot tell
    stage: str | None = None  # the tf.data stage it names ("Iterator::Root::MapAndBatch"), None for step causes
    if_faster: str | None = None  # LATENT: what it would cost where the step is faster
    built_at: SourceLine | None = None  # the user's line that built `stage`, where profile recorded it
    estimates: dict[str, float] | None = None  # where the fix offers several: each one's estimated gain, by the name
    # profile --prove applies it under (parallel-calls, cache, ...)
    proofs: tuple[Proof, ...] = ()  # what `profile --prove` measured for its fixes, where it tested them
    frees: tuple[float, float, bool] | None = None  # (wait ms, core-ms, covers the stages below) its fix removes per
    # step, where the estimate was
    # made within the cores' budget (cpu_budget.py): how fixes are estimated together; not written out

    def to_json(self) -> dict:
        found = dataclasses.asdict(self)
        del found["frees"]
        return found


class Causes:
    """The recommendations found in one profile, each scored against its step time as it is added."""

    def __init__(self, step_ms: float):
        self.step_ms = step_ms
        self.found: list[Recommendation] = []

    def add(self, cause, title, removes_ms, evidence, fix, caveat=None, kind=SPEED, stage=None, removes=None) -> None:
        """`removes`: where the fix offers several, the time each removes, by name (Recommendation.estimates)."""
        step = self.step_ms
        self.found.append(
            Recommendation(
                cause=cause,
                title=title,
                kind=kind,
                score=round(100 * removes_ms / step, 1) if step else 0.0,
                removes_ms=round(removes_ms, 3),
                estimated_gain=gain(step, removes_ms),
                evidence=evidence,
                fix=fix,
                caveat=caveat,
                stage=stage,
                estimates={name: gain(step, ms) for name, ms in removes.items()} if removes else None,
                frees=(
                    (removes_ms.wait_ms, removes_ms.work_ms, removes_ms.covers_below)
                    if hasattr(removes_ms, "work_ms")
                    else None
                ),
            )
        )


@dataclass(frozen=True)
class Together:
    """The speed fixes of the ranked list estimated together, within the cores' budget (cpu_budget.Budget.together)."""

    causes: tuple[str, ...]
    removes_ms: float
    estimated_gain: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def together(ranked: list[Recommendation], budget, step_ms: float, input_ms: float, least: int = 2) -> Together | None:
    """The speed fixes of `ranked` whose estimates were made within `budget`, estimated together; None for fewer
    than `least`."""
    fixes = [r for r in ranked if r.kind == SPEED and r.frees is not None]
    if not fixes or len(fixes) < least:
        return None
    removed = budget.together([(r.stage, *r.frees) for r in fixes], input_ms)
    return Together(tuple(r.cause for r in fixes), round(removed, 3), gain(step_ms, removed))


def rank(found: list[Recommendation]) -> list[Recommendation]:
    """What changes what is learned first, then the most step time removed; fixes below MIN_GAIN left out."""
    kept = [r for r in found if r.kind == CORRECTNESS or r.estimated_gain >= MIN_GAIN]
    return sorted(kept, key=lambda r: (r.kind != CORRECTNESS, -r.removes_ms))
