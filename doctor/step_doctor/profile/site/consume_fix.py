"""A fix for TensorFlow's profiler crash under MultiWorkerMirroredStrategy, loaded into a process before TensorFlow.

Measured on TensorFlow 2.21 with two local workers (`step-doctor bench-profile --multi-worker`; the figures
in docs/doctor.md): a profiled worker died in `tf.profiler.experimental.stop()` in 8 of 35 runs, an
unprofiled one in none of 35. gdb put every crash in `tsl::profiler::TraceMeRecorder::Consume()`: it keeps
raw pointers into per-thread `std::deque`s of events (to pair an activity that starts on one thread and ends
on another, as every collective does) while the `std::vector` that holds those deques grows, and libstdc++
copies rather than moves a deque on that growth (its move is not noexcept), so the pointers dangle. No
capture mode avoids it: a barrier before the stop, a stop between steps and a remote capture all collect
through the same function. traceme_consume_fix.cc gives that vector's element a noexcept move; loaded with
RTLD_GLOBAL before TensorFlow, its instantiation of the growth function takes the place of TensorFlow's own.

Standard library only: the capture (capture.py) loads this file by its path, inside the user's process.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "traceme_consume_fix.cc")
# The versions whose TraceMeRecorder::ThreadEvents has the layout the fix assumes (tsl's header, unchanged over
# them); the crash and the fix were measured on 2.21.
VERSIONS = ("2.17", "2.18", "2.19", "2.20", "2.21")
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos")


def tensorflow_version() -> str | None:
    """The installed TensorFlow's version, read from its metadata (TensorFlow itself is not imported yet)."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def is_multi_worker(environ=os.environ) -> bool:
    """Whether this process is one of several TF_CONFIG tasks (MultiWorkerMirroredStrategy's case)."""
    import json

    try:
        config = json.loads(environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return False
    cluster = config.get("cluster") if isinstance(config, dict) else None
    return isinstance(cluster, dict) and sum(len(v) for v in cluster.values() if isinstance(v, list)) > 1


def _cache_dir() -> str:
    root = os.environ.get("STEP_DOCTOR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "step-doctor"
    )
    os.makedirs(root, exist_ok=True)
    return root


def build() -> str:
    """The fix compiled once per source and compiler into the cache folder (atomically); its path."""
    compiler = shutil.which(os.environ.get("CXX") or "c++") or shutil.which("g++")
    if compiler is None:
        raise OSError("no C++ compiler (c++ or g++, or CXX) to build it with")
    with open(SOURCE, "rb") as handle:
        digest = hashlib.sha256(handle.read() + compiler.encode()).hexdigest()[:12]
    target = os.path.join(_cache_dir(), f"traceme_consume_fix-{digest}.so")
    if not os.path.exists(target):
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
        os.close(fd)
        try:
            done = subprocess.run(
                [compiler, "-std=c++17", "-O2", "-fPIC", "-shared", "-o", tmp, SOURCE],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode != 0:
                raise OSError(f"{compiler} failed: {done.stderr.strip()[-300:]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


def load() -> dict:
    """Build and load the fix before TensorFlow: {"loaded": bool, "library": path or None, "why": text}."""
    version = tensorflow_version()
    if version is None:
        return {"loaded": False, "library": None, "why": "TensorFlow's version could not be read"}
    if not version.startswith(VERSIONS):
        return {
            "loaded": False,
            "library": None,
            "why": f"TensorFlow {version} is not one the fix was checked against ({', '.join(VERSIONS)})",
        }
    try:
        library = build()
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL).traceme_consume_fix_loaded()
    except (OSError, AttributeError, subprocess.SubprocessError) as error:
        return {"loaded": False, "library": None, "why": f"it could not be built or loaded ({error})"}
    return {"loaded": True, "library": library, "why": f"TensorFlow {version}"}
