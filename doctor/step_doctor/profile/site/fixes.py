"""The fixes `step-doctor profile --prove` applies inside a trial of the unchanged script (profile/prove.py).

Each fix names the user's line that built a dataset (recorded in the profile run by
dataset_sources.py) and is applied, in memory only, where that line builds it again:
- parallel-calls: `.map(f)` called there gets `num_parallel_calls=tf.data.AUTOTUNE` (order kept);
- cache: the dataset built there is followed by `.cache()`, where it is finite (its cardinality) and
  fits in half the memory that is free (its element spec times its cardinality); else not applied,
  and the trial says why. A map of a repeat (`ds.repeat().map(f)`: the decode of the same finite data
  every epoch, however it is repeated) is cached below the repeat: `ds.map(f).cache().repeat()`, the
  same elements in the same order, as the cause offers it only for a function without random ops;
- prefetch: the dataset built there is followed by `.prefetch(tf.data.AUTOTUNE)`;
- parallel-reads: `TFRecordDataset(files)` built there reads `num_parallel_reads=tf.data.AUTOTUNE`
  files at once (the order of the records changes: proved only when the user allows "order").
What was applied, and what was not and why, goes into the trial's status. Standard library only.
"""

from __future__ import annotations

import os
import sys

AFTER = ("cache", "prefetch")  # fixes that follow the dataset built at the line, in this order (the patch's too)
METHODS = ("map", "batch", "padded_batch", "filter", "interleave", "flat_map", "shuffle", "repeat", "unbatch", "take")


class Fixes:
    """The fixes of one trial, and what became of each."""

    def __init__(self, fixes: list[dict], caller, note):
        self.fixes = fixes
        self.caller = caller  # dataset_sources.Sources.caller: the user's frame, as the profile run recorded it
        self.note = note
        self.applied: dict[int, int] = {}  # fix index -> times applied
        self.refused: dict[int, str] = {}
        self.cached_below_repeat: set[int] = set()  # cache fixes applied below the repeat their map reads

    def at(self, frame, name: str) -> list[tuple[int, dict]]:
        where = self.caller(frame)
        return [
            (i, f)
            for i, f in enumerate(self.fixes)
            if f["name"] == name and f.get("file") == where.get("file") and f.get("line") == where.get("line")
        ]

    def install(self, tensorflow) -> None:
        from tensorflow.python.data.ops import dataset_ops, readers  # noqa: PLC0415 - TensorFlow is imported already

        self.tf = tensorflow
        for method in METHODS:
            original = getattr(dataset_ops.DatasetV2, method, None)
            if original is not None:
                setattr(dataset_ops.DatasetV2, method, self._wrapped(method, original))
        init = readers.TFRecordDatasetV2.__init__
        fixes = self

        def __init__(dataset, filenames, compression_type=None, buffer_size=None, num_parallel_reads=None, name=None):
            for i, _ in fixes.at(sys._getframe(1), "parallel-reads"):
                if num_parallel_reads is None:
                    num_parallel_reads = tensorflow.data.AUTOTUNE
                    fixes.applied[i] = fixes.applied.get(i, 0) + 1
            init(dataset, filenames, compression_type, buffer_size, num_parallel_reads, name=name)

        __init__.__wrapped__ = init
        readers.TFRecordDatasetV2.__init__ = __init__

    def _wrapped(self, method: str, original):
        fixes = self

        def transformation(dataset, *args, **kwargs):
            frame = sys._getframe(1)
            if method == "map":
                for i, _ in fixes.at(frame, "parallel-calls"):
                    if len(args) < 2 and kwargs.get("num_parallel_calls") is None:
                        kwargs["num_parallel_calls"] = fixes.tf.data.AUTOTUNE
                        fixes.applied[i] = fixes.applied.get(i, 0) + 1
            swapped = None  # a map of a repeat, cached below the repeat
            if method == "map" and type(dataset).__name__ == "_RepeatDataset":
                for i, fix in fixes.at(frame, "cache"):
                    if swapped is None and _same_kind("_MapDataset", fix.get("kind")):
                        swapped = fixes.below_repeat(i, dataset, lambda inner: original(inner, *args, **kwargs))
            result = swapped if swapped is not None else original(dataset, *args, **kwargs)
            for name in AFTER:
                if name == "cache" and swapped is not None:
                    continue  # cached below the repeat already
                for i, fix in fixes.at(frame, name):
                    built = "_MapDataset" if swapped is not None else type(result).__name__  # the swap ends in a repeat
                    if _same_kind(built, fix.get("kind")):
                        result = fixes.follow(i, fix, result)
            return result

        transformation.__wrapped__ = original
        transformation.__name__ = method
        return transformation

    def below_repeat(self, index: int, repeated, mapped):
        """`repeated.map(f)` as `input.map(f).cache().repeat(count)`, where the cache can be applied there; else as
        written, and the trial says why."""
        try:
            return self._below_repeat(index, repeated, mapped)
        except Exception as error:  # the script goes on without the fix; the trial says why
            self.refused[index] = f"{type(error).__name__}: {error}"
            return mapped(repeated)

    def _below_repeat(self, index: int, repeated, mapped):
        inner = mapped(repeated._input_dataset)
        why = self.cache_refusal(inner)
        if why:
            self.refused[index] = f"{why} (below the repeat() the map reads)"
            return mapped(repeated)
        self.applied[index] = self.applied.get(index, 0) + 1
        self.cached_below_repeat.add(index)
        return inner.cache().repeat(repeated._count)

    def follow(self, index: int, fix: dict, dataset):
        try:
            return self._follow(index, fix, dataset)
        except Exception as error:  # the script goes on without the fix; the trial says why
            self.refused[index] = f"{type(error).__name__}: {error}"
            return dataset

    def _follow(self, index: int, fix: dict, dataset):
        if fix["name"] == "prefetch":
            self.applied[index] = self.applied.get(index, 0) + 1
            return dataset.prefetch(self.tf.data.AUTOTUNE)
        why = self.cache_refusal(dataset)
        if why:
            self.refused[index] = why
            return dataset
        self.applied[index] = self.applied.get(index, 0) + 1
        return dataset.cache()

    def cache_refusal(self, dataset) -> str | None:
        """Why the dataset cannot be cached in memory here, or None."""
        if _shuffled(dataset):
            return (
                "a shuffle() below it reshuffles every epoch, and a cache after it would replay the first epoch's "
                "order in every later one: shuffle after the cache (`.cache().shuffle(n)`)"
            )
        count = self.tf.get_static_value(dataset.cardinality())
        if count is None:
            return "it is built inside a traced function (graph mode), where its length cannot be read"
        count = int(count)
        if count == -1:
            return "the dataset built at that line is infinite (a repeat() before it): cache the finite part"
        if count < 0:
            return "its length is unknown here (tf.data cannot count it), so whether it fits in memory cannot be told"
        size = 0
        for spec in self.tf.nest.flatten(dataset.element_spec):
            shape = getattr(spec, "shape", None)
            dtype = getattr(spec, "dtype", None)
            if shape is None or dtype is None or not shape.is_fully_defined() or dtype == self.tf.string:
                return "its elements have no fixed size (strings or unknown shapes), so whether it fits cannot be told"
            size += shape.num_elements() * dtype.size
        free = _free_bytes()
        if free and count * size > free / 2:
            return (
                f"{count} elements of {size / 1e6:.2f} MB need {count * size / 1e9:.1f} GB, over half the free memory"
            )
        return None

    def report(self) -> list[dict]:
        found = []
        for i, fix in enumerate(self.fixes):
            found.append(
                {
                    **fix,
                    "applied": self.applied.get(i, 0),
                    "refused": self.refused.get(i),
                    "below_repeat": i in self.cached_below_repeat,
                }
            )
        return found


def _shuffled(dataset) -> bool:
    """Whether a shuffle lies below the dataset, along its first inputs."""
    for _ in range(64):
        if "Shuffle" in type(dataset).__name__:
            return True
        inputs = dataset._inputs() if hasattr(dataset, "_inputs") else []
        if not inputs:
            return False
        dataset = inputs[0]
    return False


def _same_kind(built: str, recorded: str | None) -> bool:
    """A map is the same map whether or not parallel calls (a fix of this trial) made it a ParallelMap."""
    return recorded is not None and built.replace("Parallel", "") == recorded.replace("Parallel", "")


def _free_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
