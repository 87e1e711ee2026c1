"""Large profiles to measure `diagnose` on, made here (never committed): real captures, GPU-shaped ones.

`capture(steps, out)`: a real profile of a user pipeline that waits on its input, a serial
map of JPEG decodes (`tf.data` without num_parallel_calls) feeding a small Keras model, with
the project's step markers. 12, 120 and 600 steps give about 0.4, 4 and 20 MB.

`gpu_shaped(base, out, target_mb)`: that capture with GPUs added, up to a GB: device planes
(`/device:GPU:N`, one line per CUDA stream, as TensorFlow's CUPTI collector writes them) with
kernel, copy and memset events of realistic names and stats, thousands per step, packed into
the part of each real step that did not wait for input; and on the host, one CUDA launch
call per kernel (what a GPU capture holds too, on the launching threads). The host plane of
the capture is kept byte for byte, so the host-side answer stays the capture's own.

Events are encoded a column at a time with numpy (the XSpace wire format: tags, varints,
length prefixes), written to temporary files next to the output, then assembled: memory stays
at a few tens of MB whatever the size asked for.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from step_doctor.diagnose import hosttrace, input_wait, step_windows, xspace
from step_doctor_dev import xspace_writer

BATCH = 32  # with the model below: about 34 KB of profile per step, as the capture in issue 24
IMAGE = 256
KERNELS_PER_DEVICE_STEP = 2500  # a large model's step on one GPU; more bytes asked for means more GPUs
MAX_DEVICES = 8
BUSY = 0.7  # share of each step's compute span in which a kernel runs on the main stream

# (kernel name as CUPTI reports it, after demangling; the TensorFlow op it ran for)
KERNELS = [
    (
        "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_execute_"
        "segment_k_off_kernel__5x_cudnn",
        "sequential/conv2d/Conv2D:Conv2D",
    ),
    (
        "void cudnn::engines_precompiled::nchwToNhwcKernel<__half, __half, float, false, true, "
        "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, __half const*, __half*)",
        "sequential/conv2d/Conv2D:Conv2D",
    ),
    (
        "void tensorflow::BiasNHWCKernel<Eigen::half>(int, Eigen::half const*, Eigen::half const*, Eigen::half*, int)",
        "sequential/conv2d/BiasAdd:BiasAdd",
    ),
    (
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<Eigen::"
        "Tensor<Eigen::half, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorCwiseUnaryOp<Eigen::internal::"
        "scalar_max_op<Eigen::half, Eigen::half, 0>, Eigen::TensorMap<Eigen::Tensor<Eigen::half const, 1, 1, long>, "
        "16, Eigen::MakePointer> const> const> const, Eigen::GpuDevice>, long>(Eigen::TensorEvaluator<...>, long)",
        "sequential/conv2d/Relu:Relu",
    ),
    (
        "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_"
        "cublas",
        "sequential/dense/MatMul:MatMul",
    ),
    (
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<__half, float, 512, true, 1>(cudnnTensorStruct, __half const*, "
        "cudnnTensorStruct, __half*, float const*, float const*, float, float, float*, float*, float*, float*, "
        "float, float)",
        "sequential/batch_normalization/FusedBatchNormV3:FusedBatchNormV3",
    ),
    (
        "void tensorflow::functor::ColumnReduceKernel<Eigen::half const*, float*, cub::Sum>(Eigen::half const*, "
        "float*, int, int, cub::Sum, std::iterator_traits<Eigen::half const*>::value_type)",
        "gradient_tape/BiasAddGrad:BiasAddGrad",
    ),
    (
        "sm90_xmma_dgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_execute_"
        "kernel__5x_cudnn",
        "gradient_tape/conv2d/Conv2DBackpropInput:Conv2DBackpropInput",
    ),
    (
        "sm90_xmma_wgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_execute_"
        "kernel__5x_cudnn",
        "gradient_tape/conv2d/Conv2DBackpropFilter:Conv2DBackpropFilter",
    ),
    (
        "void tensorflow::functor::ApplyAdamKernel<float>(int, float*, float*, float*, float const*, float const*, "
        "float const*, float const*, float const*, float const*, float const*, bool)",
        "adam/ApplyAdam:ResourceApplyAdam",
    ),
    (
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<Eigen::"
        "Tensor<float, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorConversionOp<float, Eigen::TensorMap<Eigen::"
        "Tensor<Eigen::half const, 1, 1, long>, 16, Eigen::MakePointer> const> const> const, Eigen::GpuDevice>, long>"
        "(Eigen::TensorEvaluator<...>, long)",
        "Cast:Cast",
    ),
    (
        "void tensorflow::functor::SparseXentKernel<float, int>(float const*, int const*, float const*, float*, "
        "float*, int, int)",
        "compile_loss/SparseSoftmaxCrossEntropyWithLogits:SparseSoftmaxCrossEntropyWithLogits",
    ),
]
COPIES = [
    ("MemcpyH2D", "cuMemcpyHtoDAsync_v2", "kind_src:pinned kind_dst:device size:6291456 dest:0 async:1"),
    ("MemcpyD2H", "cuMemcpyDtoHAsync_v2", "kind_src:device kind_dst:pinned size:4 dest:0 async:1"),
    ("MemcpyD2D", "cuMemcpyDtoDAsync_v2", "kind_src:device kind_dst:device size:1048576 dest:0 async:1"),
]
LAUNCH = "cuLaunchKernel"


# ---- a real capture ---------------------------------------------------------------------------


def capture(steps: int, out: Path) -> Path:
    """Profile `steps` marked steps of the serial JPEG-decoding pipeline into out/; the .xplane.pb written."""
    import keras
    import tensorflow as tf

    from step_doctor.callbacks import StepTraceProfiler

    out = Path(out)
    images = out / "jpeg"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(64):
        pixels = np.kron(
            rng.integers(0, 255, (IMAGE // 8, IMAGE // 8, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8)
        )
        path = images / f"{i:03d}.jpg"
        path.write_bytes(tf.io.encode_jpeg(pixels).numpy())
        paths.append(str(path))

    def load(path):  # a user's map, written without num_parallel_calls: one JPEG at a time
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.cast(tf.image.resize(image, (64, 64)), tf.uint8), 0

    dataset = tf.data.Dataset.from_tensor_slices(paths).repeat().map(load).batch(BATCH)
    model = keras.Sequential(
        [
            keras.Input((64, 64, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(8, 3, strides=4, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    logdir = out / "profile"
    shutil.rmtree(logdir, ignore_errors=True)
    profiler = StepTraceProfiler(logdir, start_step=2, num_steps=steps)
    model.fit(dataset, steps_per_epoch=steps + 6, epochs=1, verbose=0, callbacks=[profiler])
    return next(logdir.rglob("*.xplane.pb"))


# ---- GPU planes added to a real capture ----------------------------------------------------------

_WEIGHTS = np.array([1.3, 0.4, 0.5, 0.6, 1.2, 0.9, 0.5, 1.3, 1.3, 0.8, 0.4, 0.5])  # kernel time by type
_DEVICE_STATS = [
    "correlation_id",
    "context_id",
    "theoretical_occupancy_pct",
    "occupancy_min_grid_size",
    "occupancy_suggested_block_size",
    "kernel_details",
    "tf_op",
    "memcpy_details",
]
_DETAILS = [
    f"regs:{32 + 8 * (i % 6)} static_shared:0 dynamic_shared:{(i % 3) * 16384} grid:{64 << (i % 5)},1,1 "
    f"block:{128 << (i % 3)},1,1 occ_pct:{50.0 + 6.25 * (i % 8)}"
    for i in range(len(KERNELS))
]


def _spans(base: Path) -> tuple[list[tuple[float, float]], int]:
    """Each analysed step's span after its input wait (µs), and the host lines' start (ns)."""
    trace = hosttrace.load(base)
    try:
        steps = step_windows.find(trace)
        if steps is None:
            raise ValueError(f"{base} shows no training steps to put device work in")
        waits = sorted((e.ts, e.end) for e in trace.events if e.name in input_wait.GET_NEXT)
        spans = []
        for lo, hi in steps.windows:
            done = [b for a, b in waits if lo <= a < hi and b <= hi]
            spans.append((max([lo, *done]), hi))
        start_ns = hosttrace.host_planes(trace.space)[0].lines[0].timestamp_ns
    finally:
        trace.close()
    return spans, start_ns


def _producers(base: Path, spans: list[tuple[float, float]]) -> list[tuple[int, str, int] | None]:
    """Per step, the context (`_p`, `_pt`) the train function's run hands to its executors.

    xprof follows it from the step marker to the executor threads; the launch threads below
    take it too, so xprof groups their launches, and the kernels, into the step as in a real capture.
    """
    found = [None] * len(spans)
    starts = np.array([a for a, _ in spans])
    with xspace.XSpaceFile(base) as space:
        plane = hosttrace.host_planes(space)[0]
        runs = [i for i, name in plane.event_names.items() if name == "FunctionRun"]
        stat = {name: i for i, name in plane.stat_names.items()}
        line = next((ln for ln in plane.lines if ln.thread == "python"), None)
        if not runs or line is None or "_p" not in stat or "_pt" not in stat:
            return found
        for block in space.events(line):
            which = np.flatnonzero(np.isin(block.metadata_id, runs))
            for i, raw in zip(which, block.stats(which)):
                values = {s.metadata_id: s for s in xspace.MESSAGES["XEvent"].FromString(raw).stats}
                if stat["_p"] in values and stat["_pt"] in values:
                    ts = (line.timestamp_ns * 1000 + int(block.offset_ps[i])) / 1e6
                    j = int(np.searchsorted(starts, ts, side="right")) - 1
                    producer = values[stat["_p"]]
                    kind = producer.WhichOneof("value")
                    if 0 <= j and found[j] is None:
                        found[j] = (getattr(producer, kind), kind, int(values[stat["_pt"]].int64_value))
    return found


class _Device:
    """One GPU's streams and its launching host thread, written to temporary files step by step."""

    STREAMS = {
        "Stream #14(Kernel)": 14,
        "Stream #18(Kernel)": 18,
        "Stream #15(MemcpyH2D)": 15,
        "Stream #16(MemcpyD2H)": 16,
        "Stream #17(MemcpyD2D)": 17,
    }

    def __init__(self, index: int, folder: Path, start_ns: int, host_ids: dict, seed: int):
        self.index, self.start_ps, self.host_ids = index, start_ns * 1000, host_ids
        self.rng = np.random.default_rng(seed + index)
        self.files = {name: open(folder / f"gpu{index}_{sid}.bin", "wb") for name, sid in self.STREAMS.items()}
        self.files["launch"] = open(folder / f"gpu{index}_launch.bin", "wb")
        self.correlation = index << 40

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()

    def step(self, spans: np.ndarray, per_step: int, producers: list) -> None:
        """Kernels, copies and their launches for a run of steps (spans: (n, 2) µs)."""
        n = len(spans)
        a, b = spans[:, 0], spans[:, 1]
        span = np.maximum(b - a, 1.0)
        slot = np.repeat(span / per_step, per_step)
        k = np.tile(np.arange(per_step), n)
        owner = np.repeat(np.arange(n), per_step)
        kinds = (k + owner) % len(KERNELS)
        start = np.repeat(a, per_step) + k * slot
        jitter = self.rng.uniform(0.85, 1.1, len(start))
        duration = np.minimum(slot * BUSY * _WEIGHTS[kinds] * jitter, 0.95 * slot)
        second = np.flatnonzero(k % 8 == 3)  # a second stream runs some kernels at the same time
        steps = np.arange(n)
        events = {
            "Stream #14(Kernel)": (start, duration, kinds, owner),
            "Stream #18(Kernel)": (
                start[second] + 0.2 * slot[second],
                0.6 * slot[second],
                (kinds[second] + 5) % len(KERNELS),
                owner[second],
            ),
            "Stream #15(MemcpyH2D)": (a, 0.02 * span, np.full(n, len(KERNELS)), steps),
            "Stream #16(MemcpyD2H)": (b - 0.012 * span, 0.01 * span, np.full(n, len(KERNELS) + 1), steps),
            "Stream #17(MemcpyD2D)": (a + 0.5 * span, 0.01 * span, np.full(n, len(KERNELS) + 2), steps),
        }
        launches = []
        for name, (t, d, what, of_step) in events.items():
            correlation = self.correlation + np.arange(len(t), dtype=np.int64)
            self.correlation += len(t)
            self.files[name].write(self._device_events(t, d, what, correlation))
            launches.append((t - 6.0, what, correlation, of_step))
        self.files["launch"].write(self._launches(*(np.concatenate(p) for p in zip(*launches)), producers))

    def _launches(self, t, what, correlation, of_step, producers: list) -> bytes:
        """The host thread's launch calls, each step's inside an executor event that joins the step's group."""
        order = np.argsort(t, kind="stable")
        t, what, correlation, of_step = t[order], what[order], correlation[order], of_step[order]
        gap = np.diff(t, append=t[-1] + 10.0)
        duration = np.clip(np.minimum(3.0, 0.8 * gap), 0.001, None)
        name = np.where(what < len(KERNELS), self.host_ids[LAUNCH], 0)
        for j, (_, api, _) in enumerate(COPIES):
            name = np.where(what == len(KERNELS) + j, self.host_ids[api], name)
        ids = self.host_ids
        stats = [(ids["device_id"], "int", self.index), (ids["correlation_id"], "uint", correlation)]
        parts = [(t, *xspace_writer.encoded(name, self._ps(t), self._dur(duration), stats))]
        for kind in ("uint64_value", "int64_value"):
            steps = [s for s, found in enumerate(producers) if found and found[1] == kind]
            if not steps:
                continue
            first = np.array([t[of_step == s].min() - 0.5 for s in steps])
            last = np.array([(t + duration)[of_step == s].max() + 0.5 for s in steps])
            context = np.array([producers[s][0] for s in steps], dtype=np.uint64 if kind == "uint64_value" else None)
            stats = [
                (ids["id"], "int", -1000 - self.index),
                (ids["iter_num"], "int", 0),
                (ids["_c"], "uint" if kind == "uint64_value" else "int", context),
                (ids["_ct"], "int", np.array([producers[s][2] for s in steps])),
            ]
            executor = ids[input_wait.EXECUTOR]
            parts.append((first, *xspace_writer.encoded(executor, self._ps(first), self._dur(last - first), stats)))
        return xspace_writer.interleave(parts)

    def _ps(self, t_us: np.ndarray) -> np.ndarray:
        return np.round(t_us * 1e6).astype(np.int64) - self.start_ps

    @staticmethod
    def _dur(d_us: np.ndarray) -> np.ndarray:
        return np.maximum(np.round(d_us * 1e6).astype(np.int64), 1000)

    def _device_events(self, t, d, what, correlation) -> bytes:
        kernel = what < len(KERNELS)
        out = []
        for mask, is_kernel in ((kernel, True), (~kernel, False)):
            if not mask.any():
                continue
            w = what[mask]
            stats = [(1, "uint", correlation[mask]), (2, "str", b"$$1")]
            if is_kernel:
                stats += [
                    (3, "double", 50.0 + 6.25 * (w % 8)),
                    (4, "int", 132 * (1 + w % 4)),
                    (5, "int", 128 << (w % 3)),
                    (6, "ref", 100 + w),
                    (7, "ref", 200 + w),
                ]
            else:
                stats += [(8, "ref", 300 + w - len(KERNELS)), (7, "ref", 299)]
            out.append((t[mask], xspace_writer.events(1 + w, self._ps(t[mask]), self._dur(d[mask]), stats)))
        if len(out) == 1:
            return out[0][1]
        return b"".join(chunk for _, chunk in out)  # one kind per stream here: never interleaved

    @staticmethod
    def metadata(index: int, renamed: dict | None = None) -> bytes:
        """The device plane's id, name, event and stat names, and device stats (no lines)."""
        plane = xspace.MESSAGES["XPlane"](id=100 + index, name=f"/device:GPU:{index}")
        names = [(renamed or {}).get(name, name) for name, _ in KERNELS] + [name for name, _, _ in COPIES]
        for i, name in enumerate(names, start=1):
            plane.event_metadata[i].id = i
            plane.event_metadata[i].name = name
        refs = {
            **{100 + i: d for i, d in enumerate(_DETAILS)},
            **{200 + i: op for i, (_, op) in enumerate(KERNELS)},
            **{300 + i: details for i, (_, _, details) in enumerate(COPIES)},
            299: "IteratorGetNext:IteratorGetNext",
        }
        for i, name in [
            *enumerate(_DEVICE_STATS, start=1),
            *refs.items(),
            (400, "gpu_device_name"),
            (401, "core_count"),
        ]:
            plane.stat_metadata[i].id = i
            plane.stat_metadata[i].name = name
        plane.stats.add(metadata_id=400, str_value="NVIDIA H100 80GB HBM3")
        plane.stats.add(metadata_id=401, int64_value=132)
        return plane.SerializeToString()


def gpu_shaped(
    base: Path, out: Path, target_mb: float, seed: int = 0, spans: list | None = None, renamed: dict | None = None
) -> dict:
    """Write `out`: the capture `base` with GPU planes and launches added, about `target_mb` MB in all.

    `spans`: per analysed step, where its device work goes (default: the step after its input wait); `renamed`:
    names of the capture's host events and of the kernels, replaced (an XLA step's: its CPU events named as on a GPU,
    the kernels after fusions), the events themselves kept."""
    base, out = Path(base), Path(out)
    found, start_ns = _spans(base)
    spans = spans or found
    producers = _producers(base, found)  # each step's own, wherever its device work goes
    steps = len(spans)
    out.parent.mkdir(parents=True, exist_ok=True)
    with xspace.XSpaceFile(base) as space:
        host = hosttrace.host_planes(space)[0]
        host_ids, host_metadata = _host_additions(host, renamed or {})
    with tempfile.TemporaryDirectory(dir=out.parent) as folder:
        probe = _Device(0, Path(folder), start_ns, host_ids, seed)
        probe.step(np.asarray(spans[:1]), 1000, producers[:1])
        probe.close()
        per_kernel = sum(f.stat().st_size for f in Path(folder).glob("gpu0_*.bin")) / 1000
        budget = max(target_mb * 1e6 - base.stat().st_size, 0.0)
        kernels = max(budget / per_kernel, steps)
        devices = min(MAX_DEVICES, max(1, math.ceil(kernels / (steps * KERNELS_PER_DEVICE_STEP))))
        per_step = max(1, round(kernels / (steps * devices)))
        gpus = [_Device(d, Path(folder), start_ns, host_ids, seed) for d in range(devices)]
        try:
            chunk = max(1, 200_000 // per_step)
            array = np.asarray(spans)
            for first in range(0, steps, chunk):
                for gpu in gpus:
                    gpu.step(array[first : first + chunk], per_step, producers[first : first + chunk])
        finally:
            for gpu in gpus:
                gpu.close()
        _assemble(base, out, Path(folder), devices, start_ns, host_metadata, renamed)
    return {
        "base": str(base),
        "steps": steps,
        "devices": devices,
        "kernels_per_step_per_device": per_step,
        "bytes": out.stat().st_size,
    }


def _host_additions(host: xspace.Plane, renamed: dict) -> tuple[dict, bytes]:
    """Ids (after the capture's own) of the launch calls and their stats, and those metadata entries; the entries of
    renamed events again, with their new names (a map entry read later replaces an earlier one)."""
    next_event = max(host.event_names, default=0) + 1
    names = {value: key for key, value in host.stat_names.items()}
    next_stat = max(host.stat_names, default=0) + 1
    plane = xspace.MESSAGES["XPlane"]()
    for key, name in host.event_names.items():
        if name in renamed:
            plane.event_metadata[key].id = key
            plane.event_metadata[key].name = renamed[name]
    ids = {}
    for offset, name in enumerate([LAUNCH] + [api for _, api, _ in COPIES]):
        ids[name] = next_event + offset
        plane.event_metadata[ids[name]].id = ids[name]
        plane.event_metadata[ids[name]].name = name
    events = {value: key for key, value in host.event_names.items()}
    if input_wait.EXECUTOR in events:
        ids[input_wait.EXECUTOR] = events[input_wait.EXECUTOR]
    else:
        ids[input_wait.EXECUTOR] = next_event + len(COPIES) + 1
        plane.event_metadata[ids[input_wait.EXECUTOR]].id = ids[input_wait.EXECUTOR]
        plane.event_metadata[ids[input_wait.EXECUTOR]].name = input_wait.EXECUTOR
    for name in ("device_id", "correlation_id", "id", "iter_num", "_c", "_ct"):
        if name in names:
            ids[name] = names[name]
            continue
        ids[name] = next_stat
        plane.stat_metadata[next_stat].id = next_stat
        plane.stat_metadata[next_stat].name = name
        next_stat += 1
    return ids, plane.SerializeToString()


def _assemble(
    base: Path, out: Path, folder: Path, devices: int, start_ns: int, host_metadata: bytes, renamed: dict | None
) -> None:
    partial = out.with_name(out.name + ".partial")
    with xspace.XSpaceFile(base) as space, open(partial, "wb") as target:
        fd = os.open(base, os.O_RDONLY)
        try:
            host = hosttrace.host_planes(space)[0]
            for plane in space.planes:
                if plane is not host:
                    target.write(xspace_writer.field(1, plane.length))
                    xspace_writer.copy(fd, target, plane.offset, plane.length)
                    continue
                threads = [(10_000_000 + d, folder / f"gpu{d}_launch.bin") for d in range(devices)]
                lines = [xspace_writer.line(tid, f"Host Threads/{tid}", start_ns, path) for tid, path in threads]
                extra = sum(len(head) + events.stat().st_size for head, events in lines) + len(host_metadata)
                target.write(xspace_writer.field(1, plane.length + extra))
                xspace_writer.copy(fd, target, plane.offset, plane.length)
                for head, events in lines:
                    target.write(head)
                    xspace_writer.copy(events, target)
                target.write(host_metadata)
            for name in space.hostnames:
                encoded = name.encode()
                target.write(xspace_writer.field(4, len(encoded)) + encoded)
        finally:
            os.close(fd)
        for d in range(devices):
            metadata = _Device.metadata(d, renamed)
            streams = _Device.STREAMS.items()
            lines = [xspace_writer.line(sid, name, start_ns, folder / f"gpu{d}_{sid}.bin") for name, sid in streams]
            target.write(xspace_writer.field(1, len(metadata) + sum(len(h) + e.stat().st_size for h, e in lines)))
            target.write(metadata)
            for head, events in lines:
                target.write(head)
                xspace_writer.copy(events, target)
                events.unlink()
    partial.replace(out)
