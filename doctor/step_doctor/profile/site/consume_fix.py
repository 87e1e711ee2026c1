"""A fix for TensorFlow's profiler crash under MultiWorkerMirroredStrategy, loaded into a process before TensorFlow.

A profiled worker dies in `tf.profiler.experimental.stop()` now and then on TensorFlow 2.21 (the count is in
docs/doctor.md): `tsl::profiler::TraceMeRecorder::Consume()` keeps raw pointers into per-thread `std::deque`s of
events while the `std::vector` that holds them grows, and libstdc++ copies rather than moves a deque on that growth
(its move is not noexcept), so the pointers dangle. traceme_consume_fix.cc gives that vector's element a noexcept
move; loaded with RTLD_GLOBAL before TensorFlow, its instantiation of the growth function takes the place of
TensorFlow's own.

It is loaded only where it is proven to be in effect (tf_binary.py reads TensorFlow's library first), and only
from a folder no other user can write to. Standard library only: the capture (capture.py) loads this file by its
path, inside the user's process. `python -m step_doctor.profile.site.consume_fix prebuild DEST` builds it ahead of
time (the Docker image does), so that a process never compiles anything.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "traceme_consume_fix.cc")
VERSION_SCRIPT = os.path.join(HERE, "traceme_consume_fix.map")
# The versions whose TraceMeRecorder::ThreadEvents has the layout the fix assumes (tsl's header, unchanged over
# them); the crash and the fix were measured on 2.21.
VERSIONS = ("2.17", "2.18", "2.19", "2.20", "2.21")
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos")
PREBUILT = "STEP_DOCTOR_CONSUME_FIX"  # a library built ahead of time (prebuild), used instead of the cache
MARKER = b"TRACEME_CONSUME_FIX_DIGEST="


def _tf_binary():
    name = "_step_doctor_profile_tf_binary"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "tf_binary.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


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
    try:
        config = json.loads(environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return False
    cluster = config.get("cluster") if isinstance(config, dict) else None
    return isinstance(cluster, dict) and sum(len(v) for v in cluster.values() if isinstance(v, list)) > 1


def source_digest() -> str:
    """What a built library must carry to be loaded: the digest of the source and its version script."""
    digest = hashlib.sha256()
    for path in (SOURCE, VERSION_SCRIPT):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()[:16]


def unsafe_folder(path: str) -> str | None:
    """Why a library in this folder must not be trusted (others may write to it), or None."""
    try:
        info = os.lstat(path)
    except OSError as error:
        return f"{path} cannot be read ({error.strerror})"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    if info.st_uid not in (os.getuid(), 0):
        return f"{path} belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"other users can write to {path} (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _configured_cache() -> str:
    return os.environ.get("STEP_DOCTOR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "step-doctor"
    )


def _private_folder() -> str:
    """A folder of this user's alone (mode 0700) under the temporary folder, made once per user."""
    path = os.path.join(tempfile.gettempdir(), f"step-doctor-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return tempfile.mkdtemp(prefix="step-doctor-")
    if unsafe_folder(path) or os.lstat(path).st_uid != os.getuid():
        return tempfile.mkdtemp(prefix="step-doctor-")  # someone else made it first: one of our own, 0700
    return path


def cache_folder() -> tuple[str, str | None]:
    """(the folder to build and keep the fix in, why the configured one was not used or None)."""
    configured = _configured_cache()
    try:
        os.makedirs(configured, mode=0o700, exist_ok=True)
    except OSError as error:
        return _private_folder(), f"the cache folder {configured} could not be made ({error.strerror})"
    why = unsafe_folder(configured)
    if why is None and not os.access(configured, os.W_OK):
        why = f"the cache folder {configured} is not writable"
    if why is not None:
        return _private_folder(), why
    return configured, None


def compiler_identity() -> tuple[str, str]:
    """(the C++ compiler's path, what identifies its output: version and target machine)."""
    compiler = shutil.which(os.environ.get("CXX") or "c++") or shutil.which("g++")
    if compiler is None:
        raise OSError("no C++ compiler (c++ or g++, or CXX) to build it with")
    compiler = os.path.realpath(compiler)
    lines = []
    for flag in ("--version", "-dumpmachine"):
        done = subprocess.run([compiler, flag], capture_output=True, text=True, timeout=60)
        lines.append((done.stdout.splitlines() or [""])[0])
    return compiler, "|".join([compiler, *lines, platform.machine()])


def compile_to(target: str, compiler: str, digest: str) -> None:
    """Build the fix into target, atomically (a process that reads it sees a whole library or none)."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    try:
        done = subprocess.run(
            [
                compiler,
                "-std=c++17",
                "-O2",
                "-fPIC",
                "-shared",
                f'-DTRACEME_CONSUME_FIX_DIGEST="{digest}"',
                f"-Wl,--version-script={VERSION_SCRIPT}",
                "-o",
                tmp,
                SOURCE,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-300:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(folder: str) -> str:
    """The fix compiled once per source, compiler and machine into folder; its path."""
    compiler, identity = compiler_identity()
    digest = source_digest()
    key = hashlib.sha256(f"{digest}|{identity}".encode()).hexdigest()[:12]
    target = os.path.join(folder, f"traceme_consume_fix-{key}.so")
    if not os.path.exists(target):
        compile_to(target, compiler, digest)
    return target


def carries_this_source(library: str) -> bool:
    with open(library, "rb") as handle:
        return MARKER + source_digest().encode() in handle.read()


def _prebuilt() -> str | None:
    """STEP_DOCTOR_CONSUME_FIX, where it names a library built from this source in a folder others cannot write."""
    path = os.environ.get(PREBUILT)
    if not path or not os.path.isfile(path):  # not built there (an image without a compiler): built here instead
        return None
    why = unsafe_folder(os.path.dirname(os.path.abspath(path)))
    if why:
        raise OSError(f"{PREBUILT}={path}: {why}")
    return path


def load() -> dict:
    """Load the fix before TensorFlow where the binary shows it in effect. {"loaded": bool, "safe": bool (loaded,
    or not needed on this build), "check": the check that failed or None, "library": path or None, "why": text,
    "binary": tf_binary's answer}."""
    version = tensorflow_version()

    def answer(loaded: bool, safe: bool, check: str | None, why: str, library=None, binary=None) -> dict:
        return {
            "loaded": loaded,
            "safe": safe,
            "check": check,
            "library": library,
            "why": why,
            "binary": binary,
            "tensorflow": version,
        }

    if version is None:
        return answer(False, False, "version", "TensorFlow's version could not be read")
    folder, moved = cache_folder()
    binary = _tf_binary().cached_check(_tf_binary().framework_library(), folder)
    if binary["verdict"] == "fixed-upstream":
        return answer(False, True, None, f"TensorFlow {version}: {binary['why']}", binary=binary)
    if binary["verdict"] != "fixable":
        return answer(
            False, False, binary["check"], f"check '{binary['check']}' failed: {binary['why']}", binary=binary
        )
    if not version.startswith(VERSIONS):
        return answer(
            False,
            False,
            "version",
            f"TensorFlow {version} is not one the fix was checked against "
            f"({', '.join(VERSIONS)}): its ThreadEvents may be laid out otherwise",
            binary=binary,
        )
    try:
        library = _prebuilt() or build(folder)
        if not carries_this_source(library):
            return answer(
                False,
                False,
                "source",
                f"{library} was not built from this doctor's traceme_consume_fix.cc",
                binary=binary,
            )
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL).traceme_consume_fix_loaded()
    except (OSError, AttributeError, subprocess.SubprocessError) as error:
        return answer(False, False, "build", f"it could not be built or loaded ({error})", binary=binary)
    why = f"TensorFlow {version}: {binary['why']}" + (f"; built in {folder} because {moved}" if moved else "")
    return answer(True, True, None, why, library=library, binary=binary)


HINTS = {
    "build": "A C++ compiler (c++, g++ or $CXX) lets it build.",
    "import-order": "Set TF_CONFIG in the environment, or before `import tensorflow`.",
    "version": "It is loaded only where its layout was checked (docs/doctor.md, multi-worker runs).",
}


def refusal(fix: dict) -> str:
    """Why the fix is not in effect, naming the check that failed, and what would let it load."""
    hint = HINTS.get(fix.get("check"), "TensorFlow's binary does not let the fix take effect (docs/doctor.md).")
    return f"{fix['why']}. {hint}"


def prebuild(target: str) -> int:
    """Build the fix into target ahead of time and say what the installed TensorFlow's binary allows."""
    binary = _tf_binary().check(_tf_binary().framework_library())
    said = f"TensorFlow {tensorflow_version()}: {binary['verdict']}" + (
        f" (check '{binary['check']}' failed: {binary['why']})" if binary["check"] else f" ({binary['why']})"
    )
    try:
        os.makedirs(os.path.dirname(os.path.abspath(target)), mode=0o755, exist_ok=True)
        compiler, _ = compiler_identity()
        compile_to(os.path.abspath(target), compiler, source_digest())
    except (OSError, subprocess.SubprocessError) as error:  # an image without a compiler still builds
        print(f"warning: the multi-worker profiler fix was not built ({error}); {said}", file=sys.stderr)
        return 0
    print(f"Built {target}. {said}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "prebuild":
        print("usage: python -m step_doctor.profile.site.consume_fix prebuild DEST.so", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(prebuild(sys.argv[2]))
