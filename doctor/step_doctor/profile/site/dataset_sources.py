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

import json
import linecache
import os
import sys
import sysconfig
import threading

FILE = "dataset_sources.json"
MOST = 4000  # datasets recorded; a script that builds more (datasets inside a loop) keeps its first ones
ATTRIBUTE = "_step_doctor_source"
SKIPPED = ("tensorflow", "keras", "tf_keras", "tensorflow_datasets")  # their frames lead to the user's call
HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARIES = tuple(
    os.path.normpath(p) + os.sep
    for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    if p
)


class Sources:
    """The datasets built in this process, in the order they were built."""

    def __init__(self):
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
            try:
                number = getattr(dataset, ATTRIBUTE, None)
                with sources.lock:
                    if number is not None and "iterated" not in sources.nodes[number]:
                        sources.nodes[number]["iterated"] = sources.iterated
                        sources.iterated += 1
                found = pass_steps(dataset) if dataset is not None else None
                if found is not None:  # the longest: a `for x in ds.take(1)` before fit must not set the window
                    sources.pass_steps = max(found, sources.pass_steps or 0)
            except Exception:
                pass
            init(iterator, dataset, *args, **kwargs)

        __init__.__wrapped__ = init
        iterator_ops.OwnedIterator.__init__ = __init__

    def record(self, dataset, frame) -> None:
        if getattr(dataset, ATTRIBUTE, None) is not None:
            return  # a subclass's __init__ called DatasetV2's again
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


def pass_steps(dataset) -> int | None:
    """How many elements (steps, for the dataset a loop iterates) one pass over its finite data takes: its own
    cardinality, or, below a repeat(), the first finite dataset's divided by the batches above it; None where tf.data
    cannot count it."""
    divisor = 1
    for _ in range(64):
        count = int(dataset.cardinality().numpy())
        if count >= 0:
            return -(-count // divisor)
        if count != -1:
            return None  # unknown
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            divisor *= int(size)
        inputs = dataset._inputs()
        if not inputs:
            return None
        dataset = inputs[0]
    return None


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    where = getattr(module, "__file__", None)
    return os.path.normpath(os.path.dirname(os.path.abspath(where))) + os.sep if where else None


def _library_name(path: str) -> str:
    for root in LIBRARIES:
        if path.startswith(root):
            return path[len(root) :].split(os.sep, 1)[0].removesuffix(".py") or "python"
    return "python"
