"""Structural fixes the pipeline tree shows, listed whatever ranks first and whether or not the run waits for input.

The ranked causes follow the wait: the stage the step waited on most names the cause, and a fix
estimated below 5 % is left out. A user reading the tree still sees every defect in it, so each
of these is listed too, unless a recommendation already makes that fix for that stage: after the
ranked causes, with its estimated gain, when the run is input-bound; else as a latent note
(latent_fixes) that says what it costs here and what it would cost where the step is faster,
from the time this profile's pipeline needs per batch:

- nothing running ahead of the model at its root (no prefetch);
- a map written without num_parallel_calls;
- decoding repeated every epoch, with nothing cached after it;
- files read one after another.

Each is estimated by the function of the cause it stands for (diagnose/input_causes.py),
from the wait charged to the stage it names.
"""

from __future__ import annotations

import dataclasses

from step_doctor.diagnose import input_wait as iw
from step_doctor.diagnose import stages as st
from step_doctor.diagnose.input_causes import (
    Blame,
    Pipeline,
    decode_every_epoch,
    no_prefetch,
    prefetched,
    root_stage,
    sequential_file_reads,
    sequential_map,
)
from step_doctor.diagnose.recommendation import LATENT, Causes, Recommendation, ms, pct
from step_doctor.diagnose.stalls import working_step

COVERS = {  # a structural fix -> the recommendations that already make it for the same stage
    "no-prefetch": {"no-prefetch"},
    "sequential-map": {"sequential-map", "python-in-map"},
    "decode-every-epoch": {"decode-every-epoch", "sequential-map", "heavy-map"},
    "sequential-file-reads": {"sequential-file-reads"},
}


def structural_fixes(wait: dict, cpu_only: bool, listed: list[Recommendation]) -> list[Recommendation]:
    """The structural fixes of an input-bound run's pipeline that `listed` does not make, most time removed first."""
    if not wait.get("measured"):
        return []
    p = Pipeline(wait, cpu_only, Causes(working_step(wait)))
    no_prefetch(p)
    running_ahead_at_root(p)
    for s in p.stages:
        fn = s["functions"]
        if fn and st.written_sequential_map(s):
            sequential_map(_alone(s, p))
        if fn and _decodes_every_epoch(s, p):
            decode_every_epoch(_alone(s, p))
    for opener, readers in _sequential_readers(p):
        reader = max(readers, key=lambda o: o["busy_ms"])
        blocking = sum(s["blocking_ms"] for s in (opener, *readers))
        sequential_file_reads(Blame(st.Unit(opener, [opener, *readers], blocking), p), reader)
    made = {(r.cause, r.stage) for r in listed}
    shuffled = [r.stage for r in listed if r.cause == "shuffle-buffer-refill" and r.stage]
    new = []
    for rec in p.causes.found:
        if any((cause, rec.stage) in made for cause in COVERS[rec.cause]):
            continue
        if rec.cause == "decode-every-epoch" and any(st.under(rec.stage, path) for path in shuffled):
            continue  # the shuffle's fix already says to cache after decoding
        new.append(rec)
    return sorted(new, key=lambda r: -r.removes_ms)


def _alone(stage: dict, p: Pipeline) -> Blame:
    return Blame(st.Unit(stage, [stage], stage["blocking_ms"]), p)


def _decodes_every_epoch(stage: dict, p: Pipeline) -> bool:
    """Its function mostly decodes, deterministically, and no cache keeps its output for later epochs."""
    b = _alone(stage, p)
    cached = any(
        ("Cache" in o["kind"] or o["kind"].startswith("Snapshot")) and st.under(stage["path"], o["path"])
        for o in p.stages
    )
    return b.shares.get("decode", 0.0) >= 0.4 and b.deterministic and not cached


def _sequential_readers(p: Pipeline) -> list[tuple[dict, list[dict]]]:
    """(opener stage, its readers) where several files were read one after another on one thread."""
    found: dict[str, tuple[dict, list[dict]]] = {}
    for reader in p.stages:
        if reader["kind"] not in iw.READERS or reader["threads"] > 1 or reader["instances"] < 2:
            continue
        opener = st.head(reader, p.stages)
        if opener["kind"] in iw.ASYNC:
            continue
        found.setdefault(opener["path"], (opener, []))[1].append(reader)
    return list(found.values())


def running_ahead_at_root(p: Pipeline) -> None:
    """The root's stage runs ahead by itself (a parallel map, a map-and-batch) but no Prefetch buffers it."""
    top = root_stage(p.stages)
    if top is None or not top["async"] or prefetched(top, p.stages) or top["kind"] == "Prefetch":
        return
    p.causes.add(
        "no-prefetch",
        "Nothing buffers batches ahead of the model (no prefetch)",
        0.0,
        f"no Prefetch at the root of the pipeline: the stage the model reads from, {st.name(top)}, runs ahead of "
        "it by itself, but only as far as its own parallel calls reach (one batch for a map-and-batch of one call "
        "at a time), and it stops when that batch is ready",
        "End the pipeline with `.prefetch(tf.data.AUTOTUNE)`: it keeps producing while batches wait in its buffer. "
        "In this template: pipeline.prefetch: auto.",
        "Estimate: none from this profile. Where production is slower than the step on average, as here, a deeper "
        "buffer does not make it faster; it absorbs uneven production (shuffle refills, file opens, pauses), which "
        "averages over steps cannot show.",
        stage=top["path"],
    )


def production(wait: dict) -> tuple[float, str]:
    """The wall time the pipeline needs per batch by itself, and what sets it: the input wait where batches are made
    while the model waits, else the busiest stage's own time per step (its function calls, or its file reads)."""
    busiest, most = None, 0.0
    for s in wait["stages"]:
        own = s["functions"]["wall_ms"] if s["functions"] else (s["busy_ms"] if s["kind"] in iw.READERS else 0.0)
        if not s["pass_through"] and own > most:
            busiest, most = s, own
    if wait["input_ms"] >= most or busiest is None:
        return wait["input_ms"], "the batches are made while the model waits"
    return most, f"{st.name(busiest)} is busy that long per batch"


def latent_fixes(wait: dict, cpu_only: bool, listed: list[Recommendation]) -> list[Recommendation]:
    """The structural fixes of a run that is not input-bound: what each costs here, and where the step is faster."""
    found = structural_fixes(wait, cpu_only, listed)
    if not found:
        return []
    step = working_step(wait)
    rest, (made, sets) = max(step - wait["input_ms"], 0.0), production(wait)
    stages = {s["path"]: s for s in wait["stages"]}
    cores = wait.get("cpu_budget") or 2
    if cpu_only:  # the pipeline ran on the cores the model used: its time per batch is stretched by the model's
        when = (
            f"in this profile it took {ms(made)} per batch ({sets}) on cores it shared with the model, so alone it "
            "needs less and this profile cannot tell how much; on a device whose step is shorter than that time"
        )
    else:
        faster = f"{rest / made:.1f}x" if made > 0 else "many times"
        when = (
            f"this pipeline needs {ms(made)} per batch ({sets}) and the rest of the step takes {ms(rest)} here; on a "
            f"device {faster} as fast as this one or faster"
        )
    latent = []
    for rec in found:
        cost = _would_cost(rec, stages.get(rec.stage), made, cores)
        here = (
            f"Not ranked: it costs {ms(rec.removes_ms)} per step here ({pct(rec.removes_ms, step)} of the step), "
            "where the model's step outlasts the pipeline's production."
        )
        where = f"Where the step is faster: {when}, the model would wait for input, and {cost}."
        latent.append(dataclasses.replace(rec, kind=LATENT, caveat=here, if_faster=where))
    return latent


def _would_cost(rec: Recommendation, stage: dict | None, made: float, cores: int) -> str:
    if rec.cause == "no-prefetch" and stage is not None and stage["async"]:
        return (
            f"{st.name(stage)} runs ahead by its own parallel calls only: a prefetch keeps producing while batches "
            "wait in its buffer, which absorbs uneven production (shuffle refills, file opens, pauses)"
        )
    if rec.cause == "no-prefetch":
        return (
            f"with nothing running ahead, each batch's {ms(made)} would come on top of the step; a prefetch overlaps "
            "the two (up to 2x where they take equal time)"
        )
    own = 0.0
    if stage is not None:
        own = stage["functions"]["wall_ms"] if stage["functions"] else stage["busy_ms"]
    if rec.cause == "decode-every-epoch":
        return f"{st.name(stage)} takes {ms(own)} per batch in every epoch: a cache after it keeps only the first's"
    return (
        f"{st.name(stage) if stage else 'this stage'} takes {ms(own)} per batch one call at a time: spread over "
        f"{cores} cores it would take about {ms(own / cores)}"
    )
