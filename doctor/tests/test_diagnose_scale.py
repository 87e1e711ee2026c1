"""diagnose at the size of real GPU profiles: the streamed reader, the per-step device figures, large files.

The reader (step_doctor/diagnose/hosttrace.py, activity.py) replaced xprof's trace conversion: on real
profiles captured four ways (step markers, the stock Keras callback, a bare capture,
steps_per_execution 4) it must yield the events xprof's `trace_viewer` conversion shows, with
the same names, times, arguments and nesting, and the same per-step compute. GPU-shaped
profiles (step_doctor_dev/diagnose_scale.py) check the device figures against a direct count,
a damaged large file, and (slow) a profile of hundreds of MB read in bounded memory.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import keras
import numpy as np
import psutil
import pytest
import tensorflow as tf

from step_doctor.callbacks import StepTraceProfiler
from step_doctor.diagnose import (
    activity,
    analysis,
    command,
    hosttrace,
    input_wait,
    render,
    step_windows,
    xprof_converter,
    xspace,
)
from step_doctor.diagnose import report as diagnose
from step_doctor.diagnose.diagnosis import Diagnosis, Run
from step_doctor_dev import bench_diagnose, diagnose_scale, xspace_writer
from tests.conftest import run_cli

VERDICTS = {"input-bound", "device-bound", "host-bound", "not-input-bound", "unknown"}
SESSION = "2026_01_01_00_00_00"
USED_ARGS = (hosttrace.ARGS - {"_r", "iter_num"}) | {"long_name"}  # what the analysis reads; xprof hides _r


def _pipeline():
    def load(index):
        image = tf.image.resize(tf.fill((24, 24, 3), tf.cast(index % 7, tf.float32)), (16, 16))
        return tf.cast(image, tf.uint8), index % 4

    return tf.data.Dataset.range(100_000).map(load, num_parallel_calls=2).batch(8).prefetch(1)


def _model(spe: int = 1):
    model = keras.Sequential(
        [keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, strides=2), keras.layers.Flatten(), keras.layers.Dense(4)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=spe)
    return model


def _capture(logdir: Path, how: str) -> Path:
    if how == "bare":
        model = _model()
        model.fit(_pipeline(), steps_per_epoch=3, verbose=0)
        tf.profiler.experimental.start(str(logdir))
        model.fit(_pipeline(), steps_per_epoch=8, verbose=0)
        tf.profiler.experimental.stop()
    elif how == "stock":
        callback = keras.callbacks.TensorBoard(str(logdir), profile_batch=(2, 9))
        _model().fit(_pipeline(), steps_per_epoch=12, verbose=0, callbacks=[callback])
    else:
        spe = 4 if how == "spe4" else 1
        profiler = StepTraceProfiler(logdir, start_step=2 * spe, num_steps=6)
        _model(spe).fit(_pipeline(), steps_per_epoch=12 * spe, verbose=0, callbacks=[profiler])
    return next(logdir.rglob("*.xplane.pb"))


class _Profiles(dict):
    """how -> the .xplane.pb of a capture made that way, made on first use (a few seconds each)."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, how: str) -> Path:
        self[how] = _capture(self.root / how, how)
        return self[how]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    return _Profiles(tmp_path_factory.mktemp("scale"))


def _xprof_trace(path: Path) -> list[dict]:
    """The host events of xprof's trace conversion (what diagnose read before), sorted and nested as it nested them."""
    raw = json.loads(xprof_converter.xprof_tool([str(path)], "trace_viewer"))["traceEvents"]
    meta = [e for e in raw if e.get("ph") == "M" and e["name"] in ("thread_name", "process_name")]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in meta}
    host = {e["pid"] for e in meta if e["name"] == "process_name" and e["args"]["name"].startswith("/host:")}
    events = [
        {
            "name": e["name"],
            "ts": float(e["ts"]),
            "end": float(e["ts"]) + float(e.get("dur", 0)),
            "thread": names.get((e["pid"], e["tid"]), "?").split("/")[0],
            "tid": (e["pid"], e["tid"]),
            "args": e.get("args") or {},
        }
        for e in raw
        if e.get("ph") == "X" and e["pid"] in host
    ]
    events.sort(key=lambda e: (e["ts"], -e["end"]))
    stacks = defaultdict(list)
    for e in events:  # the nesting the analysis used (hosttrace._nest, before and now)
        stack = stacks[e["tid"]]
        while stack and stack[-1]["end"] < e["end"] - 1e-3:
            stack.pop()
        e["parent"] = stack[-1] if stack else None
        stack.append(e)
    return events


def _read_by_the_analysis(e: dict) -> bool:
    """Whether input_wait.py or step_windows.py reads this event (as an object, not only its time)."""
    name, args, tf_data = e["name"], e["args"], e["thread"].startswith("tf_data")
    return (
        name.startswith("Iterator::")
        or name in hosttrace.GET_NEXT
        or name in (hosttrace.EXECUTOR, hosttrace.EXECUTE, hosttrace.PROFILED_BATCH)
        or (tf_data and (name.startswith(hosttrace.FUNCTION_CALL) or "is_eager" in args))
        or "step_num" in args
        or ("tf_function_call" in args and e["thread"] == "python")
    )


def _key(thread: str, name: str, ts: float) -> tuple:
    return thread, name, round(ts, 3)


WAYS = ["markers", "spe4"] + [pytest.param(how, marks=pytest.mark.slow) for how in ("stock", "bare")]  # 2 more captures


@pytest.mark.parametrize("how", WAYS)
def test_the_reader_yields_the_events_of_xprofs_own_conversion(profiles, how):
    path = profiles[how]
    old = _xprof_trace(path)
    trace = hosttrace.load(path)
    try:
        new = trace.events
        by_key = defaultdict(list)
        for e in old:
            by_key[_key(e["thread"], e["name"], e["ts"])].append(e)
        twin = {}
        for e in new:
            matches = [o for o in by_key[_key(e.thread, e.name, e.ts)] if abs(o["end"] - e.end) < 2e-3]
            assert len(matches) == 1, (e.name, e.ts, e.thread, len(matches))
            o = matches[0]
            twin[id(e)] = o
            for arg in USED_ARGS:
                assert e.args.get(arg) == o["args"].get(arg), (e.name, arg, e.args, o["args"])
            assert e.op == ("is_eager" in o["args"]), e.name
            if "step_num" in e.args:
                assert ("group_id" in e.args) == ("group_id" in o["args"]), (e.name, o["args"])
        mine = {id(o) for o in twin.values()}
        missing = [o["name"] for o in old if _read_by_the_analysis(o) and id(o) not in mine]
        assert not missing, Counter(missing).most_common(5)
        for e in new:  # the innermost kept event above each, the same in both
            above = twin[id(e)]["parent"]
            while above is not None and id(above) not in mine:
                above = above["parent"]
            assert above is (twin[id(e.parent)] if e.parent else None), e.name
        steps = step_windows.find(trace)
        assert steps is not None
        if how == "spe4":  # xprof groups steps_per_execution's loop iterations: our markers get no group
            assert steps.source == step_windows.EXECUTIONS
        _check_compute(old, trace, steps)
        _check_stall(old, trace, steps)
    finally:
        trace.close()


def _merge(intervals: list) -> list:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _check_stall(old: list[dict], trace, steps, least: float = 20.0) -> None:
    """Per step: the time the caller waited in its calls with nothing of the step recorded, in gaps of `least` µs or
    more, computed directly from xprof's events (a threshold low enough that every profile has such gaps)."""
    mine = [e for e in old if e["name"] == hosttrace.EXECUTE and not e["thread"].startswith("tf_data")]
    calls = [(e["ts"], e["end"]) for e in mine]
    callers = {e["tid"] for e in mine}
    work = [
        (e["ts"], e["end"])
        for e in old
        if e["end"] > e["ts"]
        and not e["thread"].startswith("tf_data")
        and (e["tid"] not in callers or "is_eager" in e["args"])
        and not e["name"].startswith("ThreadpoolListener::")  # instants in the file, paired into regions by xprof
    ]
    work += [(e["ts"], e["end"]) for e in old if e["name"] in input_wait.GET_NEXT]
    work.sort()
    gaps, reach = [], -np.inf
    for a, b in work:
        if a - reach >= least:
            gaps.append((reach, a))
        reach = max(reach, b)
    gaps.append((reach, np.inf))
    expected = []
    for lo, hi in steps.windows:
        pieces = [
            min(b, c1, hi) - max(a, c0, lo)
            for a, b in gaps
            for c0, c1 in _merge(calls)
            if min(b, c1, hi) - max(a, c0, lo) >= least
        ]
        expected.append(sum(pieces))
    waits = sorted((e["ts"], e["end"]) for e in old if e["name"] in input_wait.GET_NEXT)
    original = activity.STALL_GAP_US
    activity.STALL_GAP_US = least
    try:
        measured = activity.measure(trace, steps.windows, waits)["stall_us"]
    finally:
        activity.STALL_GAP_US = original
    assert sum(expected) > 0, "no gap to compare: lower `least`"
    np.testing.assert_allclose(measured, expected, rtol=1e-6, atol=1e-3)


def _check_compute(old: list[dict], trace, steps) -> None:
    """Per step: the model's ops outside input waits, computed from xprof's events as diagnose did before."""
    waits = sorted((e["ts"], e["end"]) for e in old if e["name"] in input_wait.GET_NEXT)
    ops = sorted((e["ts"], e["end"]) for e in old if "is_eager" in e["args"] and not e["thread"].startswith("tf_data"))
    expected = []
    for lo, hi in steps.windows:
        inside = [(a, b) for a, b in ops if lo <= a < hi]
        busy = input_wait._clip_union(inside, lo, hi)
        busy -= sum(input_wait._clip_union(inside, max(a, lo), min(b, hi)) for a, b in waits if b > lo and a < hi)
        expected.append(max(busy, 0.0))
    measured = activity.measure(trace, steps.windows, waits)["compute_us"]
    np.testing.assert_allclose(measured, expected, rtol=1e-9, atol=1e-6)


def test_the_union_of_intervals_streamed_in_batches_equals_a_direct_sum():
    rng = np.random.default_rng(3)
    starts = np.sort(rng.uniform(0, 1000, 4000))
    ends = starts + rng.exponential(2.0, len(starts))
    edges = np.sort(rng.uniform(0, 1000, 57))
    union = activity._Union(edges)
    for part in np.array_split(np.arange(len(starts)), 13):
        union.feed(starts[part], ends[part])
    intervals = list(zip(starts, ends))
    direct = [input_wait._clip_union(intervals, a, b) for a, b in zip(edges, edges[1:])]
    np.testing.assert_allclose(union.between(), direct, rtol=1e-9, atol=1e-9)


def _xspace_bytes(lines: list, stat_names: dict, event_names: dict, name="/device:GPU:0") -> bytes:
    space = xspace.MESSAGES["XSpace"]()
    plane = space.planes.add(id=1, name=name)
    for i, n in event_names.items():
        plane.event_metadata[i].id, plane.event_metadata[i].name = i, n
    for i, n in stat_names.items():
        plane.stat_metadata[i].id, plane.stat_metadata[i].name = i, n
    for line in lines:
        plane.lines.add().CopyFrom(line)
    return space.SerializeToString()


def test_blocks_odd_field_orders_and_huge_events_decode_as_protobuf_does(tmp_path):
    line = xspace.MESSAGES["XLine"](id=7, name="Stream #7(Kernel)", timestamp_ns=5)
    rng = np.random.default_rng(0)
    for i in range(3000):
        event = line.events.add(metadata_id=1 + i % 3, offset_ps=i * 10_000, duration_ps=int(rng.integers(1, 9000)))
        event.stats.add(metadata_id=1, str_value="x" * (5000 if i == 1234 else int(rng.integers(0, 300))))
    # an event with its fields out of the usual order (duration before offset, legal protobuf), then the
    # line's display name after its events: what other writers than TensorFlow's may do
    odd = xspace.MESSAGES["XEvent"](metadata_id=2, offset_ps=31_000_000, duration_ps=77).SerializeToString()
    odd = odd[:2] + odd[-2:] + odd[2:-2]
    tail = xspace.MESSAGES["XLine"](display_name="after the events").SerializeToString()
    line_bytes = line.SerializeToString() + xspace_writer.field(4, len(odd)) + odd + tail
    plane = xspace.MESSAGES["XPlane"](id=1, name="/device:GPU:0")
    for i, name in {1: "a", 2: "b", 3: "c"}.items():
        plane.event_metadata[i].id, plane.event_metadata[i].name = i, name
    plane.stat_metadata[1].id, plane.stat_metadata[1].name = 1, "blob"
    plane_bytes = plane.SerializeToString() + xspace_writer.field(3, len(line_bytes)) + line_bytes
    path = tmp_path / "odd.xplane.pb"
    path.write_bytes(xspace_writer.field(1, len(plane_bytes)) + plane_bytes)
    with xspace.XSpaceFile(path) as space:
        (read,) = space.planes[0].lines
        assert (read.id, read.name, read.timestamp_ns) == (7, "Stream #7(Kernel)", 5)
        blocks = list(space.events(read, block_bytes=4096))
    assert len(blocks) > 10
    got = np.concatenate([np.stack([b.metadata_id, b.offset_ps, b.duration_ps]) for b in blocks], axis=1)
    want = [[e.metadata_id, e.offset_ps, e.duration_ps] for e in line.events] + [[2, 31_000_000, 77]]
    np.testing.assert_array_equal(got, np.array(want).T)
    parsed = [xspace.MESSAGES["XEvent"].FromString(raw) for b in blocks for raw in b.stats(np.arange(len(b.starts)))]
    assert [e.stats[0].str_value for e in parsed[:-1]] == [e.stats[0].str_value for e in line.events]


def test_events_out_of_time_order_give_the_same_figures(tmp_path):
    """Writers sort each line; one that did not is read whole and sorted, with the same answer."""
    kernels = xspace.MESSAGES["XLine"](id=1, name="Stream #1(Kernel)", timestamp_ns=0)
    order = np.random.default_rng(1).permutation(500)
    for i in order:
        kernels.events.add(metadata_id=1, offset_ps=int(i) * 4_000_000, duration_ps=3_000_000)
    path = tmp_path / "unsorted.xplane.pb"
    path.write_bytes(_xspace_bytes([kernels], {}, {1: "volta_sgemm_128x64_nn"}))
    trace = hosttrace.HostTrace(path, [], xspace.XSpaceFile(path))
    try:
        windows = [(0.0, 1000.0), (1000.0, 2000.0)]
        (device,) = activity.measure(trace, windows, [])["devices"]
    finally:
        trace.close()
    np.testing.assert_allclose(device["busy_us"], [750.0, 750.0])
    assert device["kernels"].tolist() == [250, 250]


@pytest.fixture(scope="module")
def gpu_profile(profiles, tmp_path_factory):
    """The marker capture with one GPU's streams and launches added: 1.6 MB or more (earlier XLA tests grow it)."""
    out = tmp_path_factory.mktemp("gpu") / "plugins" / "profile" / SESSION / "host.xplane.pb"
    made = diagnose_scale.gpu_shaped(profiles["markers"], out, max(2.0, profiles["markers"].stat().st_size / 1e6 + 1.6))
    assert made["devices"] == 1 and made["kernels_per_step_per_device"] > 100
    return out


def test_device_figures_equal_a_direct_count_of_the_device_plane(gpu_profile):
    trace = hosttrace.load(gpu_profile)
    try:
        steps = step_windows.find(trace)
        wait = input_wait.analyze(trace, steps)
    finally:
        trace.close()
    space = xspace.MESSAGES["XSpace"].FromString(gpu_profile.read_bytes())
    (gpu,) = [p for p in space.planes if p.name.startswith("/device:")]
    busy, kernels, h2d = 0.0, 0, 0.0
    for lo, hi in steps.windows:
        intervals = []
        for line in gpu.lines:
            for e in line.events:
                ts = (line.timestamp_ns * 1000 + e.offset_ps) / 1e6
                end = ts + e.duration_ps / 1e6
                name = gpu.event_metadata[e.metadata_id].name
                if name == "MemcpyH2D":
                    h2d += max(min(end, hi) - max(ts, lo), 0.0)
                elif not name.startswith("Memcpy"):
                    intervals.append((ts, end))
                    kernels += lo <= ts < hi
        busy += input_wait._clip_union(intervals, lo, hi)
    n = len(steps.windows)
    device = wait.device
    assert device.busy_ms == pytest.approx(busy / n / 1e3, abs=1e-3)
    assert device.kernels_per_step == pytest.approx(kernels / n, abs=0.05)
    assert device.h2d_ms == pytest.approx(h2d / n / 1e3, abs=1e-3)
    assert device.launch_ms > 0 and 0 < busy < sum(hi - lo for lo, hi in steps.windows)
    assert not _numpy_values(diagnose.diagnose(gpu_profile.parents[3]).to_json()), (
        "figures must be plain Python numbers"
    )


def _numpy_values(value) -> list:
    """numpy scalars anywhere in a result (they print as np.float64(...) in a repr and in reports)."""
    if isinstance(value, dict):
        return [v for item in value.values() for v in _numpy_values(item)]
    if isinstance(value, list | tuple):
        return [v for item in value for v in _numpy_values(item)]
    return [value] if type(value).__module__ == "numpy" else []


def test_the_size_is_said_and_a_skipped_xprof_breakdown_leaves_the_answer(profiles, monkeypatch):
    logdir = profiles["markers"].parents[3]
    with_xprof = diagnose.diagnose(logdir).runs["."]
    assert with_xprof.profile.profile_mb > 0 and not with_xprof.profile.skipped
    assert with_xprof.profile.large_profile is None
    monkeypatch.setattr(analysis, "XPROF_MAX_MB", 0.0)
    monkeypatch.setattr(analysis, "LARGE_MB", 0.0)
    without = diagnose.diagnose(logdir).runs["."]
    profile = without.profile
    assert "xprof's own step breakdown" in profile.skipped[0] and "MB" in profile.skipped[0]
    assert "host threads" in profile.large_profile and "num_steps=3" in profile.large_profile
    assert profile.has_step_markers and profile.conclusion == ""
    assert profile.input_bound_percent == with_xprof.profile.input_bound_percent
    # The input wait and the ranking come from the trace either way; only the host/device split of the rest is
    # xprof's where it runs, so a step at the border of the two may fall on either side of it.
    if without.verdict == with_xprof.verdict:
        first = [(r.cause, r.estimated_gain) for r in without.recommendations][:1]
        assert first == [(r.cause, r.estimated_gain) for r in with_xprof.recommendations][:1]
    else:
        assert {without.verdict, with_xprof.verdict} == {"device-bound", "host-bound"}


def test_a_truncated_large_profile_is_named_without_reading_it(profiles, tmp_path, monkeypatch):
    big = tmp_path / "big" / "plugins" / "profile" / SESSION / "host.xplane.pb"
    diagnose_scale.gpu_shaped(profiles["markers"], big, 24.0)
    with xspace.XSpaceFile(big) as space:
        largest = max(space.planes, key=lambda p: p.length)
        cut = largest.offset + largest.length // 2
    data_size = big.stat().st_size
    with open(big, "r+b") as handle:
        handle.truncate(cut)
    read = []
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: read.append(n) or real_pread(fd, n, at))
    item = diagnose.diagnose(big.parents[3]).runs["."]
    monkeypatch.undo()
    assert item.verdict == "unreadable" and str(big) in item.error and "\n" not in item.error
    assert "truncated" in item.error and sum(read) < 0.05 * data_size, (sum(read), data_size)
    cli = run_cli("diagnose", str(big.parents[3]), timeout=120)
    assert cli.returncode == command.UNMEASURED and str(big) in cli.stdout and "Traceback" not in cli.stderr


def test_bytes_damaged_anywhere_give_a_diagnosis_or_one_paragraph(profiles, tmp_path):
    """Never a traceback: a flipped byte lands in a length, a name, a timestamp or a stat."""
    good = profiles["markers"].read_bytes()
    rng = np.random.default_rng(7)
    for case in range(6):
        damaged = bytearray(good)
        for at in rng.integers(0, len(good), 4 + case):
            damaged[at] ^= int(rng.integers(1, 256))
        path = tmp_path / f"case{case}" / "plugins" / "profile" / SESSION / "host.xplane.pb"
        path.parent.mkdir(parents=True)
        path.write_bytes(bytes(damaged))
        item = diagnose.diagnose(path.parents[3]).runs["."]
        if item.verdict == "unreadable":  # one paragraph that names the file
            assert str(path) in item.error and "\n" not in item.error, item.error
        else:  # else a whole diagnosis, whose text renders
            assert item.verdict in VERDICTS and isinstance(item.recommendations, tuple), item.verdict
            assert "verdict" in diagnose_text(item).lower()


def test_a_converter_crash_costs_xprofs_breakdown_not_the_diagnosis(profiles, tmp_path, monkeypatch):
    """xprof's converter died of a segmentation fault in CI on bytes damaged as above, and took pytest with it. It
    runs in a child process: a crash there leaves the trace's own diagnosis, says so, and this process lives; a
    hung one is stopped, and one interrupted goes with the call; the next conversion starts another child (here
    one that answers with an error). The crash is a child that kills itself on its first request: the damage
    that crashed the converter left no file to replay, and 2,000 other damaged copies did not crash it."""
    logdir = profiles["markers"].parents[3]
    whole = diagnose.diagnose(logdir).runs["."]
    fake = tmp_path / "crashing.py"
    fake.write_text("import os, signal, sys\nsys.stdin.readline()\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setattr(xprof_converter, "_CHILD", fake)
    monkeypatch.setattr(xprof_converter, "_CONVERTER", xprof_converter._Converter())
    item = diagnose.diagnose(logdir).runs["."]
    note = item.profile.skipped[0]
    assert "crashed (SIGSEGV)" in note and str(profiles["markers"]) in note and "trace itself" in note, note
    assert item.profile.input_bound_percent == whole.profile.input_bound_percent
    assert item.verdict in VERDICTS - {"unknown"} and "crashed (SIGSEGV)" in diagnose_text(item)
    fake.write_text("import sys, time\nsys.stdin.readline()\ntime.sleep(600)\n")
    monkeypatch.setattr(xprof_converter, "TIMEOUT_S", 1.0)
    hung = diagnose.diagnose(logdir).runs["."]
    assert "gave no answer in 1 s and was stopped" in hung.profile.skipped[0], hung.profile.skipped
    assert hung.verdict == item.verdict
    # Ctrl-C with a request in flight (the child interrupts its parent once it has the request): it goes too
    fake.write_text(
        "import os, signal, sys, time\nsys.stdin.readline()\nos.kill(os.getppid(), signal.SIGALRM)\ntime.sleep(600)\n"
    )
    previous = signal.signal(signal.SIGALRM, _interrupt)
    with pytest.raises(KeyboardInterrupt):
        diagnose.diagnose(logdir)
    signal.signal(signal.SIGALRM, previous)
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(fake) in (p.info["cmdline"] or [])]
    fake.write_text(
        "import json, sys\nfor line in sys.stdin:\n"
        "    print(json.dumps({'written': False, 'error': 'ValueError: the converter gave up'}), flush=True)\n"
    )
    failed = diagnose.diagnose(logdir).runs["."]
    assert failed.verdict == "unreadable" and "the converter gave up" in failed.error, failed.error
    assert str(profiles["markers"]) in failed.error and "\n" not in failed.error


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def test_bench_diagnose_adds_the_converters_child_to_the_peak_memory(profiles):
    """xprof's converter holds the whole profile (about 20 MB per MB) in a child process of its own: a peak that
    left it out would read 66 MB for a 7.2 MB profile whose diagnosis needs 280 MB."""
    sample = bench_diagnose._measure(profiles["markers"].parents[3], None, timeout=300)
    assert sample["status"] == 0 and 0 < sample["converter_rss_mb"] < sample["peak_rss_mb"], sample


_MIRRORED = """
import sys
import keras, numpy as np, tensorflow as tf
from step_doctor.callbacks import StepTraceProfiler
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
images, labels = np.zeros((256, 16, 16, 3), np.uint8), np.zeros((256,), np.int64)
ds = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(16).prefetch(2)
with strategy.scope():
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, strides=2), keras.layers.Flatten(),
                              keras.layers.Dense(4)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, steps_per_epoch=12, verbose=0, callbacks=[StepTraceProfiler(sys.argv[1], start_step=2, num_steps=6)])
"""


def test_steps_per_execution_reads_one_iterator_several_times_per_call(profiles):
    """steps_per_execution 4: each call of the train function reads the same iterator four times."""
    item = diagnose.diagnose(profiles["spe4"].parents[3]).runs["."]
    wait = item.profile.wait
    assert (wait.steps_per_window, wait.replicas) == (4, 1)
    assert "each 4 training steps (steps_per_execution)" in diagnose_text(item)


@pytest.mark.long
def test_replicas_of_a_distribution_strategy_are_no_steps_per_execution(tmp_path):
    """MirroredStrategy over two (logical) devices: each step reads one batch per replica, from an iterator of its
    own, so two reads in a step are two replicas, not two steps of steps_per_execution."""
    subprocess.run([sys.executable, "-c", _MIRRORED, str(tmp_path / "mirrored")], check=True, timeout=300)
    item = diagnose.diagnose(tmp_path / "mirrored").runs["."]
    wait = item.profile.wait
    assert wait.getnext_per_step == pytest.approx(2, abs=0.1)
    assert (wait.steps_per_window, wait.replicas) == (1, 2)
    text = diagnose_text(item)
    assert "2 replicas" in text and "training steps (steps_per_execution)" not in text


def diagnose_text(item: Run) -> str:
    return render(Diagnosis("", {".": item}))


def test_analyze_run_reads_the_newest_sub_run_not_the_first_by_name(profiles, tmp_path):
    """A run without a profile of its own (the Keras callback writes into run/train/): its newest capture."""
    for sub, how, session in (
        ("a_first", "stock", "2026_01_01_00_00_00"),
        ("b_newer", "markers", "2026_02_01_00_00_00"),
    ):
        folder = tmp_path / "run" / sub / "plugins" / "profile" / session
        folder.mkdir(parents=True)
        shutil.copy(profiles[how], folder / "host.xplane.pb")
    profile = analysis.analyze_run(tmp_path / "run")
    assert "b_newer" in profile.session and profile.has_step_markers
    own = tmp_path / "run" / "plugins" / "profile" / "2025_01_01_00_00_00"  # older, but the run's own
    own.mkdir(parents=True)
    shutil.copy(profiles["spe4"], own / "host.xplane.pb")
    assert analysis.analyze_run(tmp_path / "run").session == str(own)


@pytest.mark.long
def test_gpu_shaped_profiles_of_hundreds_of_mb_are_read_in_memory_that_grows_sub_linearly(tmp_path):
    """Five times the device planes, less than twice the memory (xprof's conversion needs about 20x the size)."""
    base = diagnose_scale.capture(120, tmp_path / "capture")
    small = diagnose.diagnose(base.parents[3]).runs["."]
    peak = {}
    for mb in (60, 300):
        logdir = tmp_path / f"gpu{mb}"
        made = diagnose_scale.gpu_shaped(base, logdir / "plugins" / "profile" / SESSION / "host.xplane.pb", mb)
        assert made["bytes"] > 0.8 * mb * 1e6 and made["kernels_per_step_per_device"] >= 1000
        sample = bench_diagnose._measure(logdir, None, timeout=900)
        assert sample["status"] == 0, sample
        peak[mb] = sample["peak_rss_mb"]
    assert peak[300] < 2 * peak[60] and peak[300] < 300, peak
    large = diagnose.diagnose(tmp_path / "gpu300").runs["."]
    assert large.profile.skipped and large.profile.large_profile
    # the host's figures are the small capture's; the device planes' kernels are recorded work, so they can only
    # fill a gap in it, never open one or add input wait. (The stall as a whole may move: a gap a kernel filled is
    # compute, and a step whose compute grew far above the others' counts as stretched.)
    grown, base_wait = large.profile.wait, small.profile.wait
    assert grown.input_ms == base_wait.input_ms and grown.step_ms == base_wait.step_ms
    assert grown.stall.gaps_ms <= base_wait.stall.gaps_ms
    assert large.profile.wait.device.kernels_per_step >= made["kernels_per_step_per_device"]
    assert 0 < large.profile.device_busy_percent < 100
