"""The fix for TensorFlow's profiler crash under MultiWorkerMirroredStrategy: that it works, that it is checked
in effect before it loads, and that it is refused, with the check named, wherever it would not work.

The crash itself strikes a profiled worker only now and then; these tests do not wait for it. native/
thread_events.cc reproduces its cause deterministically, with TensorFlow's own types: a pointer into a deque
that the vector holding it copies on growth.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from step_doctor.profile.site import consume_fix, tf_binary
from tests.conftest import DOCTOR, STEP_DOCTOR

REPRODUCER = DOCTOR / "tests" / "native" / "thread_events.cc"
COMPILER = shutil.which("c++") or shutil.which("g++")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")


def build_reproducer(folder: Path, name: str, *flags: str) -> Path:
    target = folder / f"{name}.so"
    done = subprocess.run(
        [COMPILER, "-std=c++17", "-fPIC", "-shared", "-O2", *flags, "-o", target, REPRODUCER],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return target


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shim")
    compiler, _ = consume_fix.compiler_identity()
    consume_fix.compile_to(str(folder / "fix.so"), compiler, consume_fix.source_digest())
    return folder / "fix.so"


@pytest.fixture(scope="module")
def reproducer(tmp_path_factory) -> Path:
    return build_reproducer(tmp_path_factory.mktemp("reproducer"), "thread_events")


def survives(library: Path, shim: Path | None) -> int:
    """pointer_survives_growth() in a fresh process (a library loaded RTLD_GLOBAL stays for the process's life)."""
    code = textwrap.dedent(f"""
        import ctypes
        if {str(shim)!r} != "None":
            ctypes.CDLL({str(shim)!r}, mode=ctypes.RTLD_GLOBAL)
        print(ctypes.CDLL({str(library)!r}).pointer_survives_growth())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@needs_compiler
def test_the_dangling_pointer_is_reproduced_without_the_shim_and_kept_valid_with_it(shim, reproducer):
    assert survives(reproducer, None) == 0  # the vector copied the deque and freed the one the pointer points into
    assert survives(reproducer, shim) == 1  # the shim's growth took the place of the library's own: it moved it


@needs_compiler
def test_the_shim_exports_only_what_it_replaces(shim):
    names, _ = tf_binary.dynamic_symbols(str(shim))
    defined = {n for n in names if n} - _undefined(shim)
    assert defined == {tf_binary.REALLOC_INSERT, "traceme_consume_fix_loaded", "traceme_consume_fix_digest"}
    assert consume_fix.carries_this_source(str(shim))


def _undefined(library: Path) -> set:
    done = subprocess.run(["nm", "-D", "--undefined-only", library], capture_output=True, text=True)
    return {line.split()[-1].split("@")[0] for line in done.stdout.splitlines() if line.strip()}


@needs_compiler
def test_the_binary_check_passes_a_build_like_tensorflows(reproducer):
    answer = tf_binary.check(str(reproducer))
    assert (answer["verdict"], answer["check"]) == ("fixable", None)
    assert answer["passed"] == list(tf_binary.CHECKS)


def _renamed(source: Path, target: Path, old: str, new: str) -> Path:
    data = source.read_bytes()
    assert len(old) == len(new) and old.encode() in data
    target.write_bytes(data.replace(old.encode(), new.encode()))
    return target


@needs_compiler
@pytest.mark.parametrize(
    "case, verdict, failed",
    [
        ("missing", "refused", "library"),
        ("not-elf", "refused", "elf"),
        ("no-consume", "refused", "consume"),
        ("upstream-reserve", "fixed-upstream", None),
        ("renamed-growth", "refused", "plt-binding"),
        ("realloc-append", "refused", "no-realloc-append"),
        ("old-string-abi", "refused", "string-abi"),
    ],
)
def test_each_build_the_shim_cannot_fix_is_refused_by_name(case, verdict, failed, reproducer, tmp_path, monkeypatch):
    library = {
        "missing": lambda: tmp_path / "absent.so",
        "not-elf": lambda: _write(tmp_path / "text.so", b"not a library"),
        "no-consume": lambda: _renamed(reproducer, tmp_path / "c.so", "7ConsumeEv", "7CxnsumeEv"),
        # -O0: reserve() is called, not inlined, as TensorFlow 2.17's Consume() calls it
        "upstream-reserve": lambda: build_reproducer(tmp_path, "r", "-DWITH_RESERVE", "-O0"),
        "renamed-growth": lambda: _renamed(reproducer, tmp_path / "g.so", "_M_realloc_insert", "_M_realloc_inserX"),
        "realloc-append": lambda: build_reproducer(tmp_path, "a", "-DWITH_APPEND"),
        "old-string-abi": lambda: build_reproducer(tmp_path, "o", "-D_GLIBCXX_USE_CXX11_ABI=0"),
    }[case]()
    answer = tf_binary.check(str(library))
    assert (answer["verdict"], answer["check"]) == (verdict, failed), answer
    assert answer["why"]
    # what load() makes of it (nothing is loaded either way), and the note a skipped worker gets
    monkeypatch.setenv("STEP_DOCTOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(consume_fix._tf_binary(), "framework_library", lambda: str(library))
    monkeypatch.setattr(consume_fix, "tensorflow_version", lambda: "2.21.0")
    fix = consume_fix.load()
    assert not fix["loaded"] and fix["safe"] == (verdict == "fixed-upstream") and fix["check"] == failed
    if failed:
        assert consume_fix.refusal(fix).startswith(f"check '{failed}' failed: {answer['why']}. ")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@needs_compiler
def test_load_refuses_with_the_check_named_and_loads_nothing(reproducer, tmp_path, monkeypatch):
    old = build_reproducer(tmp_path, "old", "-D_GLIBCXX_USE_CXX11_ABI=0")
    monkeypatch.setenv("STEP_DOCTOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(consume_fix._tf_binary(), "framework_library", lambda: str(old))
    monkeypatch.setattr(consume_fix, "tensorflow_version", lambda: "2.21.0")
    fix = consume_fix.load()
    assert (fix["loaded"], fix["safe"], fix["check"]) == (False, False, "string-abi")
    assert "string-abi" in fix["why"] and "96 bytes" in consume_fix.refusal(fix)
    assert not list((tmp_path / "cache").glob("*.so"))  # refused before anything was built
    assert list((tmp_path / "cache").glob("tf-binary-*.json"))  # the answer is kept for the next process

    monkeypatch.setattr(consume_fix._tf_binary(), "framework_library", lambda: str(reproducer))
    monkeypatch.setattr(consume_fix, "tensorflow_version", lambda: "2.99.0")
    fix = consume_fix.load()
    assert (fix["loaded"], fix["safe"], fix["check"]) == (False, False, "version")


@needs_compiler
def test_the_binary_answer_is_cached_by_path_size_and_mtime(reproducer, tmp_path):
    library = tmp_path / "lib.so"
    shutil.copy(reproducer, library)
    first = tf_binary.cached_check(str(library), str(tmp_path))
    (answer,) = tmp_path.glob("tf-binary-*.json")
    answer.write_text(json.dumps({**first, "why": "read from the cache"}))
    assert tf_binary.cached_check(str(library), str(tmp_path))["why"] == "read from the cache"
    _renamed(reproducer, library, "_M_realloc_insert", "_M_realloc_inserX")
    os.utime(library, ns=(1, 1))  # another build at the same path: another answer
    assert tf_binary.cached_check(str(library), str(tmp_path))["check"] == "plt-binding"


def test_a_cache_folder_others_can_write_to_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("STEP_DOCTOR_CACHE", str(shared))
    folder, why = consume_fix.cache_folder()
    assert folder != str(shared) and "other users can write" in why
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and os.stat(folder).st_uid == os.getuid()


@pytest.mark.skipif(os.getuid() == 0, reason="root writes to any folder")
def test_a_cache_folder_that_is_not_writable_falls_back_to_a_private_one(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setenv("STEP_DOCTOR_CACHE", str(locked))
    folder, why = consume_fix.cache_folder()
    assert folder != str(locked) and "not writable" in why
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_cache_folder_that_cannot_be_made_falls_back_to_a_private_one(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("STEP_DOCTOR_CACHE", str(tmp_path / "a-file" / "cache"))
    folder, why = consume_fix.cache_folder()
    assert "could not be made" in why and stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_read_only_cache_folder_is_used_for_a_prebuilt_library_and_refused_when_others_can_write(
    tmp_path, monkeypatch
):
    prebuilt = tmp_path / "image" / "fix.so"
    prebuilt.parent.mkdir()
    prebuilt.write_bytes(b"")
    monkeypatch.setenv(consume_fix.PREBUILT, str(prebuilt))
    assert consume_fix._prebuilt() == str(prebuilt)
    prebuilt.parent.chmod(0o777)
    with pytest.raises(OSError, match="other users can write"):
        consume_fix._prebuilt()


@needs_compiler
def test_the_build_is_keyed_by_compiler_and_machine(tmp_path, monkeypatch):
    wrapper = tmp_path / "other-c++"
    wrapper.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "other compiler 99"; exit 0; }}\nexec {COMPILER} "$@"\n'
    )
    wrapper.chmod(0o755)
    first = consume_fix.build(str(tmp_path))
    monkeypatch.setenv("CXX", str(wrapper))
    second = consume_fix.build(str(tmp_path))
    monkeypatch.setattr(consume_fix.platform, "machine", lambda: "riscv64")
    third = consume_fix.build(str(tmp_path))
    assert len({first, second, third}) == 3
    assert all(consume_fix.carries_this_source(path) for path in (first, second, third))


@needs_compiler
def test_a_library_built_ahead_of_time_is_loaded_without_compiling(tmp_path):
    """As the Docker image does: prebuild at image build time, STEP_DOCTOR_CONSUME_FIX names it in the pod."""
    target = tmp_path / "image" / "fix.so"
    done = subprocess.run(
        [sys.executable, "-m", "step_doctor.profile.site.consume_fix", "prebuild", target],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=DOCTOR,
    )
    assert done.returncode == 0 and done.stdout.startswith(f"Built {target}. TensorFlow "), done.stderr
    assert consume_fix.carries_this_source(str(target))
    code = "import sys, json; sys.path.insert(0, sys.argv[1]); import consume_fix as f; print(json.dumps(f.load()))"
    env = {**os.environ, consume_fix.PREBUILT: str(target), "STEP_DOCTOR_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(consume_fix.__file__)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    fix = json.loads(done.stdout)
    if fix["binary"]["verdict"] == "fixable":
        assert fix["loaded"] and fix["library"] == str(target), fix
    assert not list((tmp_path / "cache").glob("*.so"))


def test_a_library_from_another_source_is_not_loaded(tmp_path):
    other = tmp_path / "other.so"
    other.write_bytes(b"\x7fELF" + consume_fix.MARKER + b"0123456789abcdef")
    assert not consume_fix.carries_this_source(str(other))


# ---- on the installed TensorFlow (make test-container-stack runs these on 2.17 too) ----------------------------------

BINDINGS = """
import json, os, sys
import importlib.util
spec = importlib.util.spec_from_file_location("fix", sys.argv[1])
fix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fix)
answer = fix.load()
import tensorflow
print(json.dumps(answer))
"""


@pytest.mark.slow
@pytest.mark.stack
@needs_compiler
def test_tensorflow_binds_the_vector_growth_to_the_shim_and_nothing_else(tmp_path):
    """The binding itself, read from the dynamic linker (LD_BIND_NOW: every symbol bound at load): this fails the
    day a TensorFlow build stops calling the shim's function, whatever the binary check said."""
    env = {
        **os.environ,
        "LD_BIND_NOW": "1",
        "LD_DEBUG": "bindings",
        "LD_DEBUG_OUTPUT": str(tmp_path / "ld"),
        "STEP_DOCTOR_CACHE": str(tmp_path / "cache"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    done = subprocess.run(
        [sys.executable, "-c", BINDINGS, consume_fix.__file__], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    bound = set()
    for log in tmp_path.glob("ld.*"):
        for line in log.read_text(errors="replace").splitlines():
            if "libtensorflow_framework" in line.split(" to ")[0] and "traceme_consume_fix" in line:
                bound.add(line.split("`")[1].split("'")[0])
    if answer["binary"]["verdict"] == "fixed-upstream":  # TensorFlow 2.17: Consume() reserves; nothing to load
        assert (answer["loaded"], answer["safe"]) == (False, True) and bound == set()
    else:
        assert answer["loaded"] and answer["binary"]["verdict"] == "fixable", answer
        assert bound == {tf_binary.REALLOC_INSERT}, bound


@pytest.mark.slow
@pytest.mark.stack
def test_the_installed_tensorflows_binary_passes_the_check():
    answer = tf_binary.check(tf_binary.framework_library())
    assert answer["verdict"] in ("fixable", "fixed-upstream"), answer
    assert answer["passed"][:3] == ["library", "elf", "consume"]


SETS_TF_CONFIG = """
import json, os, sys, time
cluster = {{"worker": ["localhost:1", "localhost:2"]}}
config = json.dumps({{"cluster": cluster, "task": {{"type": "worker", "index": 0}}}})
if {before}:
    os.environ["TF_CONFIG"] = config
import tensorflow as tf
os.environ["TF_CONFIG"] = config

@tf.function
def step(x):
    return x * 2.0

for _ in range(40):
    step(tf.constant(1.0))
    time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.stack
@pytest.mark.parametrize("before", [True, False])
def test_a_script_that_sets_tf_config_itself(before, tmp_path):
    """Set before `import tensorflow`, the fix is decided there and the worker captured; set after it, too late for
    the fix: the worker is not captured, and the note says why."""
    (tmp_path / "sets_config.py").write_text(SETS_TF_CONFIG.format(before=before))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CONFIG")}
    done = subprocess.run(
        [str(STEP_DOCTOR), "profile", "--json", "--logdir", "logs", "--", sys.executable, "sets_config.py"],
        cwd=tmp_path,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2", "STEP_DOCTOR_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    document = json.loads(done.stdout) if done.stdout.strip().startswith("{") else None
    assert document, (done.returncode, done.stderr[-2000:])
    (process,) = [p for p in document["capture"]["processes"] if p.get("run") == "worker-0"]
    if before:
        assert process["consume_fix"]["safe"] and process["capture"]["state"] == "done", process
    else:
        assert process["consume_fix"]["check"] == "import-order" and process["capture"]["state"] == "skipped"
        assert any("before `import tensorflow`" in note for note in process["notes"]), process["notes"]
