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
- files read one after another;
- Python tokenization (a generator or Python map whose elements are token ids), every step.

Each is estimated by the function of the cause it stands for (diagnose/input_causes.py),
from the wait charged to the stage it names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from step_doctor.diagnose import input_wait as iw
from step_doctor.diagnose import stages as st
from step_doctor.diagnose.blame import Blame, Pipeline
from step_doctor.diagnose.cpu_budget import ProcessCpu
from step_doctor.diagnose.input_causes import (
    decode_every_epoch,
    no_prefetch,
    prefetched,
    python_tokenization,
    python_tokenizer,
    root_stage,
    sequential_file_reads,
    sequential_map,
)
from step_doctor.diagnose.recommendation import LATENT, Causes, Recommendation, ms, pct
from step_doctor.diagnose.stalls import working_step
from step_doctor.diagnose.wait_record import InputWait, Stage, Wait

COVERS = {  # a structural fix -> the recommendations that already make it for the same stage
    "no-prefetch": {"no-prefetch"},
    "sequential-map": {"sequential-map", "python-in-map", "python-tokenization"},
    "decode-every-epoch": {"decode-every-epoch", "sequential-map", "heavy-map"},
    "sequential-file-reads": {"sequential-file-reads"},
    "python-tokenization": {"python-tokenization"},
}


def structural_fixes(
    wait: Wait, cpu_only: bool, listed: list[Recommendation], cpu: ProcessCpu | None = None
) -> list[Recommendation]:
    """The structural fixes of an input-bound run's pipeline that `listed` does not make, most time removed first."""
    if not isinstance(wait, InputWait) or not wait.measured:
        return []
    p = Pipeline(wait, cpu_only, Causes(working_step(wait)), cpu)
    no_prefetch(p)
    running_ahead_at_root(p)
    for s in p.stages:
        fn = s.functions
        if fn and st.written_sequential_map(s):
            sequential_map(_alone(s, p))
        if fn and _decodes_every_epoch(s, p):
            decode_every_epoch(_alone(s, p))
        if fn and python_tokenizer(_alone(s, p)):
            python_tokenization(_alone(s, p))
    for opener, readers in _sequential_readers(p):
        reader = max(readers, key=lambda o: o.busy_ms)
        blocking = sum(s.blocking_ms for s in (opener, *readers))
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


def _alone(stage: Stage, p: Pipeline) -> Blame:
    return Blame(st.Unit(stage, [stage], stage.blocking_ms), p)


def _decodes_every_epoch(stage: Stage, p: Pipeline) -> bool:
    """Its function mostly decodes, deterministically, and no cache keeps its output for later epochs."""
    b = _alone(stage, p)
    cached = any(st.is_cache(o) and st.under(stage.path, o.path) for o in p.stages)
    return b.shares.get("decode", 0.0) >= 0.4 and b.deterministic and not cached


def _sequential_readers(p: Pipeline) -> list[tuple[Stage, list[Stage]]]:
    """(opener stage, its readers) where several files were read one after another on one thread."""
    found: dict[str, tuple[Stage, list[Stage]]] = {}
    for reader in p.stages:
        if reader.kind not in iw.READERS or reader.threads > 1 or reader.instances < 2:
            continue
        opener = st.head(reader, p.stages)
        if opener.kind in iw.ASYNC:
            continue
        found.setdefault(opener.path, (opener, []))[1].append(reader)
    return list(found.values())


def running_ahead_at_root(p: Pipeline) -> None:
    """The root's stage runs ahead by itself (a parallel map, a map-and-batch) but no Prefetch buffers it."""
    top = root_stage(p.stages)
    if top is None or not top.asynchronous or prefetched(top, p.stages) or top.kind == "Prefetch":
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
        stage=top.path,
    )


def production(wait: InputWait) -> tuple[float, str]:
    """The wall time the pipeline needs per batch by itself, and what sets it: the input wait where batches are made
    while the model waits, else the busiest stage's own time per step (its function calls, or its file reads)."""
    busiest, most = None, 0.0
    for s in wait.stages:
        own = s.functions.wall_ms if s.functions else (s.busy_ms if s.kind in iw.READERS else 0.0)
        if not s.pass_through and own > most:
            busiest, most = s, own
    if wait.input_ms >= most or busiest is None:
        return wait.input_ms, "the batches are made while the model waits"
    return most, f"{st.name(busiest)} is busy that long per batch"


def latent_fixes(
    wait: InputWait, cpu_only: bool, listed: list[Recommendation], cpu: ProcessCpu | None = None
) -> list[Recommendation]:
    """The structural fixes of a run that is not input-bound: what each costs here, and where the step is faster."""
    found = structural_fixes(wait, cpu_only, listed, cpu)
    if not found:
        return []
    step = working_step(wait)
    rest, (made, sets) = max(step - wait.input_ms, 0.0), production(wait)
    stages = {s.path: s for s in wait.stages}
    cores = wait.cpu_budget or 2
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


def _would_cost(rec: Recommendation, stage: Stage | None, made: float, cores: int) -> str:
    if rec.cause == "no-prefetch" and stage is not None and stage.asynchronous:
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
        own = stage.functions.wall_ms if stage.functions else stage.busy_ms
    if rec.cause == "decode-every-epoch":
        return f"{st.name(stage)} takes {ms(own)} per batch in every epoch: a cache after it keeps only the first's"
    if rec.cause == "python-tokenization":
        return (
            f"{st.name(stage)} takes {ms(own)} per batch in Python in every step, one call at a time under the GIL: "
            "tokenized once, when the dataset is built, the steps would not pay it"
        )
    return (
        f"{st.name(stage) if stage else 'this stage'} takes {ms(own)} per batch one call at a time: spread over "
        f"{cores} cores it would take about {ms(own / cores)}"
    )


# ---- padding: batches padded without bucketing ------------------------------------------------------------------
# Not an input cost: every padded slot is computed by the model. Read from the tree (a PaddedBatch stage with no
# GroupByWindow, bucket_by_sequence_length's stage, above it); its cost needs the share of padded slots, which the
# trace does not hold (the batch's shape is recorded, its real lengths are not): it comes from the run's own record.

PADDING_KEY = "padding_share"  # in the run's summary.json (this template's text runs write it), anywhere in it

BUCKET_FIX = (
    "Pad to a few lengths: `ds.bucket_by_sequence_length(lambda ids, label: tf.shape(ids)[0], "
    "bucket_boundaries=[65, 129, 257, 513], bucket_batch_sizes=[128, 64, 32, 16, 16], pad_to_bucket_boundary=True, "
    "drop_remainder=True)` in place of `padded_batch`: texts of similar length are batched together and padded to "
    "their bucket's length (64, 128, 256 or 512 here; no text may be longer than the last boundary - 1), batch sizes "
    "chosen so every batch holds about the same number of token slots. Little padding, and a fixed set of shapes: "
    "under XLA one compile each. Packing several texts per row (with segment ids) pads least. "
    "In this template (task: text): text.pipeline.batching: bucket."
)


def padding_share(record: dict, depth: int = 3) -> float | None:
    """The share of padded slots the run recorded (PADDING_KEY, a number from 0 to 1, at any level of its
    summary.json up to `depth`), or None."""
    if not isinstance(record, dict) or depth < 0:
        return None
    value = record.get(PADDING_KEY)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value)
    for inner in record.values():
        found = padding_share(inner, depth - 1) if isinstance(inner, dict) else None
        if found is not None:
            return found
    return None


def _padded(stage: Stage, stages: Sequence[Stage]) -> str | None:
    """How a PaddedBatch stage pads ('to the longest sequence of each batch', 'to a fixed length, ...'), or None where
    it is not padding text without bucketing: under bucket_by_sequence_length, or fed elements of one fixed shape."""
    if not stage.kind.startswith("PaddedBatch") or "GroupByWindow" in stage.path:
        return None
    below = next((o for o in stages if o.path.rsplit("::", 1)[0] == stage.path), None)
    fed = st.components(below) if below is not None else None
    if fed is not None and not any("?" in dims for dims, _ in fed):
        return None  # every element has the same shape: nothing to pad
    out = st.components(stage) or []
    lengths = [dims[1:] for dims, _ in out if len(dims) >= 2]
    if lengths and any("?" in rest for rest in lengths):
        return "to the longest sequence of each batch, a new length nearly every batch"
    if lengths:
        return f"to a fixed length ({', '.join('x'.join(rest) for rest in lengths[:1])}), whatever each text's"
    return "to the longest of each batch or to a fixed length (the trace does not record which)"


def unbucketed_padding(wait: Wait, share: float | None) -> list[Recommendation]:
    """A padded_batch with no bucketing in the tree, with the run's padding share where it recorded one: what the
    model computes on padding is the time it removes (at most; bucketing leaves a little padding)."""
    if not isinstance(wait, InputWait) or not wait.measured:
        return []
    causes = Causes(working_step(wait))
    compute = wait.compute_ms or 0.0
    xla = wait.xla
    for s in wait.stages:
        how = _padded(s, wait.stages)
        if how is None:
            continue
        batch = s.params.get("batch_size", "?")
        padded = [f"[{','.join(dims)}] {dtype}" for dims, dtype in st.components(s) or [] if len(dims) >= 2]
        shapes = f" ({padded[0]})" if padded else ""
        if share is None:
            said = (
                "padding share unknown: the run recorded none (this template's text runs write padding_share to "
                "summary.json), and the trace holds each batch's shape, not its texts' lengths"
            )
            removes, estimate = 0.0, "Estimate: none from this profile (the padding share is unknown)."
        else:
            removes = share * compute
            said = (
                f"the run recorded a padding share of {share:.0%}: that part of the token slots the model computes "
                f"is padding, about {ms(removes)} of its {ms(compute)} of compute per step"
            )
            estimate = (
                "Estimate: at most the model's compute on padded slots (its work grows with the slots; attention "
                "grows faster than that); bucketing leaves some padding, to each bucket's length."
            )
        if xla.used and xla.churn:
            said += "; under XLA each new length also compiles the step again (recompilation)"
        elif xla.used and xla.recorded is False and "new length" in how:
            said += "; under XLA each new length also compiles the step again (unrecorded in this profile)"
        elif not xla.used and "new length" in how:
            said += "; under XLA (Keras's default where a GPU is present) each new length would compile the step again"
        causes.add(
            "unbucketed-padding",
            "Batches padded without bucketing (padded_batch)",
            removes,
            f"{st.name(s)} pads each batch of {batch}{shapes} {how}, with no bucket_by_sequence_length in the "
            f"pipeline; {said}",
            BUCKET_FIX,
            estimate,
            stage=s.path,
        )
    return causes.found


def padding_latent(notes: list[Recommendation]) -> list[Recommendation]:
    """unbucketed_padding's notes for a run that lists no structural fix (not input-bound) and does not rank them."""
    return [
        dataclasses.replace(
            rec,
            kind=LATENT,
            caveat=(
                "Not ranked: padding costs the model's compute, not input wait, and "
                + (
                    f"its cost here ({ms(rec.removes_ms)} per step) is under 5% of the step."
                    if rec.removes_ms
                    else "this profile cannot tell how much of that compute is padding."
                )
            ),
            if_faster=(
                "Where the step is faster: the padded slots stay the same share of the model's work on any device, "
                "and cost more the more the model computes per slot (attention, larger layers)."
            ),
        )
        for rec in notes
    ]
