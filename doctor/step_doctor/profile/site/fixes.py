"""The fixes `step-doctor profile --prove` applies inside a trial of the unchanged script (profile/prove.py).

Each fix names the user's line that built a dataset (recorded in the profile run by
dataset_sources.py) and is applied, in memory only, where that line builds it again:
- parallel-calls: `.map(f)` called there gets `num_parallel_calls=tf.data.AUTOTUNE` (order kept);
- cache: the dataset built there is followed by `.cache()`, where it is finite (its cardinality, or
  the records of its files, counted) and fits in half the memory that is free (its element spec
  times its length); else not applied, and the trial says why. A map of a repeat (`ds.repeat().map(f)`:
  the decode of the same finite data every epoch, however it is repeated) is cached below the repeat:
  `ds.map(f).cache().repeat()`, the same elements in the same order, as the cause offers it only for a
  function without random ops. A shuffle right below the map (or below its repeat) moves after the
  cache, with its own seeds: `ds.shuffle(n).repeat().map(f)` runs as `ds.map(f).cache().shuffle(n).repeat()`,
  which yields the same elements in the same order (a shuffle's order depends on its seeds and its
  buffer, not on what the elements are), every epoch reshuffled as before;
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

    def __init__(self, fixes: list[dict], caller, note, sizes=None):
        self.fixes = fixes
        self.caller = caller  # dataset_sources.Sources.caller: the user's frame, as the profile run recorded it
        self.note = note
        self.sizes = sizes  # dataset_sources: count_elements and largest_element, where the dataset does not say
        self.applied: dict[int, int] = {}  # fix index -> times applied
        self.refused: dict[int, str] = {}
        self.cached_below_repeat: set[int] = set()  # cache fixes applied below the repeat their map reads
        self.moved_shuffle: set[int] = set()  # cache fixes applied below a shuffle, which moved after the cache

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
            swapped = None  # a map of a repeat or a shuffle, cached below them
            if method == "map" and type(dataset).__name__ in ("_RepeatDataset", "_ShuffleDataset"):
                for i, fix in fixes.at(frame, "cache"):
                    if swapped is None and _same_kind("_MapDataset", fix.get("kind")):
                        swapped = fixes.below_repeat(i, dataset, lambda inner: original(inner, *args, **kwargs))
            result = swapped if swapped is not None else original(dataset, *args, **kwargs)
            for name in AFTER:
                if name == "cache" and swapped is not None:
                    continue  # cached below the repeat already
                for i, fix in fixes.at(frame, name):
                    built = "_MapDataset" if swapped is not None else type(result).__name__  # a swap ends in a repeat
                    if _same_kind(built, fix.get("kind")):
                        result = fixes.follow(i, fix, result)
            return result

        transformation.__wrapped__ = original
        transformation.__name__ = method
        return transformation

    def below_repeat(self, index: int, dataset, mapped):
        """`dataset.map(f)`, where the dataset is a repeat, a shuffle or a repeat of a shuffle, as
        `input.map(f).cache()` followed by them: the shuffle with its own seeds; where the cache can be applied
        there, else as written, and the trial says why."""
        try:
            return self._below_repeat(index, dataset, mapped)
        except Exception as error:  # the script goes on without the fix; the trial says why
            self.refused[index] = f"{type(error).__name__}: {error}"
            return mapped(dataset)

    def _below_repeat(self, index: int, dataset, mapped):
        repeat = dataset if type(dataset).__name__ == "_RepeatDataset" else None
        below = repeat._input_dataset if repeat is not None else dataset
        shuffle = below if type(below).__name__ == "_ShuffleDataset" else None
        inner = mapped(shuffle._input_dataset if shuffle is not None else below)
        buffer = int(self.tf.get_static_value(shuffle._buffer_size)) if shuffle is not None else 0
        why = self.cache_refusal(inner, buffer)
        if why:
            where = " and ".join(n for n, d in (("repeat()", repeat), ("shuffle()", shuffle)) if d is not None)
            self.refused[index] = f"{why} (below the {where} the map reads)"
            return mapped(dataset)
        result = inner.cache()
        if shuffle is not None:
            result = self._shuffle_like(shuffle, result)
            if result is None:
                self.refused[index] = "the shuffle() below the map has seeds that cannot be given to it again here"
                return mapped(dataset)
            self.moved_shuffle.add(index)
        if repeat is not None:
            result = result.repeat(repeat._count)
            self.cached_below_repeat.add(index)
        self.applied[index] = self.applied.get(index, 0) + 1
        return result

    def _shuffle_like(self, shuffle, dataset):
        """`dataset.shuffle(...)` with the shuffle's buffer and seeds, so that it orders the elements as the shuffle
        did (None where its seeds cannot be given again: a global seed changed since)."""
        seeds = (int(shuffle._seed), int(shuffle._seed2))
        again = dataset.shuffle(
            shuffle._buffer_size,
            seed=None if seeds == (0, 0) else seeds[1],  # (global or default seed, op seed), as get_seed made them
            reshuffle_each_iteration=shuffle._reshuffle_each_iteration,
        )
        return again if (int(again._seed), int(again._seed2)) == seeds else None

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

    def cache_refusal(self, dataset, buffered: int = 0) -> str | None:
        """Why the dataset cannot be cached in memory here, with a shuffle buffer of `buffered` of its elements
        after the cache, or None."""
        if _shuffled(dataset):
            return (
                "a shuffle() below it reshuffles every epoch, and a cache after it would replay the first epoch's "
                "order in every later one: shuffle after the cache (`.cache().shuffle(n)`)"
            )
        count = self.tf.get_static_value(dataset.cardinality())
        if count is None:
            return "it is built inside a traced function (graph mode), where its length cannot be read"
        count = int(count)
        if count == -2 and self.sizes is not None:
            count = self.sizes.count_elements(dataset)
            if count is None:
                return (
                    "its length is unknown here: tf.data cannot count it, and its files' records could not be "
                    "counted in a few seconds, so whether it fits in memory cannot be told"
                )
        if count == -1:
            return "the dataset built at that line is infinite (a repeat() before it): cache the finite part"
        if count < 0:
            return "its length is unknown here (tf.data cannot count it), so whether it fits in memory cannot be told"
        size = self._element_bytes(dataset)
        if size is None:
            return (
                "its elements have no fixed size (strings or unknown shapes) and its first ones could not be read, so "
                "whether it fits cannot be told"
            )
        free = _free_bytes()
        held = count + min(buffered, count)  # the cache, and the shuffle buffer after it
        if free and held * size > free / 2:
            return f"{held} elements of {size / 1e6:.2f} MB need {held * size / 1e9:.1f} GB, over half the free memory"
        return None

    def _element_bytes(self, dataset) -> int | None:
        """An element's bytes from its spec; where that has strings or unknown shapes (decoded images of any size),
        twice the largest of its first elements, as read (a margin for the elements not seen)."""
        size = 0
        for spec in self.tf.nest.flatten(dataset.element_spec):
            shape = getattr(spec, "shape", None)
            dtype = getattr(spec, "dtype", None)
            if shape is None or dtype is None or not shape.is_fully_defined() or dtype == self.tf.string:
                largest = self.sizes.largest_element(dataset) if self.sizes is not None else None
                return 2 * largest if largest is not None else None
            size += shape.num_elements() * dtype.size
        return size

    def report(self) -> list[dict]:
        found = []
        for i, fix in enumerate(self.fixes):
            found.append(
                {
                    **fix,
                    "applied": self.applied.get(i, 0),
                    "refused": self.refused.get(i),
                    "below_repeat": i in self.cached_below_repeat,
                    "moved_shuffle": i in self.moved_shuffle,
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
