"""What `step-doctor profile --prove` measured for the fixes a run's diagnosis names (profile/prove.py).

prove writes <run>/proofs.json beside the run's profile; the analyser attaches each proof to the
recommendation it tested (by cause and stage), so the CLI, the JSON, the Text tab and the Diagnose
tab show "proved x3.0, estimated x2.8" wherever the estimate is shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

FILE = "proofs.json"
PROVED, NO_GAIN, SLOWER, UNCLEAR, NOT_PROVED = "proved", "no gain", "slower", "unclear", "not proved"


@dataclass(frozen=True)
class Proof:
    """One fix (or several together) measured in paired trials of the unchanged script, against no fix."""

    label: str  # "parallel calls at my_train.py:21"
    fixes: tuple[str, ...]  # the fix names applied: parallel-calls, cache, prefetch, parallel-reads
    causes: tuple[str, ...]  # the recommendations it tests: their cause names
    stages: tuple[str | None, ...]  # and the stages they name, one each
    verdict: str  # PROVED, NO_GAIN, SLOWER, UNCLEAR, or NOT_PROVED (it could not be applied or measured)
    gain: float | None = None  # median over rounds of (step time without the fix) / (step time with it)
    low: float | None = None  # the lowest and highest round
    high: float | None = None
    rounds: int = 0
    noise: float | None = None  # the A/A control's largest distance from 1 (two unfixed trials of one round pair)
    estimated_gain: float | None = None
    why: str | None = None  # NOT_PROVED: why; else what it assumed

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, item: dict) -> Proof:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in item.items() if k in known}
        for name in ("fixes", "causes", "stages"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values)

    @property
    def text(self) -> str:
        if self.verdict == NOT_PROVED:
            return f"not proved: {self.why}"
        control = f"A/A within {self.noise:.1%}" if self.noise is not None else "no A/A control"
        spread = f"x{self.low:.2f}-x{self.high:.2f} over {self.rounds} rounds; {control}"
        estimate = f", estimated x{self.estimated_gain:.2f}" if self.estimated_gain else ""
        return f"{self.verdict} x{self.gain:.2f} ({spread}){estimate}"


@dataclass(frozen=True)
class Proofs:
    """A run's proofs: one per fix, and the fixes together."""

    each: tuple[Proof, ...]
    together: Proof | None

    @classmethod
    def beside(cls, session: Path) -> Proofs | None:
        path = session.parent.parent.parent / FILE
        try:
            document = json.loads(path.read_text())
            each = tuple(Proof.from_json(item) for item in document.get("each") or ())
            together = document.get("together")
            return cls(each, Proof.from_json(together) if together else None)
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def of(self, cause: str, stage: str | None) -> tuple[Proof, ...]:
        """The proofs of this recommendation's fixes, where prove tested them: the greatest measured gain first."""
        found = [proof for proof in self.each if (cause, stage) in zip(proof.causes, proof.stages)]
        return tuple(sorted(found, key=lambda p: -(p.gain or 0.0)))
