"""Facts about the tf.data stages of one input-wait analysis (diagnose/input_wait.py).

Which stage a cause is named after, the blocking time grouped by that stage, what a stage's
function spent its time on, and what one of its elements weighs: what input_causes.py reads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from step_doctor.diagnose import input_wait as iw
from step_doctor.diagnose.recommendation import ms
from step_doctor.diagnose.wait_record import Stage, StageFunctions

DTYPE_BYTES = {"uint8": 1, "int8": 1, "bool": 1, "uint16": 2, "int16": 2, "half": 2, "bfloat16": 2, "float": 4}
DTYPE_BYTES.update({"int32": 4, "uint32": 4, "double": 8, "int64": 8, "uint64": 8})


def name(stage: Stage) -> str:
    ops = ", ".join(stage.ops[:2])
    return f"{stage.kind} ({ops})" if ops else stage.kind


def element_bytes(stage: Stage) -> int | None:
    """Bytes of one output element when its shapes are fully known, e.g. '[16,64,64,3] [16]' + 'uint8 int64'."""
    shapes = re.findall(r"\[([^\]]*)\]", str(stage.params.get("shapes", "")))
    types = str(stage.params.get("types", "")).split()
    if not shapes or len(shapes) != len(types):
        return None
    total = 0
    for dims, dtype in zip(shapes, types):
        size = DTYPE_BYTES.get(dtype)
        parts = [d for d in dims.split(",") if d.strip()]
        if size is None or any(not d.strip().isdigit() for d in parts):
            return None
        count = 1
        for d in parts:
            count *= int(d)
        total += count * size
    return total


INTEGERS = {"int32", "int64"}
SEQUENCE = 16  # an integer vector this long (or of unknown length) reads as token ids, not as a few integer features


def components(stage: Stage) -> list[tuple[list[str], str]] | None:
    """(dims, dtype) of each tensor of one output element, e.g. '[32,?] [32]' + 'int32 int32'; None where the trace
    does not record them (or not one dtype per shape)."""
    shapes = re.findall(r"\[([^\]]*)\]", str(stage.params.get("shapes", "")))
    types = str(stage.params.get("types", "")).split()
    if not shapes or len(shapes) != len(types):
        return None
    return [([d.strip() for d in dims.split(",") if d.strip()], dtype) for dims, dtype in zip(shapes, types)]


def token_ids(stage: Stage) -> str | None:
    """The stage's output as a text model's input, e.g. '[512] int32': an integer sequence per element (or a batch
    of them) of unknown length or at least SEQUENCE long, beside nothing but integer sequences (masks) and labels;
    None where the trace cannot tell it is that: no shapes recorded, images, floats the size of the sequence."""
    found = components(stage)
    if not found or any(not all(d == "?" or d.isdigit() for d in dims) for dims, _ in found):
        return None

    def sequence(dims: list[str], dtype: str) -> bool:
        return dtype in INTEGERS and 1 <= len(dims) <= 2 and (dims[-1] == "?" or int(dims[-1]) >= SEQUENCE)

    ids = [(dims, dtype) for dims, dtype in found if sequence(dims, dtype)]
    if not ids:
        return None
    rank = max(len(dims) for dims, _ in ids)
    ids = [(dims, dtype) for dims, dtype in ids if len(dims) == rank]
    if any(len(dims) >= rank for dims, dtype in found if (dims, dtype) not in ids):
        return None  # beside the ids (and masks), only labels: one per sequence
    dims, dtype = ids[0]
    return f"[{','.join(dims)}] {dtype}"


def function_line(fn: StageFunctions | None, parallelism=None) -> str:
    if not fn:
        return "no function work recorded"
    top = ", ".join(f"{op} {ms(t)}" for op, t in fn.top_ops[:3] if t > 0)
    ran = f"{fn.concurrency:.1f} calls at a time" if fn.concurrency else "calls at a time unknown"
    limit = f", parallelism {parallelism}" if parallelism else ""
    return (
        f"its function took {ms(fn.work_ms)} of CPU per step in {fn.calls_per_step:.0f} calls on "
        f"{fn.threads} thread(s), {ran}{limit}" + (f" (ops: {top})" if top else "")
    )


def op_shares(fn: StageFunctions | None) -> dict:
    """Share of a function's op time per category (python, decode, augmentation, resize, ...)."""
    if not fn:
        return {}
    total = sum(fn.ops_ms.values()) or fn.work_ms or 0.0
    return {k: v / total for k, v in fn.ops_ms.items()} if total else {}


def written_parallel(stage: Stage) -> bool:
    return any(op.startswith("ParallelMap") for op in stage.user_ops)


def written_sequential_map(stage: Stage) -> bool:
    return "MapDataset" in stage.user_ops and not written_parallel(stage)


def is_opener(stage: Stage) -> bool:
    """A stage that opens inputs of its own: FlatMap, Interleave and their parallel kinds."""
    return stage.kind == "FlatMap" or "Interleave" in stage.kind


def is_cache(stage: Stage) -> bool:
    """cache() in memory or to files, or a snapshot."""
    return "Cache" in stage.kind or stage.kind.startswith("Snapshot")


def under(path: str, root: str) -> bool:
    return path.startswith(root + "::")


def head(stage: Stage, stages: Sequence[Stage]) -> Stage:
    """The stage a cause is named after: a generator rather than its FlatMap, a reader's FlatMap/Interleave."""
    below = [o for o in stages if under(o.path, stage.path)]
    if stage.kind == "FlatMap" and any(o.kind == "Generator" for o in below):
        return next(o for o in below if o.kind == "Generator")
    if stage.kind in iw.READERS:
        openers = [o for o in stages if under(stage.path, o.path) and is_opener(o)]
        if openers:
            return max(openers, key=lambda o: o.path.count("::"))
    return stage


@dataclass
class Unit:
    """The blocking time of the stages one cause is named after."""

    head: Stage
    members: list[Stage] = field(default_factory=list)
    blocking_ms: float = 0.0


HAND_OFF = 0.1  # a generator whose own function explains under this part of the wait it holds only hands over


def own_wall_ms(stage: Stage) -> float:
    return stage.functions.wall_ms if stage.functions else 0.0


def fed_by(stage: Stage, stages: Sequence[Stage]) -> Stage | None:
    """The stage whose work a hand-off generator waits on, or None.

    A distribution strategy puts a generator between the pipeline and each replica (the
    MultiDeviceIterator of experimental_distribute_dataset): the step waits on it, but its own
    function only hands over what the user's pipeline, a second iterator beside it, produced.
    """
    if stage.kind != "Generator" or own_wall_ms(stage) >= HAND_OFF * stage.blocking_ms:
        return None
    beside = [o for o in stages if o is not stage and not under(stage.path, o.path) and not under(o.path, stage.path)]
    feeding = max(beside, key=own_wall_ms, default=None)
    return feeding if feeding and own_wall_ms(feeding) >= stage.blocking_ms / 2 else None


def units(stages: Sequence[Stage]) -> list[Unit]:
    """Blocking time grouped by the stage that causes it (a hand-off's, by what feeds it), most first."""
    found: dict[str, Unit] = {}
    for s in stages:
        if s.pass_through or s.blocking_ms <= 0:
            continue
        top = head(fed_by(s, stages) or s, stages)
        unit = found.setdefault(top.path, Unit(top))
        unit.members.append(s)
        unit.blocking_ms += s.blocking_ms
    return sorted(found.values(), key=lambda u: -u.blocking_ms)
