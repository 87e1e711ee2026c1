"""`step-doctor profile --prove`: apply the fixes the diagnosis names and measure them, in paired trials.

After the profile run, each fix the first recommendations name that can be applied in memory
(site/fixes.py: parallel calls on a map, cache after a finite map, prefetch, parallel reads) is
tried on the unchanged command: every trial is a fresh run of it, with no profiler, that times a
window of steps after the warm-up and ends there. A round runs the command without a fix and with
each fix (alone, then all together), in an order that turns every round, so no fix is always run
first or last; the gain of a fix in a round is the step time without it over the step time with it,
and the A/A control is two runs without a fix in adjacent rounds. A fix whose every round gains
more than the A/A control's noise is proved; its median and spread are reported beside the
estimate, in <run>/proofs.json (the diagnosis shows them), and the fixes proved are written as a
patch of the user's source (patch.py). Fixes that change what the script computes (the order of
records: parallel reads) are tried only when --allow names them.

Ctrl-C or SIGTERM ends the running trial and reports what the trials measured so far; the
command's own exit status, from the profile run, is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from step_doctor import files
from step_doctor.diagnose.diagnosis import RunDiagnosis
from step_doctor.diagnose.proofs import FILE, NO_GAIN, NOT_PROVED, PROVED, SLOWER, UNCLEAR, Proof
from step_doctor.diagnose.recommendation import CORRECTNESS
from step_doctor.diagnose.recommendation import together as together_of
from step_doctor.profile import patch, runner

# cause -> the fixes that test it in memory, each with what it needs to be allowed (None: it changes nothing computed)
FIXES_FOR = {
    "sequential-map": ("parallel-calls", "cache"),
    "python-in-map": ("parallel-calls",),
    "decode-every-epoch": ("cache",),
    "heavy-map": ("cache", "parallel-calls"),
    "no-prefetch": ("prefetch",),
    "sequential-file-reads": ("parallel-reads",),
}
NEEDS_ALLOW = {"parallel-reads": "order"}  # reading files interleaved changes the order of the records
NAMES = {
    "parallel-calls": "parallel calls",
    "cache": "cache",
    "prefetch": "prefetch",
    "parallel-reads": "parallel reads",
}
WARM_UP = 6  # steps left out at the start of every trial: tracing, compiling, autotune filling buffers
WINDOW_S = 3.0  # the timed window, at the profile's step time
LONGEST_PASS_S = 60.0  # cache is proved only where its first pass (before the window) takes at most this
TOP = 3  # the recommendations whose fixes are tried


@dataclass
class Candidate:
    label: str
    fixes: list[dict]  # {"name", "file", "line", "kind"}
    causes: list[str]
    stages: list[str | None]
    estimated_gain: float | None
    times: list[float | None] = field(default_factory=list)  # seconds per step, one per round
    applied: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class Stopped(Exception):
    """A signal ended the trials."""


def plan(item: RunDiagnosis, allow: set[str], cwd: Path) -> tuple[list[Candidate], list[Proof]]:
    """The fixes to try for a run's first recommendations, and a NOT_PROVED proof for each that cannot be."""
    candidates: dict[tuple, Candidate] = {}
    unproved: list[Proof] = []
    ranked = [r for r in item.recommendations if r.kind != CORRECTNESS][:TOP]
    for rec in ranked:
        names = FIXES_FOR.get(rec.cause, ())
        where = rec.built_at
        why = None
        if not names:
            why = "no fix of this cause can be applied without changing your code (see the fix)"
        elif where is None:
            why = "the line that built its stage is not known (the stage was built by a library, or not recorded)"
        if why:
            unproved.append(_unproved(rec.title, rec.cause, rec.stage, rec.estimated_gain, why))
            continue
        for name in names:
            if rec.estimates is not None and name not in rec.estimates:
                continue  # a fix this cause does not offer here (no cache after a map that may be random)
            if name in NEEDS_ALLOW and NEEDS_ALLOW[name] not in allow:
                why = (
                    f"{NAMES[name]} changes the {NEEDS_ALLOW[name]} of what the script reads; "
                    f"--allow {NEEDS_ALLOW[name]} tries it"
                )
                unproved.append(_unproved(f"{NAMES[name]} at {where.short(cwd)}", rec.cause, rec.stage, None, why))
                continue
            fix = {"name": name, "file": where.file, "line": where.line, "kind": where.kind}
            key = (name, where.file, where.line)
            if key in candidates:
                candidates[key].causes.append(rec.cause)
                candidates[key].stages.append(rec.stage)
                continue
            if rec.estimates:
                estimate = rec.estimates.get(name)
            else:
                estimate = rec.estimated_gain if len(names) == 1 else None
            label = f"{NAMES[name]} at {where.short(cwd)}"
            candidates[key] = Candidate(label, [fix], [rec.cause], [rec.stage], estimate)
    found = list(candidates.values())
    if len(found) > 1:
        tried = [r for r in ranked if any(r.cause in c.causes for c in found)]
        together = Candidate(
            "all together", [f for c in found for f in c.fixes], [], [], _together_estimate(item, tried)
        )
        found.append(together)
    return found, unproved


def _together_estimate(item: RunDiagnosis, tried: list) -> float | None:
    """The gain of the tried recommendations' fixes together, within the cores' budget (recommendation.together);
    None where one of them was not estimated within it."""
    budget = item.budget
    if budget is None or any(r.frees is None for r in tried):
        return None
    found = together_of(tried, budget, budget.step_ms, budget.step_ms - budget.rest_ms, least=1)
    return found.estimated_gain if found else None


def _unproved(label, cause, stage, estimate, why) -> Proof:
    return Proof(label, (), (cause,), (stage,), NOT_PROVED, estimated_gain=estimate, why=why)


def window(step_ms: float, status: dict, candidates: list[Candidate]) -> tuple[tuple[int, int] | None, str | None]:
    """The trials' timed steps: after the warm-up, and after one pass over the data where a cache is tried (a cache
    gains from its second pass); None and why where the script trains too few steps."""
    length = int(min(200, max(12, WINDOW_S * 1000 / max(step_ms, 1e-3))))
    first = WARM_UP
    caching = any(f["name"] == "cache" for c in candidates for f in c.fixes)
    passed = status.get("pass_steps")
    if caching and isinstance(passed, int) and passed > 0:
        first = max(first, passed + 2)
    trained = status.get("steps_seen") or 0
    if trained and first + length > trained - 1:  # the window ends when the step after its last one begins
        length = trained - 1 - first
    if length < 5:
        return None, (
            f"the script trains {trained} steps, too few for a window of at least 5 steps after step {first} (the "
            "warm-up" + (" and one pass over the data, which a cache needs" if caching else "") + ")"
        )
    return (first, first + length - 1), None


def _drop_long_caches(candidates: list[Candidate], status: dict, step_ms: float) -> list[Proof]:
    """A cache whose first pass takes longer than LONGEST_PASS_S at the profiled step time is not tried; "all
    together" is made again of the fixes left (_without)."""
    passed = status.get("pass_steps")
    if not isinstance(passed, int) or passed <= 0:
        why = "tf.data cannot count one pass over the data, so when the cache would be full cannot be told"
    elif passed * step_ms / 1000 > LONGEST_PASS_S:
        why = (
            f"one pass over the data takes {passed} steps (about {passed * step_ms / 1000:.0f} s), longer than "
            f"the {LONGEST_PASS_S:.0f} s a trial may spend before its window"
        )
    else:
        return []
    dropped = [c for c in candidates if c.label != "all together" and any(f["name"] == "cache" for f in c.fixes)]
    candidates[:] = _without(candidates, dropped)
    return [_as_unproved(c, why) for c in dropped]


def run_trial(
    command: list[str], fixes: list[dict], steps: tuple[int, int], log: Path, timeout: float, mode: str | None = None
) -> dict:
    """One run of the command with `fixes` applied, timing `steps` of the profiled `mode` (its status's: Keras fit, a
    custom loop); the status of its process that timed them."""
    status_dir = tempfile.mkdtemp(prefix="step-doctor-prove-")
    scratch = tempfile.mkdtemp(prefix="step-doctor-prove-logs-")
    try:
        env = runner.child_env(Path(scratch), status_dir, list(steps), None, "trial")
        settings = json.loads(env[runner.ENV])
        settings["trial"] = {"fixes": fixes, "mode": mode}
        env[runner.ENV] = json.dumps(settings)
        with open(log, "w") as out, runner._unblocked() as early:  # a session of its own: what it starts is stopped
            child = subprocess.Popen(  # with it (a terminal's Ctrl-C reaches prove, which stops the trial)
                command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        stopped = early[0] if early else None
        deadline = time.monotonic() + timeout
        while stopped is None and child.poll() is None:
            info = signal.sigtimedwait(runner.FORWARDED, 0.25)
            if info is not None:
                stopped = info.si_signo
            elif time.monotonic() > deadline:
                _stop(child, signal.SIGKILL)
                return {"error": f"no answer in {timeout:.0f} s"}
        if stopped is not None:
            _stop(child, signal.SIGTERM)
            raise Stopped(signal.Signals(stopped).name)
        timed = [s for s in runner._statuses(status_dir) if s.get("trial")]
        if not timed:
            tail = log.read_text(errors="replace").splitlines()[-3:]
            return {"error": f"exited with status {child.returncode} before the window ended: " + " | ".join(tail)}
        return timed[0]
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _stop(child: subprocess.Popen, signum: int) -> None:
    """The trial's whole session: the command and whatever it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signum)
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def prove(
    command: list[str], item: RunDiagnosis, status: dict, run_dir: Path, rounds: int, allow: set[str], cwd: Path
) -> dict:
    """Plan, run the rounds, write <run_dir>/proofs.json and the patch; the prove section of profile.json."""
    step_ms = item.profile.step_time_ms or 100.0
    candidates, unproved = plan(item, allow, cwd)
    unproved += _drop_long_caches(candidates, status, step_ms)
    steps, why = window(step_ms, status, candidates)
    if why and any(f["name"] == "cache" for c in candidates for f in c.fixes):
        caches = [c for c in candidates if any(f["name"] == "cache" for f in c.fixes)]
        unproved += [_as_unproved(c, why) for c in caches if c.label != "all together"]
        candidates = _without(candidates, caches)
        steps, why = window(step_ms, status, candidates)  # the others need no pass over the data first
    if why:
        unproved += [_as_unproved(c, why) for c in candidates if c.label != "all together"]
        candidates = []
    baseline = Candidate("no fix", [], [], [], None)
    trials = [baseline, *candidates]
    stopped = None
    logs = run_dir / "prove"
    expected_s = (steps[1] + 1) * step_ms / 1000 if steps else 0
    timeout = max(300.0, 10 * expected_s)
    started = time.time()
    if candidates:
        logs.mkdir(parents=True, exist_ok=True)
        _say(f"proving {len(candidates)} fix(es) in {rounds} rounds of {len(trials)} runs, steps {steps[0]}-{steps[1]}")
    for r in range(rounds if candidates else 0):
        order = trials[r % len(trials) :] + trials[: r % len(trials)]  # each run in every place, in turn
        for trial in order:
            trial.times.append(None)
        for index, trial in enumerate(order):
            try:
                log = logs / f"round{r + 1}-{index + 1}.log"
                status_of = run_trial(command, trial.fixes, steps, log, timeout, status.get("mode"))
            except Stopped as signal_name:
                stopped = str(signal_name)
                break
            problems = _problems(status_of)
            if problems:  # a fix that was not applied measures nothing: no time, and the reason
                trial.refused += problems
            else:
                timed = status_of["trial"]
                trial.times[-1] = timed["seconds"] / timed["steps"]
                for fix, done in zip(trial.fixes, timed.get("fixes") or ()):
                    fix["below_repeat"] = bool(done.get("below_repeat"))  # the patch writes it where it was tried
                    fix["moved_shuffle"] = bool(done.get("moved_shuffle"))
            ms = f"{trial.times[-1] * 1000:.1f} ms/step" if trial.times[-1] else f"not measured ({problems[0]})"
            _say(f"round {r + 1}/{rounds}, {trial.label}: {ms} ({time.time() - started:.0f} s so far)")
        if stopped:
            break
    noise = _aa_noise(baseline.times)
    proofs = [_proof(c, baseline.times, noise) for c in candidates]
    each = [p for p in proofs if p.label != "all together"] + unproved
    together = next((p for p in proofs if p.label == "all together"), None)
    document = {"each": [p.to_json() for p in each], "together": together.to_json() if together else None}
    document.update(steps=list(steps) if steps else None, rounds=rounds, stopped=stopped, aa=baseline.times)
    files.write_json(run_dir / FILE, document)
    proved = [
        f for c, p in zip(candidates, proofs) if p.label != "all together" and p.verdict == PROVED for f in c.fixes
    ]
    diff, notes = patch.unified_diff(proved, cwd)
    document["patch"], document["patch_notes"] = None, notes
    if diff:
        (run_dir / "prove.patch").write_text(diff)
        document["patch"] = str(run_dir / "prove.patch")
    document["seconds"] = round(time.time() - started, 1)
    return document


def _problems(status: dict) -> list[str]:
    """Why a trial measured nothing: it failed, ended before its window did, or a fix of it was not applied."""
    timed = status.get("trial") or {}
    if status.get("error"):
        return [status["error"]]
    if not timed.get("complete") or not timed.get("steps"):
        return ["the trial ended before its window did"]
    found = []
    for fix in timed.get("fixes") or []:
        if fix.get("refused"):
            found.append(f"{NAMES[fix['name']]} not applied: {fix['refused']}")
        elif not fix.get("applied"):
            found.append(
                f"{NAMES[fix['name']]} not applied: line {fix['line']} built no dataset it applies to (it may pass "
                "the setting already)"
            )
    return found


def _without(candidates: list[Candidate], dropped: list[Candidate]) -> list[Candidate]:
    """The candidates left, "all together" made again of them (or dropped, under two)."""
    singles = [c for c in candidates if c not in dropped and c.label != "all together"]
    together = [c for c in candidates if c.label == "all together"]
    if together and len(singles) >= 2:
        together[0].fixes = [f for c in singles for f in c.fixes]
        together[0].estimated_gain = None  # it estimated the fixes the candidates had
        return [*singles, together[0]]
    return singles


def _as_unproved(candidate: Candidate, why: str) -> Proof:
    names = tuple(f["name"] for f in candidate.fixes)
    return Proof(
        candidate.label,
        names,
        tuple(candidate.causes),
        tuple(candidate.stages),
        NOT_PROVED,
        estimated_gain=candidate.estimated_gain,
        why=why,
    )


def _aa_noise(times: list[float | None]) -> float | None:
    """The A/A control: how far apart two runs without a fix in adjacent rounds read, at most."""
    ratios = [a / b for a, b in zip(times, times[1:]) if a and b]
    return max(abs(r - 1) for r in ratios) if ratios else None


def _proof(candidate: Candidate, base: list[float | None], noise: float | None) -> Proof:
    names = tuple(f["name"] for f in candidate.fixes)
    about = dict(label=candidate.label, fixes=names, causes=tuple(candidate.causes), stages=tuple(candidate.stages))
    gains = [b / t for b, t in zip(base, candidate.times) if b and t]
    if candidate.refused and not gains:
        return Proof(**about, verdict=NOT_PROVED, estimated_gain=candidate.estimated_gain, why=candidate.refused[0])
    if len(gains) < 2 or noise is None:
        why = (
            f"{len(gains)} round(s) measured with it and {'an' if noise is not None else 'no'} A/A control: a proof "
            "needs two rounds and two runs without a fix in adjacent rounds"
        )
        if candidate.refused:
            why += f" ({candidate.refused[0]})"
        return Proof(**about, verdict=NOT_PROVED, estimated_gain=candidate.estimated_gain, why=why)
    margin = max(0.03, noise or 0.0)
    gain = statistics.median(gains)
    if min(gains) > 1 + margin:
        verdict = PROVED
    elif max(gains) < 1 - margin:
        verdict = SLOWER
    elif abs(gain - 1) <= margin:
        verdict = NO_GAIN
    else:
        verdict = UNCLEAR
    why = "; ".join(dict.fromkeys(candidate.refused)) or None
    return Proof(
        **about,
        verdict=verdict,
        gain=round(gain, 3),
        low=round(min(gains), 3),
        high=round(max(gains), 3),
        rounds=len(gains),
        noise=round(noise, 4) if noise is not None else None,
        estimated_gain=candidate.estimated_gain,
        why=why,
    )


def _say(text: str) -> None:
    print(f"prove: {text}", file=sys.stderr, flush=True)


def lines(document: dict) -> list[str]:
    """The text prove adds after the diagnosis."""
    out = ["", "prove: the fixes measured on your unchanged command (paired trials, no profiler):"]
    for item in document["each"]:
        proof = Proof.from_json(item)
        out.append(f"  {proof.label}: {proof.text}")
    if document.get("together"):
        proof = Proof.from_json(document["together"])
        out.append(f"  all together: {proof.text}")
    if document.get("stopped"):
        out.append(f"  stopped by {document['stopped']}: the figures are those of the rounds completed before it")
    if document.get("patch"):
        out.append(f"  the proved fixes as a patch of your source: {document['patch']} (git apply, or patch -p1 <)")
    for note in document.get("patch_notes") or []:
        out.append(f"  not in the patch: {note}")
    return out
