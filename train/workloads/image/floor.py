"""The decode floor: what decoding the stored images costs, and nothing else.

Every pipeline that decodes each epoch pays at least this per image: the same records' image
bytes, decoded at the output size the pipeline trains at (the same DCT scale: a 256 px JPEG
trained at 128 px is decoded at 1/2 directly), one image after another on one thread, no
reading, shuffling, augmenting or batching of pixels. Its CPU time per image is the floor;
`make bench` reports each pipeline's CPU time per image as a multiple of it (`cost_lines`). A pipeline can go
below it only by not decoding every epoch (a decoded cache in memory or on disk).
"""

from __future__ import annotations

import time

import tensorflow as tf

from train.shards import records
from train.shards.spec import DatasetSpec
from train.workloads.image import pipeline

SAMPLE = 1000  # distinct images decoded in turn: more than a CPU cache holds at 20+ KB each
RATES = (1_000, 3_000, 10_000)  # images/s: small to mid-size vision models on one modern GPU


def how(spec: DatasetSpec, cfg) -> tuple[str, int]:
    """(a description of the decode, its DCT ratio) at the config's output size."""
    shape = pipeline.image_shape(spec, cfg.pipeline)
    if spec.encoding != "jpeg":
        return f"decode_image ({spec.encoding}) at {shape[0]}x{shape[1]}", 1
    ratio = pipeline.decode_ratio(min(spec.image_shape[:2]), shape[0])
    scaled = f"at 1/{ratio} (DCT scaling) " if ratio > 1 else ""
    return f"decode_jpeg {scaled}of {spec.image_shape[0]}x{spec.image_shape[1]} -> {shape[0]}x{shape[1]}", ratio


def _image_bytes(spec: DatasetSpec) -> list[bytes]:
    encoded = []
    for path in spec.train_files:
        for _, payload in records.read_records(path):
            if isinstance(payload, bytes):
                encoded.append(records.parse_example(payload)[0])
            if len(encoded) >= SAMPLE:
                return encoded
    return encoded


def measure(cfg, spec: DatasetSpec, seconds: float = 3.0) -> dict:
    """Decode the training records in a tight loop on one thread for `seconds`; CPU time per image.

    tf.data runs the loop (one thread of its own pool, no prefetch, no autotuning, ops limited
    to one thread): its per-element cost is about a microsecond, against the 30-400 microseconds
    a decode takes here. Only the decoded images' shapes leave the loop, so no pixels are copied.
    """
    description, ratio = how(spec, cfg)
    channels = spec.image_shape[2]

    def decode(encoded):
        if ratio > 1:
            image = tf.io.decode_jpeg(encoded, channels=channels, ratio=ratio)
        else:
            image = records.decode_image(encoded, spec)
        return tf.shape(image)[0]

    options = tf.data.Options()
    options.autotune.enabled = False
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.experimental_optimization.inject_prefetch = False
    sample = _image_bytes(spec)
    loop = tf.data.Dataset.from_tensor_slices(sample).repeat().map(decode).batch(256).with_options(options)
    iterator = iter(loop)
    next(iterator)  # builds the function and the threads
    batches, cpu, started = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - started < seconds or batches < 4:
        next(iterator)
        batches += 1
    cpu, wall, images = time.process_time() - cpu, time.perf_counter() - started, batches * 256
    return {
        "decode": description,
        "dct_ratio": ratio,
        "encoding": spec.encoding,
        "mean_record_kb": sum(map(len, sample)) / len(sample) / 1024,
        "core_seconds_per_example": cpu / images,
        "examples_per_sec_per_core": images / cpu,
        "wall_seconds_per_example": wall / images,
        "examples": images,
    }


def cores_needed(core_seconds_per_example: float) -> dict:
    """Host cores it takes to feed RATES images/s at this CPU cost per image."""
    return {str(rate): core_seconds_per_example * rate for rate in RATES}


def cost_lines(result: dict) -> list[str]:
    """bench: the decode floor, each pipeline's CPU cost per image against it, and the cores that feeding takes."""
    floor_result = result["decode_floor"]
    ceiling = result["variants"]["ceiling"]["median"]
    per_image = floor_result["core_seconds_per_example"]
    lines = [
        f"Decode floor: {floor_result['decode']}, {floor_result['mean_record_kb']:.1f} KB per record, one thread: "
        f"{per_image * 1e3:.3f} core-ms per image ({floor_result['examples_per_sec_per_core']:,.0f} images/s per core)",
        f"{'pipeline alone':<17}{'ex/s alone':>11}{'core-ms/img':>13}{'x floor':>9}{'cores/1,000/s':>15}"
        f"  cores for {' / '.join(f'{rate:,}' for rate in RATES)} images/s",
    ]
    needed = " / ".join(f"{value:.2g}" for value in floor_result["cores_needed"].values())
    lines.append(f"{'decode floor':<17}{'':>11}{per_image * 1e3:>13.3f}{1.0:>9.2f}{per_image * 1e3:>15.2g}  {needed}")
    for name, cost in result["pipeline_cost"].items():
        needed = " / ".join(f"{value:.2g}" for value in cost["cores_needed"].values())
        lines.append(
            f"{name:<17}{cost['examples_per_sec_alone']:>11,.0f}{cost['core_seconds_per_example'] * 1e3:>13.3f}"
            f"{cost['floor_multiple']:>9.2f}{cost['cores_per_1000']:>15.2g}  {needed}"
        )
    for name, cost in result["pipeline_cost"].items():
        lines.append(
            f"{name}: {cost['cores_per_1000']:.2g} cores per 1,000 images/s; the device here eats {ceiling:,.0f}/s: "
            f"{cost['cores_to_feed_device']:.2g} cores (this host has {result['host_cores']}); "
            f"memory +{cost['memory_growth_mb']:,.0f} MB"
        )
    lines.append(f"peak RSS of the largest variant's process: {result['peak_rss_mb']:,.0f} MB")
    return lines
