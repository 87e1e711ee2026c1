"""Diagnose any TensorBoard log folder that holds a profile: the JSON document of `diagnose`.

Works on profiles written by this project and by others: a bare `tf.profiler` log folder,
or a TensorBoard log folder with several runs. It reads the profile (xprof's offline
converter, no TensorFlow import), never the code, to name the cause; the run's config.yaml,
where this template wrote one, only for the precision it trained in.

- Steps come from step markers, else are inferred from the host trace (the stock Keras
  TensorBoard callback's "Profiled batch" events, or the executions of the train function);
  inferred figures are labelled so, with how to add markers.
- The verdict: diagnose/verdict.py. Recommendations name the causes the profile shows
  (diagnose/input_causes.py, diagnose/step_causes.py), each with this profile's
  figures, the step time its fix removes and the estimated gain (diagnose/ranked_causes.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from step_doctor.diagnose import analysis, xla
from step_doctor.diagnose.blame import Pipeline
from step_doctor.diagnose.cpu_budget import ProcessCpu
from step_doctor.diagnose.dataset_sources import Sources
from step_doctor.diagnose.device import DeviceView, run_record, view
from step_doctor.diagnose.diagnosis import Diagnosis, Run, RunDiagnosis, UnreadableRun
from step_doctor.diagnose.profile_record import Profile
from step_doctor.diagnose.proofs import Proofs
from step_doctor.diagnose.ranked_causes import latent, recommendations
from step_doctor.diagnose.recommendation import Causes
from step_doctor.diagnose.recommendation import together as together_of
from step_doctor.diagnose.stalls import working_step
from step_doctor.diagnose.structural import padding_share
from step_doctor.diagnose.verdict import verdict
from step_doctor.diagnose.wait_record import InputWait
from step_doctor.errors import UserError

HOW_TO_CAPTURE = (
    "Step markers give exact steps: `from step_doctor.callbacks import StepTraceProfiler` and pass "
    "`callbacks=[StepTraceProfiler(logdir, start_step=10, num_steps=10)]` to model.fit (it wraps each step in "
    "tf.profiler.experimental.Trace('train', step_num=step, _r=1), around fetching the batch and running it). "
    "The stock Keras TensorBoard(profile_batch=...) callback writes no step marker (openxla/xprof#578), so xprof "
    "itself shows no step time for it."
)
HOW_TO_CAPTURE_JAX = (
    "Step markers give exact steps: wrap each training step, fetching its batch included, in "
    "`with jax.profiler.StepTraceAnnotation('train', step_num=step):` (`step-doctor profile` adds them to Keras fit on "
    "the JAX backend). Without them the steps are inferred from the executions of the jitted step."
)
CPU_ONLY_NOTE = (
    "CPU-only profile: the input pipeline and the model share the same cores, so a stage that looks slow may be "
    "starved by the model, and overlap (prefetch, parallel calls) gains less here than on a GPU host; estimates "
    "keep within the cores' budget (below the fixes), and a fix that removes work frees cores for the model too."
)


def _how_to_capture(profile: Profile) -> str:
    return HOW_TO_CAPTURE_JAX if isinstance(profile.wait, InputWait) and profile.wait.jax else HOW_TO_CAPTURE


def _run_config(session: Path) -> dict:
    """The run's config.yaml (this template's runs have one), or {} for foreign logs; used for precision only."""
    run_dir = session.parent.parent.parent
    for candidate in (run_dir / "config.yaml", run_dir.parent / "config.yaml"):
        if candidate.is_file():
            try:
                values = yaml.safe_load(candidate.read_text())
                return values if isinstance(values, dict) else {}
            except yaml.YAMLError:
                return {}
    return {}


def _no_profile_message(logdir: Path) -> str:
    strays = []
    for folder in sorted(logdir.rglob("plugins/profile/*")):
        if folder.is_dir():
            names = sorted(p.name for p in folder.iterdir())[:4]
            strays.append(f"{folder} ({', '.join(names) or 'empty'})")
    found = (
        f" Found profile folders without one: {'; '.join(strays[:3])}: xprof 2.24 reads only .xplane.pb files."
        if strays
        else ""
    )
    return f"No TensorBoard profile under '{logdir}' (no plugins/profile/*/*.xplane.pb).{found} " + HOW_TO_CAPTURE


def diagnose(logdir: str | Path) -> Diagnosis:
    """Every run with a profile under logdir: its verdict, profile, recommendations and notes."""
    logdir = Path(logdir)
    if not logdir.exists():
        raise UserError(f"Log folder '{logdir}' does not exist. Pass a TensorBoard log folder, e.g. runs/compare.")
    sessions = analysis.find_profile_sessions(logdir)
    if not sessions:
        raise UserError(_no_profile_message(logdir))
    runs: dict[str, Run] = {}
    for run, session in sessions.items():
        try:
            profile = analysis.analyze_session(session)
        except analysis.ProfileError as error:
            runs[run] = UnreadableRun(str(error))
            continue
        runs[run] = diagnose_run(profile, session)
    return Diagnosis(str(logdir), runs)


def diagnose_run(profile: Profile, session: Path) -> RunDiagnosis:
    """One run's diagnosis, from its profile and the records beside it (summary.json, config.yaml)."""
    record = run_record(session)
    device, padding = view(profile, record), padding_share(record)
    cpu = ProcessCpu.beside(session)  # what the process used over the profile's window, where it was recorded
    ranked = recommendations(profile, _run_config(session), device, padding, cpu)
    found = latent(profile, ranked, device, padding, cpu)
    budget = together = None
    wait = profile.wait
    if isinstance(wait, InputWait) and wait.measured and profile.step_time_ms:
        pipeline = Pipeline(wait, device.cpu_only, Causes(working_step(wait)), cpu)
        budget = pipeline.budget
        together = together_of(ranked, budget, pipeline.step, pipeline.input_ms)
    sources = Sources.beside(session)
    if sources is not None:  # `step-doctor profile` recorded where the script built its datasets
        lines = sources.lines(s.path for s in profile.wait.stages) if isinstance(profile.wait, InputWait) else {}
        ranked, found = ([replace(r, built_at=lines.get(r.stage)) for r in group] for group in (ranked, found))
    proofs = Proofs.beside(session)
    if proofs is not None:  # `step-doctor profile --prove` measured the fixes
        ranked = [replace(r, proofs=proofs.of(r.cause, r.stage)) for r in ranked]
    return RunDiagnosis(
        verdict=verdict(profile, device),
        profile=profile,
        device=device,
        recommendations=tuple(ranked),
        latent=tuple(found),
        how_to_capture=None if profile.has_step_markers else _how_to_capture(profile),
        unmeasured=None if profile.input_bound_percent is not None else profile.wait.reason,
        notes=tuple(notes(profile, device)),
        budget=budget,
        together=together,
    )


def notes(profile: Profile, device: DeviceView | None = None) -> list[str]:
    """What the figures cannot show in this profile: a device's share, shared cores, XLA's compiles (diagnose/xla.py),
    producers that left no events."""
    device = device or view(profile)
    found = [device.unmeasured] if device.unmeasured else []
    wait = profile.wait
    if not isinstance(wait, InputWait) or not wait.measured:
        return found
    found += [CPU_ONLY_NOTE] if device.cpu_only else []
    found += xla.notes(wait)
    lost, input_ms = wait.unattributed_ms or 0.0, wait.input_ms or 0.0
    if input_ms >= 0.1 * wait.step_ms and lost >= 0.25 * input_ms:
        held = max((s for s in wait.stages if s.pass_through), key=lambda s: s.blocking_ms)
        found.append(
            f"Unseen producers: {lost:.1f} ms of the {input_ms:.1f} ms input wait per step "
            f"({100 * lost / input_ms:.0f} %) waits on {held.path}, whose producer threads left no events in this "
            "profile, so the causes above miss that share. TensorFlow 2.17's profiler drops the events of threads "
            "that ended before the capture stopped (each epoch's iterator threads end with its epoch); 2.21 keeps "
            "them. Profile steps within one epoch, or `.repeat()` the dataset and pass steps_per_epoch, to see them."
        )
    return found
