"""What `diagnose` finds in a log folder, as typed values: a Diagnosis of one RunDiagnosis per run with a profile
(an UnreadableRun where the profile could not be read).

The text (rendering.py), the exit status (command.py), the TensorBoard tab and `step-doctor profile` read them by
attribute; `to_json` writes the `diagnose --json` document, its keys in the order the tab's scripts and the
template's run summaries know, and is called only at the edges: the command's --json, the tab's routes, the files
written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from step_doctor.diagnose.cpu_budget import Budget
from step_doctor.diagnose.device import DeviceView
from step_doctor.diagnose.profile_record import Profile
from step_doctor.diagnose.recommendation import Recommendation, Together

UNREADABLE = "unreadable"


@dataclass(frozen=True)
class RunDiagnosis:
    """One run's profile, its verdict, the causes it shows ranked, and what its figures cannot show."""

    verdict: str  # input-bound, device-bound, host-bound, not-input-bound, unknown (diagnose/verdict.py)
    profile: Profile
    device: DeviceView
    recommendations: tuple[Recommendation, ...]
    latent: tuple[Recommendation, ...]  # structural defects that would cost where the step is faster
    how_to_capture: str | None  # how to add step markers, where the profile has none
    unmeasured: str | None  # why the input share is not measured, where it is not
    notes: tuple[str, ...]
    budget: Budget | None = None  # the step's core-ms against its cores, which the estimates respect
    together: Together | None = None  # the speed fixes estimated together

    @property
    def steps_inferred(self) -> bool:
        return self.profile.steps_inferred

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "steps_inferred": self.steps_inferred,
            "profile": self.profile.to_json(),
            "device": self.device.to_json(),
            "recommendations": [r.to_json() for r in self.recommendations],
            "latent": [r.to_json() for r in self.latent],
            "how_to_capture": self.how_to_capture,
            "unmeasured": self.unmeasured,
            "notes": list(self.notes),
            "cpu_budget": self.budget.to_json() if self.budget else None,
            "together": self.together.to_json() if self.together else None,
        }


@dataclass(frozen=True)
class UnreadableRun:
    """A run whose profile could not be read: the paragraph that names the file and what is wrong with it."""

    error: str

    verdict: ClassVar[str] = UNREADABLE
    recommendations: ClassVar[tuple[Recommendation, ...]] = ()
    latent: ClassVar[tuple[Recommendation, ...]] = ()

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "error": self.error, "recommendations": [], "latent": []}


Run = RunDiagnosis | UnreadableRun


@dataclass(frozen=True)
class Diagnosis:
    """Every run with a profile under one log folder, by its name relative to the folder ("." for the folder)."""

    logdir: str
    runs: dict[str, Run]

    def to_json(self) -> dict:
        return {"logdir": self.logdir, "runs": {name: run.to_json() for name, run in self.runs.items()}}
