"""Where each tf.data dataset of a profiled script was built: the file and line of the user's own code.

Loaded by capture.py once the script has imported TensorFlow. It wraps `DatasetV2.__init__`, which
every dataset (a `.map(...)`, a `TFRecordDataset(...)`, one Keras makes) runs once when it is built,
and records the dataset's class, its inputs and the first frame of the call stack outside TensorFlow
and Keras: the user's line, or the library that built it. The graph goes to
<run>/dataset_sources.json beside the run's profile, where the analyser matches each stage of the
iterator tree to the line that built it (diagnose/dataset_sources.py). Standard library only; a
failure here costs the lines, never the script.
"""

from __future__ import annotations

import contextlib
import json
import linecache
import os
import sys
import sysconfig
import threading
import time

FILE = "dataset_sources.json"
MOST = 4000  # datasets recorded; a script that builds more (datasets inside a loop) keeps its first ones
ATTRIBUTE = "_step_doctor_source"
# count_elements: datasets whose length is their records, read from files; transformations that keep one element per
# element (a parallel map keeps it too), and those that batch
READERS = ("TFRecordDatasetV2", "TextLineDatasetV2", "FixedLengthRecordDatasetV2")
ONE_TO_ONE = (
    "_MapDataset",
    "_ParallelMapDataset",
    "_PrefetchDataset",
    "CacheDataset",
    "_OptionsDataset",
    "_ShuffleDataset",
)
BATCHES = ("_BatchDataset", "_ParallelBatchDataset")
COUNT_SECONDS, COUNT_BATCH, COUNTED, SAMPLED = 5.0, 4096, "_step_doctor_records", 16
READING = threading.local()
SKIPPED = ("tensorflow", "keras", "tf_keras", "tensorflow_datasets")  # their frames lead to the user's call
HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARIES = tuple(
    os.path.normpath(p) + os.sep
    for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    if p
)


class Sources:
    """The datasets built in this process, in the order they were built."""

    def __init__(self, count: bool = False):
        self.count = count  # read the records of files where tf.data cannot count a pass (prove's window), or not
        self.nodes: list[dict] = []
        self.lock = threading.Lock()
        self.iterated = 0
        self.pass_steps: int | None = None  # elements of one pass over the longest dataset iterated (prove's window)
        self.skipped: dict[str, str] = {}  # package -> its folder, as the script imports them

    @property
    def skip(self) -> tuple[str, ...]:
        for name in SKIPPED:
            if name not in self.skipped and name in sys.modules:
                self.skipped[name] = _package_dir(name) or HERE + os.sep
        return (HERE + os.sep, *self.skipped.values())

    def install(self, tensorflow) -> None:
        from tensorflow.python.data.ops import dataset_ops  # noqa: PLC0415 - the script imported TensorFlow already

        init = dataset_ops.DatasetV2.__init__
        sources = self

        def __init__(dataset, *args, **kwargs):
            init(dataset, *args, **kwargs)
            try:
                sources.record(dataset, sys._getframe(1))
            except Exception:  # the lines are a help; the dataset must be built whatever happens here
                pass

        __init__.__wrapped__ = init
        dataset_ops.DatasetV2.__init__ = __init__
        self._wrap_iterators()

    def _wrap_iterators(self) -> None:
        """Mark the datasets the script iterates (Keras fit, a custom loop), in order: the analyser prefers them."""
        from tensorflow.python.data.ops import iterator_ops  # noqa: PLC0415

        init = iterator_ops.OwnedIterator.__init__
        sources = self

        def __init__(iterator, dataset=None, *args, **kwargs):
            if dataset is not None and not getattr(READING, "active", False):  # not count_elements' own iterator
                try:
                    sources.iterating(dataset)
                except Exception:
                    pass
            init(iterator, dataset, *args, **kwargs)

        __init__.__wrapped__ = init
        iterator_ops.OwnedIterator.__init__ = __init__

    def iterating(self, dataset) -> None:
        number = getattr(dataset, ATTRIBUTE, None)
        with self.lock:
            if number is not None and "iterated" not in self.nodes[number]:
                self.nodes[number]["iterated"] = self.iterated
                self.iterated += 1
        found = pass_steps(dataset, self.count)
        if found is not None:  # the longest: a `for x in ds.take(1)` before fit must not set the window
            self.pass_steps = max(found, self.pass_steps or 0)

    def record(self, dataset, frame) -> None:
        if getattr(dataset, ATTRIBUTE, None) is not None or getattr(READING, "active", False):
            return  # a subclass's __init__ called DatasetV2's again, or this module built it to read (_reading)
        with self.lock:
            if len(self.nodes) >= MOST:
                return
            number = len(self.nodes)
            inputs = []
            try:
                for parent in dataset._inputs():
                    parent_number = getattr(parent, ATTRIBUTE, None)
                    inputs.append(parent_number)
            except Exception:
                pass
            node = {"id": number, "kind": type(dataset).__name__, "inputs": inputs, **self.caller(frame)}
            self.nodes.append(node)
        object.__setattr__(dataset, ATTRIBUTE, number)

    def caller(self, frame) -> dict:
        """The first frame outside TensorFlow, Keras and this hook: the user's line, or the library that built it."""
        skip = self.skip
        while frame is not None:
            path = frame.f_code.co_filename
            if path.startswith("<") or "__autograph_generated_file" in path:
                frame = frame.f_back  # autograph's rewrite of a user function: its lines are not the user's
                continue
            full = os.path.normpath(os.path.abspath(path))
            if not full.startswith(skip):
                if full.startswith(LIBRARIES):
                    return {"by": _library_name(full)}
                code = linecache.getline(full, frame.f_lineno).strip()
                return {"file": full, "line": frame.f_lineno, "function": frame.f_code.co_name, "code": code[:300]}
            frame = frame.f_back
        return {"by": "tensorflow"}

    def write(self, run_dir: str) -> None:
        """Atomically, beside the run's profile; nothing when no dataset was built."""
        with self.lock:
            nodes = list(self.nodes)
        if not nodes:
            return
        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, FILE)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as out:
                json.dump({"version": 1, "cwd": os.getcwd(), "datasets": nodes}, out)
            os.replace(tmp, path)
        except OSError:
            pass


def pass_steps(dataset, count: bool = False) -> int | None:
    """How many elements (steps, for the dataset a loop iterates) one pass over its finite data takes: its own
    cardinality, or, below a repeat(), the first finite dataset's divided by the batches above it; None where tf.data
    cannot count it (nor count_elements, where `count` lets it read)."""
    divisor = 1
    for _ in range(64):
        number = int(dataset.cardinality().numpy())
        if number == -2:  # unknown: records in files (TFRecordDataset), counted by reading them where that is quick
            number = count_elements(dataset) if count else None
            if number is None:
                return None
        if number >= 0:
            return -(-number // divisor)
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            divisor *= int(size)
        inputs = dataset._inputs()
        if not inputs:
            return None
        dataset = inputs[0]
    return None


def count_elements(dataset, seconds: float = COUNT_SECONDS) -> int | None:
    """The elements of a finite dataset whose length tf.data does not know (-2) because it reads records from files:
    the records, read (not parsed) within `seconds`, through the transformations above the reader that keep one
    element per element (a map, a prefetch) or batch them; None where one does neither (a filter, a flat_map), the
    reading takes longer, or it fails."""
    divisors = []
    for _ in range(64):
        kind = type(dataset).__name__
        if kind in READERS:
            break
        if kind in BATCHES:
            if getattr(dataset, "_batch_size", None) is None:
                return None
            divisors.append((int(dataset._batch_size), bool(dataset._drop_remainder)))
        elif kind not in ONE_TO_ONE:
            return None
        inputs = dataset._inputs()
        if len(inputs) != 1:
            return None
        dataset = inputs[0]
        if int(dataset.cardinality().numpy()) >= 0:  # known below: what lies above it changed its length
            return None
    else:
        return None
    known = getattr(dataset, COUNTED, None)
    if known is not None:  # a loop makes an iterator every epoch: read the files once
        records = known if known >= 0 else None
    else:
        object.__setattr__(dataset, COUNTED, -1)  # while it reads: the iterator it makes must not count again
        records = _read_records(dataset, seconds)
        object.__setattr__(dataset, COUNTED, -1 if records is None else records)
    if records is None:
        return None
    for size, drop in reversed(divisors):
        records = records // size if drop else -(-records // size)
    return records


def largest_element(dataset, elements: int = SAMPLED, seconds: float = COUNT_SECONDS) -> int | None:
    """The bytes of the largest of the dataset's first `elements` (read within `seconds`), its strings counted by
    their length; None where they could not be read."""
    from tensorflow.python.util import nest  # noqa: PLC0415 - the script imported TensorFlow already

    largest = 0
    deadline = time.monotonic() + seconds
    try:
        with _reading():
            for element in dataset.take(elements):
                largest = max(largest, sum(_bytes(t.numpy()) for t in nest.flatten(element)))
                if time.monotonic() > deadline:
                    break
    except Exception:  # what the map fails on, the script will say itself
        return None
    return largest or None


def _bytes(value) -> int:
    """A tensor's value as numpy gives it: a string scalar is bytes, a string array holds bytes objects."""
    if isinstance(value, bytes):
        return len(value)
    return sum(len(v) for v in value.ravel()) if value.dtype == object else value.nbytes


def _read_records(dataset, seconds: float) -> int | None:
    records = 0
    deadline = time.monotonic() + seconds
    try:
        with _reading():
            for batch in dataset.batch(COUNT_BATCH):
                records += int(batch.shape[0])
                if time.monotonic() > deadline:
                    return None
    except Exception:  # an unreadable file: the script will say so itself
        return None
    return records


@contextlib.contextmanager
def _reading():
    """While this module reads a dataset itself: the datasets and the iterator it makes are not the script's, so
    they are not recorded, and the iterator does not count a pass."""
    READING.active = True
    try:
        yield
    finally:
        READING.active = False


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    where = getattr(module, "__file__", None)
    return os.path.normpath(os.path.dirname(os.path.abspath(where))) + os.sep if where else None


def _library_name(path: str) -> str:
    for root in LIBRARIES:
        if path.startswith(root):
            return path[len(root) :].split(os.sep, 1)[0].removesuffix(".py") or "python"
    return "python"
