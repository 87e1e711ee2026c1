"""The recommendations for one profile: input-pipeline and step causes, ranked together."""

from __future__ import annotations

from step_doctor.diagnose.device import DeviceView, view
from step_doctor.diagnose.input_causes import input_causes
from step_doctor.diagnose.recommendation import Causes, Recommendation, rank
from step_doctor.diagnose.stalls import working_step
from step_doctor.diagnose.step_causes import device_causes, per_step_overhead, recompilation
from step_doctor.diagnose.structural import latent_fixes, structural_fixes
from step_doctor.diagnose.verdict import INPUT_BOUND


def recommendations(
    profile: dict, config: dict | None = None, device: DeviceView | None = None
) -> list[Recommendation]:
    """The causes this profile shows, ranked: what changes what is learned first, then most step time removed;
    then, when the run is input-bound, the structural fixes its pipeline tree shows that none of those makes
    (when it is not, `latent` lists them apart).

    `config` is the run's config.yaml where there is one (it tells the precision the run trained in);
    `device` what the run and the profile say about the device (diagnose/device.py).
    """
    device = device or view(profile)
    if profile["input_bound_percent"] is None or not profile["step_time_ms"]:
        return []
    wait = profile.get("input_pipeline") or {}
    pipeline = Causes(working_step(wait))  # figures of the host trace's steps, without their stall
    input_causes(wait, device.cpu_only, pipeline)
    if wait.get("measured"):
        per_step_overhead(wait, pipeline)
        recompilation(wait, pipeline)
    step = Causes(profile["step_time_ms"])  # figures of xprof's step breakdown
    device_causes(profile, config or {}, device.busy_percent, step)
    ranked = rank(pipeline.found + step.found)
    if profile["input_bound_percent"] >= INPUT_BOUND:
        ranked += structural_fixes(wait, device.cpu_only, ranked)
    return ranked


def latent(profile: dict, ranked: list[Recommendation], device: DeviceView | None = None) -> list[Recommendation]:
    """A run that is not input-bound: the structural defects its pipeline tree shows that `ranked` does not fix, as
    notes of what they would cost where the step is faster (diagnose/structural.py)."""
    wait = profile.get("input_pipeline") or {}
    share = profile["input_bound_percent"]
    if share is None or share >= INPUT_BOUND or not profile["step_time_ms"] or not wait.get("measured"):
        return []
    return latent_fixes(wait, (device or view(profile)).cpu_only, ranked)
