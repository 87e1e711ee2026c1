"""The recommendations for one profile: input-pipeline and step causes, ranked together."""

from __future__ import annotations

from step_doctor.diagnose.cpu_budget import ProcessCpu
from step_doctor.diagnose.device import DeviceView, view
from step_doctor.diagnose.input_causes import input_causes
from step_doctor.diagnose.jax_causes import jax_causes
from step_doctor.diagnose.profile_record import Profile
from step_doctor.diagnose.recommendation import Causes, Recommendation, rank
from step_doctor.diagnose.stalls import working_step
from step_doctor.diagnose.step_causes import device_causes, per_step_overhead, recompilation
from step_doctor.diagnose.structural import latent_fixes, padding_latent, structural_fixes, unbucketed_padding
from step_doctor.diagnose.verdict import INPUT_BOUND
from step_doctor.diagnose.wait_record import InputWait


def recommendations(
    profile: Profile,
    config: dict | None = None,
    device: DeviceView | None = None,
    padding: float | None = None,
    cpu: ProcessCpu | None = None,
) -> list[Recommendation]:
    """The causes this profile shows, ranked: what changes what is learned first, then most step time removed;
    then, when the run is input-bound, the structural fixes its pipeline tree shows that none of those makes
    (when it is not, `latent` lists them apart).

    `config` is the run's config.yaml where there is one (it tells the precision the run trained in);
    `device` what the run and the profile say about the device (diagnose/device.py); `padding` the share of padded
    token slots the run recorded (structural.padding_share of its summary.json): a padded_batch without bucketing
    ranks with what padding costs the model where it is known, and is listed as a structural fix where it is not;
    `cpu` what the process used over the profile's window (process_cpu.json: the estimates' budget, cpu_budget.py).
    """
    device = device or view(profile)
    if profile.input_bound_percent is None or not profile.step_time_ms:
        return []
    wait = profile.wait
    pipeline = Causes(working_step(wait))  # figures of the host trace's steps, without their stall
    input_causes(wait, device.cpu_only, pipeline, cpu)
    jax_causes(wait, pipeline)  # a JAX-made profile's own: Python input, device copies, recompiling (jax_causes.py)
    if isinstance(wait, InputWait) and wait.measured:
        per_step_overhead(wait, pipeline)
        if wait.jax is None:
            recompilation(wait, pipeline)
    step = Causes(profile.step_time_ms)  # figures of xprof's step breakdown
    device_causes(profile, config or {}, device.busy_percent, step)
    padded = unbucketed_padding(wait, padding)
    ranked = rank(pipeline.found + step.found + (padded if padding is not None else []))
    if profile.input_bound_percent >= INPUT_BOUND:
        ranked += structural_fixes(wait, device.cpu_only, ranked, cpu)
        ranked += [r for r in padded if r not in ranked]
    return ranked


def latent(
    profile: Profile,
    ranked: list[Recommendation],
    device: DeviceView | None = None,
    padding: float | None = None,
    cpu: ProcessCpu | None = None,
) -> list[Recommendation]:
    """A run that is not input-bound: the structural defects its pipeline tree shows that `ranked` does not fix, as
    notes of what they would cost where the step is faster (diagnose/structural.py); a padded_batch without
    bucketing that does not rank among them (its padding share unknown, or its cost under 5 %) too."""
    wait = profile.wait
    share = profile.input_bound_percent
    if share is None or share >= INPUT_BOUND or not profile.step_time_ms or not wait.measured:
        return []
    cpu_only = (device or view(profile)).cpu_only
    padded = [
        r for r in unbucketed_padding(wait, padding) if (r.cause, r.stage) not in {(o.cause, o.stage) for o in ranked}
    ]
    return latent_fixes(wait, cpu_only, ranked, cpu) + padding_latent(padded)
