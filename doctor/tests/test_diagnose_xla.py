"""diagnose on steps compiled with XLA: real CPU captures, and the same made GPU-shaped.

A small classifier compiled with `jit_compile=True` is profiled while its batches change length
every step (each compiles the step again) or cycle through two lengths compiled before the
capture. The GPU-shaped profile is the changing one with a GPU added (step_doctor_dev/
diagnose_scale.py): kernels named after XLA fusions, put inside the executable's runs, and the
host's XLA events named as XLA names them on a GPU ("<module>:XLA GPU module",
GpuCompiler::OptimizeHloModule, from XLA's sources; no GPU profile of this stack was available).
The corpus cases (tests/xla_pipelines.py) are checked in tests/test_diagnose_corpus.py.
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from step_doctor.callbacks import StepTraceProfiler
from step_doctor.diagnose import hlo, hosttrace, rendering, step_windows, tf_names, xla, xspace
from step_doctor.diagnose import report as diagnose
from step_doctor.diagnose.diagnosis import Diagnosis, RunDiagnosis
from step_doctor_dev import diagnose_scale

SESSION = "2026_01_01_00_00_00"
# A GPU's names for the CPU capture's XLA events (XLA's sources: gpu_executable.cc, gpu_compiler.cc): one
# OptimizeHloModule per compile, as RunBackend on a CPU; CPU-only nested events under names the analyser ignores.
ON_A_GPU = {
    "HLO passes through layout assignment": "GpuCompiler::OptimizeHloModule",
    "HLO passes after layout assignment": "post-layout_assignment",
    "CpuCompiler::RunBackend": "GpuCompiler::CompileToBackendResult",
    "CpuCompiler::CompileCpuExecutable": "NVPTXCompiler::CompileTargetBinary",
    "JitCompiler::Compile": "CompileSingleModule",
}
FUSIONS = [
    "loop_add_fusion",
    "input_reduce_fusion",
    "loop_multiply_fusion",
    "gemm_fusion_dot",
    "loop_broadcast_fusion",
    "input_scatter_fusion",
    "loop_select_fusion",
    "wrapped_concatenate",
    "loop_divide_fusion",
    "input_reduce_fusion_1",
    "loop_convert_fusion",
    "loop_subtract_fusion",
]


def _capture(logdir: Path, lengths: list[int], start_step: int, steps: int) -> Path:
    """Profile a small classifier compiled with XLA, fed batches of 8 sequences whose length cycles through
    `lengths`, from `start_step` on for `steps` marked steps; the .xplane.pb written."""
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(500, 16),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
    ds = tf.data.Dataset.from_tensor_slices(np.asarray(lengths, np.int32)).repeat()
    ds = ds.map(lambda n: (tf.ones((8, n), tf.int32), tf.zeros((8,), tf.float32))).prefetch(2)
    profiler = StepTraceProfiler(logdir, start_step=start_step, num_steps=steps)
    model.fit(ds, steps_per_epoch=start_step + steps + 3, verbose=0, callbacks=[profiler])
    return next(logdir.rglob("*.xplane.pb"))


@pytest.fixture(scope="module")
def churning(tmp_path_factory) -> Path:
    """A new batch length every step: the step compiles again in each."""
    return _capture(tmp_path_factory.mktemp("churning"), list(range(16, 64)), start_step=1, steps=6)


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    """Two lengths in turn, both compiled before the capture starts."""
    return _capture(tmp_path_factory.mktemp("warm"), [16, 32], start_step=4, steps=4)


def _recorded(capture: Path) -> None:
    """Skip where this TensorFlow's XLA records no event on a CPU (2.17, the container stack): what these tests read
    is not there; test_an_xla_that_records_no_event_says_so checks that stack."""
    trace = hosttrace.load(capture)
    try:
        if not trace.xla_runs and not trace.xla_compiles:
            pytest.skip(f"TensorFlow {tf.__version__}'s XLA records no event on a CPU")
    finally:
        trace.close()


def _only(logdir: Path) -> RunDiagnosis:
    (item,) = diagnose.diagnose(logdir).runs.values()
    return item


def _gpu_shaped(base: Path, out: Path, renamed: dict) -> Path:
    """`base` with a GPU whose kernels run inside each step's XLA run, and the host's XLA events `renamed`."""
    trace = hosttrace.load(base)
    try:
        steps = step_windows.find(trace)
        runs = [next(e for e in trace.xla_runs if lo <= e.ts < hi) for lo, hi in steps.windows]
        module = next(e.args["name"] for e in trace.xla_compiles if e.name == "CpuCompiler::RunBackend")
    finally:
        trace.close()
    names = {**renamed, "CpuExecutable::ExecuteAsyncOnStream": f"{module}:XLA GPU module"}
    names.update((kernel, fusion) for (kernel, _), fusion in zip(diagnose_scale.KERNELS, FUSIONS))
    path = out / "plugins" / "profile" / SESSION / "host.xplane.pb"
    # 1 MB of device events, whatever the capture holds (its /host:metadata keeps every XLA executable of the process)
    size = base.stat().st_size / 1e6 + 1.0
    made = diagnose_scale.gpu_shaped(base, path, size, spans=[(e.ts, e.end) for e in runs], renamed=names)
    assert made["devices"] == 1 and made["kernels_per_step_per_device"] >= 10
    return path


def test_a_step_compiled_for_every_new_shape_on_cpu(churning):
    _recorded(churning)
    item = _only(churning.parents[3])
    wait = item.profile.wait
    seen = wait.xla
    assert seen.churn and seen.compile_steps >= wait.steps - 1 and seen.shapes >= wait.steps - 1
    assert seen.compile_each_ms > seen.lowering_each_ms > 0  # the lowering before XLA's first event
    assert item.recommendations[0].cause == "recompilation" and item.verdict == "host-bound"
    assert len(seen.ran_shapes) == seen.programs and all(s.startswith("s32[8,") for s in seen.ran_shapes)


def test_gpu_shaped_xla_steps_count_their_kernels_as_device_compute_and_compiling_as_host_time(churning, tmp_path):
    """The GPU's kernels (named after fusions) are the device's compute; GpuCompiler's events are compile time, which
    leaves the device idle: host-bound, recompilation first, as on the CPU."""
    _recorded(churning)
    path = _gpu_shaped(churning, tmp_path, ON_A_GPU)
    item = _only(path.parents[3])
    profile, wait = item.profile, item.profile.wait
    seen = wait.xla
    assert profile.hardware_type == "GPU" and item.device.busy_percent is not None, item.device
    assert wait.device.kernels_per_step >= 10 and 0 < wait.device.busy_ms < seen.compile_each_ms
    assert 0.9 <= seen.runs_per_step <= 1.1 and seen.compiles >= wait.steps - 1 and seen.churn, seen
    assert wait.compile_ms >= 0.5 * wait.step_ms and profile.breakdown.compile_ms == wait.compile_ms
    assert item.device.busy_percent < 50 and item.verdict == "host-bound"
    first = item.recommendations[0]
    assert first.cause == "recompilation" and "compiles of" in first.evidence, item.recommendations
    with xspace.XSpaceFile(path) as space:  # the renamed events are what the analysis read
        names = set(hosttrace.host_planes(space)[0].event_names.values())
    assert "GpuCompiler::OptimizeHloModule" in names and "CpuCompiler::RunBackend" not in names


def test_a_trace_without_compile_events_says_what_it_cannot_see(churning, tmp_path):
    """The same GPU-shaped steps from a TensorFlow whose compiler records nothing: XLA still runs the step and the
    shapes still change, but no compile is measured, so no gain is estimated from the step's unexplained time."""
    _recorded(churning)
    with xspace.XSpaceFile(churning) as space:
        names = hosttrace.host_planes(space)[0].event_names.values()
        unnamed = {name: f"unnamed pass {i}" for i, name in enumerate(names) if tf_names.XLA_COMPILES.match(name)}
    item = _only(_gpu_shaped(churning, tmp_path, unnamed).parents[3])
    seen = item.profile.wait.xla
    assert seen.used and seen.compiles == 0 and item.profile.wait.compile_ms == 0.0
    causes = {r.cause for r in item.recommendations}
    assert not causes & {"recompilation", "small-batch", "per-step-overhead"}, item.recommendations
    (note,) = [n for n in item.notes if "none compiled in the window" in n]
    assert "no gain is estimated" in note and "distinct batch shapes" in note and f"{seen.executables} XLA" in note


def test_a_window_after_every_compile_names_the_executables_it_ran(warm):
    _recorded(warm)
    item = _only(warm.parents[3])
    wait = item.profile.wait
    seen = wait.xla
    assert seen.used and seen.compiles == 0 and not seen.warm_up and not seen.churn
    assert seen.programs == 2 and seen.ran_shapes == ("s32[8,16]", "s32[8,32]"), seen
    assert seen.executables == 2 and tuple(sorted(seen.compiled_shapes)) == seen.ran_shapes
    assert "recompilation" not in {r.cause for r in item.recommendations}
    (note,) = [n for n in item.notes if "none compiled in the window" in n]
    assert note.startswith("2 XLA executables in the process (compiled for s32[8,16], s32[8,32]")
    assert "XLA: " in rendering.render(Diagnosis("", {".": item}))


def test_an_xla_that_records_no_event_says_so(churning, warm):
    """TensorFlow 2.17's XLA on a CPU records neither its runs nor its compiles: the step is one opaque kernel, and
    all of it but the input wait would read as per-step overhead. diagnose says XLA ran it unrecorded (executables in
    /host:metadata, no model ops), estimates nothing from its time, and names the shapes that keep changing."""
    trace = hosttrace.load(churning)
    try:
        recorded = bool(trace.xla_runs or trace.xla_compiles)
    finally:
        trace.close()
    if recorded:
        pytest.skip(
            f"TensorFlow {tf.__version__}'s XLA records its events: make test-container-stack runs this on 2.17"
        )
    for capture, churns in ((churning, True), (warm, False)):
        item = _only(capture.parents[3])
        seen = item.profile.wait.xla
        assert seen.used and seen.recorded is False and seen.compiles == 0, seen
        assert all(s.startswith("s32[8,") for s in seen.compiled_shapes) and seen.executables >= 2, seen
        causes = {r.cause for r in item.recommendations}
        assert not causes & {"recompilation", "small-batch", "per-step-overhead"}, item.recommendations
        (note,) = [n for n in item.notes if n.startswith(xla.UNRECORDED)]
        assert "no gain is estimated" in note and ("compiles the step again" in note) == churns, note


def test_the_compiled_shapes_are_read_as_tensorflow_reads_the_hlo_proto(churning):
    """hlo.py walks the HloProto by field number; TensorFlow's own classes (here, in the test only) agree."""
    from tensorflow.compiler.xla import xla_data_pb2
    from tensorflow.compiler.xla.service import hlo_pb2

    def shape(s) -> str:
        if s.element_type == xla_data_pb2.TUPLE:
            return "(" + ", ".join(shape(t) for t in s.tuple_shapes) + ")"
        name = xla_data_pb2.PrimitiveType.Name(s.element_type).lower()
        return f"{name}[{','.join(str(d) for d in s.dimensions)}]"

    with xspace.XSpaceFile(churning) as space:
        (plane,) = [p for p in space.planes if p.name == xla.METADATA]
        found = list(space.metadata_stats(plane, {xla.HLO_PROTO}))
    assert len(found) >= 2
    for _, stats in found:
        proto = hlo_pb2.HloProto.FromString(stats[xla.HLO_PROTO])
        expected = tuple(shape(p) for p in proto.hlo_module.host_program_shape.parameters)
        assert hlo.parameter_shapes(stats[xla.HLO_PROTO]) == expected and expected
    with pytest.raises(hlo.HloError):
        hlo.parameter_shapes(b"\x0a\xff\xff\xff")
