"""The text `diagnose` prints: one summary line per run, then each run's figures, tree and recommendations."""

from __future__ import annotations

from step_doctor.diagnose import xla
from step_doctor.diagnose.device import DeviceView
from step_doctor.diagnose.diagnosis import Diagnosis, Run, RunDiagnosis
from step_doctor.diagnose.profile_record import Profile
from step_doctor.diagnose.recommendation import CORRECTNESS, Recommendation
from step_doctor.diagnose.report import HOW_TO_CAPTURE
from step_doctor.diagnose.stalls import left_out
from step_doctor.diagnose.wait_record import InputWait, Wait


def _summary(run: str, item: Run) -> str:
    if not isinstance(item, RunDiagnosis):
        return f"{run}: UNREADABLE profile (see below)"
    profile = item.profile
    if profile.input_bound_percent is None:
        return f"{run}: verdict unknown ({item.unmeasured or 'no input share'})"
    how = "inferred steps" if item.steps_inferred else "step markers"
    first = item.recommendations[0] if item.recommendations else None
    fix = f"; first: {first.cause} ({first.estimated_gain:.2f}x)" if first else "; nothing to fix"
    share = profile.input_bound_percent
    wait = profile.wait
    step = (wait.step_ms if isinstance(wait, InputWait) else None) or profile.step_time_ms
    stall = f" ({left_out(wait):.1f} ms of it stalled, left out)" if left_out(wait) > 0 else ""
    return f"{run}: {item.verdict.upper()}, {share:.1f}% of a {step:.1f} ms step{stall} waits for input ({how}){fix}"


def _tree(wait: InputWait) -> list[str]:
    lines = []
    for s in wait.stages:
        depth = s.path.count("::") - 1
        notes = []
        if s.injected:
            notes.append("injected by tf.data")
        for key in ("parallelism", "batch_size", "buffer_limit", "buffer_size"):
            if key in s.params:
                notes.append(f"{key} {s.params[key]}")
        if s.functions:
            notes.append(f"fn {s.functions.work_ms:.1f} ms/step, {s.functions.concurrency or 0:.1f} at a time")
        if s.blocking_ms + s.fill_ms >= 0.01 * wait.step_ms:
            notes.append(f"holds the step {s.blocking_ms + s.fill_ms:.1f} ms/step")
        lines.append("    " + "  " * max(depth, 0) + s.kind + (f"  [{'; '.join(notes)}]" if notes else ""))
    return lines


def _figures(profile: Profile, device: DeviceView) -> list[str]:
    stall = left_out(profile.wait)
    without = f" (without the step's {stall:.1f} ms stall, below)" if stall > 0 else ""
    busy = device.busy_percent
    if busy is not None:
        busy_text = f"{busy:.1f}%"
    else:
        busy_text = "n/a (CPU-only profile)" if device.cpu_only else "not measured (see the note below)"
    step = profile.breakdown
    compiled = f" + compile {step.compile_ms:.1f}" if step.compile_ms else ""
    return [
        f"  step {step.step_time_ms:.1f} ms = input {step.input_ms:.1f} + host compute "
        f"{step.host_compute_ms:.1f} + device compute {step.device_compute_ms:.1f} + launch "
        f"{step.kernel_launch_ms:.1f}{compiled} + other {step.other_ms:.1f} ms",
        f"  waiting for input: {profile.input_bound_percent:.1f}% of step time{without}; device busy: {busy_text}",
    ]


def _source(profile: Profile, wait: Wait) -> str:
    source = profile.step_source or "none found"
    if not isinstance(wait, InputWait) or not wait.measured:
        return source
    per_window, replicas = wait.steps_per_window or 1, wait.replicas or 1
    if replicas > 1:
        source += f", {replicas} replicas (a distribution strategy): each step reads one batch per replica"
    if per_window > 1:
        source += f", each {per_window} training steps (steps_per_execution): figures are per execution"
    return source


def _stall(wait: Wait) -> list[str]:
    """The step time without recorded work (diagnose/stalls.py), where there is any."""
    if not isinstance(wait, InputWait) or not wait.measured:
        return []
    stall = wait.stall_ms or 0.0
    if stall <= 0:
        return []
    found, outside = wait.stall, left_out(wait)
    parts = []
    if found.gaps_ms:
        parts.append(
            f"{found.gaps_ms:.1f} ms in gaps of 1 ms or more in which the training thread waited in the train "
            "function and no thread, op or device of the step recorded anything"
        )
    if found.stretched_steps:
        parts.append(
            f"{found.stretched_ms:.1f} ms in {found.stretched_steps} step(s) whose Python, dispatch or model ops "
            "took far longer than the same in the other steps (or work done only in some steps, e.g. a callback "
            "every N steps)"
        )
    text = f"  no recorded work: {stall:.1f} ms per step ({100 * stall / wait.step_ms:.0f}% of the step), "
    text += "; ".join(parts) + ". Per-step overhead leaves it out."
    if found.pipeline_ms:
        text += (
            f" In {found.pipeline_ms:.1f} ms of it the input pipeline's threads ran: the step waited for cores they "
            "held, which a fix of the pipeline gives back, so shares and estimates count it."
        )
    if outside > 0:
        text += (
            f" The other {outside:.1f} ms shows no work of the pipeline either: the process was likely descheduled "
            "(other load), so shares and estimates are of the step without it."
        )
        if outside >= 0.1 * wait.step_ms:
            text += " Figures from a busy machine: profile on a quieter one to confirm them."
    return [text]


def _pipeline(wait: Wait) -> list[str]:
    if not isinstance(wait, InputWait) or not wait.measured:
        return []
    if wait.jax is not None and not wait.jax.tf_data:
        return [_python_input(wait)]
    batch, prefetch = wait.batch_size, wait.prefetch
    if prefetch:
        kinds = ", ".join("injected by tf.data" if p.injected else "yours" for p in prefetch)
        prefetch_text = f"yes ({kinds})"
    else:
        prefetch_text = "none"
    return [
        f"  batch: {batch if batch else 'unknown'}; prefetch: {prefetch_text}; tf.data cores: "
        f"{wait.cpu_budget or 'unknown'}; the tf.data pipeline as it ran:",
        *_tree(wait),
    ]


def _python_input(wait: InputWait) -> str:
    """A JAX-made profile's batches fetched in Python (jax_steps.py): where, and how long a step."""
    jax = wait.jax
    frames = ", ".join(f"{f.frame} {f.ms:.2f} ms" for f in jax.python_input) or "no frame of yours recorded"
    return (
        f"  batches: fetched in Python on the step's thread, {jax.fetch_ms:.2f} ms a step ({jax.overlapped_ms:.2f} ms "
        f"of it beside the model's work): {frames}; the jitted step: {jax.function or 'unknown'}"
    )


def _recommendations(recommendations: tuple[Recommendation, ...]) -> list[str]:
    lines = []
    for rank, rec in enumerate(recommendations, start=1):
        gain = "" if rec.kind == CORRECTNESS else f", estimated gain {rec.estimated_gain:.2f}x"
        lines.append(f"  {rank}. {rec.title} [{rec.cause}{gain}]")
        for proof in rec.proofs:
            lines.append(f"     {proof.label}: {proof.text}")
        lines.append(f"     evidence: {rec.evidence}.")
        lines += _built_at(rec)
        lines.append(f"     fix: {rec.fix}")
        if rec.caveat:
            lines.append(f"     note: {rec.caveat}")
    if not recommendations:
        lines.append("  nothing to fix: no known cause would gain 5% or more in this profile.")
    return lines


def _together(item: RunDiagnosis) -> list[str]:
    """The speed fixes estimated together, and the budget every estimate kept within."""
    lines = []
    if item.together:
        both = item.together
        lines.append(f"  together: {' + '.join(both.causes)}, estimated gain {both.estimated_gain:.2f}x")
    if item.budget and item.recommendations:
        lines.append(f"  estimates within the cores' budget: {item.budget.words}.")
    return lines


def _built_at(rec: Recommendation) -> list[str]:
    where = rec.built_at
    return [f"     built at: {where.short()}: {where.code}"] if where else []


def _latent(notes: tuple[Recommendation, ...]) -> list[str]:
    """Structural defects of a run that does not wait for input: not ranked, said with what they would cost."""
    lines = []
    padding = [rec for rec in notes if rec.cause == "unbucketed-padding"]
    others = [rec for rec in notes if rec not in padding]
    if others:
        lines.append("  not costing this run, but in its pipeline (they would cost where the step is faster):")
    lines += _latent_notes(others)
    if padding:
        lines.append("  not ranked, in how its batches are padded:")
    return lines + _latent_notes(padding)


def _latent_notes(notes: list[Recommendation]) -> list[str]:
    lines = []
    for rec in notes:
        lines.append(f"  - {rec.title} [{rec.cause}, latent]")
        lines.append(f"     evidence: {rec.evidence}.")
        lines.append(f"     {rec.if_faster}")
        lines += _built_at(rec)
        lines.append(f"     fix: {rec.fix}")
        lines.append(f"     note: {rec.caveat}")
    return lines


def _run(item: Run) -> list[str]:
    if not isinstance(item, RunDiagnosis):
        return [f"  {item.error}"]
    profile = item.profile
    wait = profile.wait
    about = f"{profile.hardware_type}, {profile.steps} steps, {profile.profile_mb:,.1f} MB"
    lines = [f"  profile: {profile.session} ({about})"]
    lines += [f"  {note}" for note in [profile.large_profile, *profile.skipped] if note]
    lines.append(f"  steps: {_source(profile, wait)}" + (" (INFERRED: no step markers)" if item.steps_inferred else ""))
    if profile.input_bound_percent is None:
        lines.append(f"  verdict: unknown - {item.unmeasured or 'the input share could not be measured'}.")
        lines += [f"  {note}" for note in item.notes]
        lines.append(f"  {HOW_TO_CAPTURE}")
        return lines
    label = " (inferred steps)" if item.steps_inferred else ""
    lines.append(f"  verdict: {item.verdict.upper()}{label}")
    lines += _figures(profile, item.device) + _stall(wait) + _pipeline(wait)
    lines += [f"  {line}" for line in [xla.summary(wait)] if line]
    if profile.has_step_markers and profile.conclusion:
        lines.append(f"  xprof: {profile.conclusion}")
    lines += _recommendations(item.recommendations) + _together(item) + _latent(item.latent)
    lines += [f"  {note}" for note in item.notes]
    if item.how_to_capture:
        lines.append(f"  {item.how_to_capture}")
    return lines


def render(result: Diagnosis) -> str:
    """The text of a diagnosis (diagnose/report.py), as `step-doctor diagnose` prints it."""
    lines = [_summary(run, item) for run, item in result.runs.items()]
    for run, item in result.runs.items():
        lines += ["", f"== {run} =="] + _run(item)
    return "\n".join(lines)
