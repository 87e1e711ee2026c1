"""The image workload's config sections: `data` (where the images come from) and `pipeline` (every knob of
the one image pipeline builder, train/workloads/image/pipeline.py), typed, with their range rules.

The loader (train/config.py) reads them like every other section: unknown keys and wrong types are
errors before anything runs, and `check` finds the values a run cannot use. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

from train.input import knobs as read_knobs
from train.input.knobs import Auto, ReadKnobs

# pipeline.transforms: what augmentation may do (augment.py), and the default, right for photos
TRANSFORMS = ("flip_left_right", "flip_up_down", "shift")
PHOTO_TRANSFORMS = ("flip_left_right", "shift")


@dataclass
class DataConfig:
    """Where the examples come from; the dataset is built once into sharded TFRecords."""

    source: str = "synthetic"  # synthetic | tfds:NAME | imagefolder:PATH (train/sources.py)
    data_dir: str = "shards"  # where built datasets live (git-ignored)
    image_size: int = 64  # height = width of the images fed to the model
    num_train: int = 10_000  # synthetic source only
    num_val: int = 2_000  # synthetic source only
    num_shards: int = 8  # TFRecord files per split
    val_fraction: float = 0.1  # imagefolder without train/ and val/ folders: share held out for validation
    # Check every shard's framing, CRCs and record count before training (about 1 s per GB),
    # so a damaged file stops the run before any work; switch off for very large datasets.
    verify: bool = True


@dataclass
class PipelineConfig(ReadKnobs):
    """Every knob of the image pipeline builder; the shared ones (reader ... autotune) are train/input/knobs.py's.

    reader python: a generator reads the records one at a time and decodes each JPEG with PIL."""

    output_size: Union[int, None] = None  # side of the images fed to the model; null: as stored (data.image_size)
    # Decode JPEGs at 1/2, 1/4 or 1/8 of their size (libjpeg's DCT scaling) when stored larger than output_size.
    scaled_decode: bool = False
    # Training: a random window of 50-100 % of the area (aspect 3/4-4/3), resized to output_size; only the
    # window is decoded (decode_and_crop_jpeg). Changes what is learned, like any augmentation.
    random_crop: bool = False
    # What is kept between epochs. memory: decoded images in RAM; disk: a tf.data snapshot of decoded images
    # under cache_dir; encoded: the records (JPEG bytes) in RAM, decoded every epoch; none.
    # auto: memory when the decoded images fit in cache_limit_mb, else disk when cache_dir is set, else
    # encoded when the records fit, else none.
    cache: Literal["auto", "memory", "disk", "encoded", "none"] = "auto"
    cache_limit_mb: int = 4096
    cache_dir: Union[str, None] = None  # local folder for cache: disk (snapshots are kept for later runs)
    # Shuffle the encoded records instead of decoded images: a buffer of JPEG bytes, not of pixels.
    # auto: when nothing decoded is cached (a decoded cache is shuffled after it instead).
    shuffle_before_decode: Union[bool, Auto] = "auto"
    # Where augmentation runs. python: numpy in the generator; per_example: a map before batch; batched: one
    # vectorized map per batch; device: a Keras layer at the start of the model, on the accelerator; auto:
    # device where a GPU exists, batched elsewhere; none.
    augment: Literal["auto", "none", "python", "per_example", "batched", "device"] = "batched"
    # What augmentation does, each drawn per example (augment.py): flip_left_right, flip_up_down, shift
    # (vertically, up to 1/16 of the height). The default is right for photos; flip_up_down is not
    # (a sky below, a 6 read as a 9). [] augments nothing.
    transforms: list[str] = field(default_factory=lambda: list(PHOTO_TRANSFORMS))
    private_threadpool_size: int = 0  # 0 uses TensorFlow's shared inter-op pool
    max_intra_op_parallelism: int = 0  # 0 lets one op use every core; 1 keeps ops from fighting the model for cores
    skip_corrupt: bool = False  # skip damaged records (found by a scan before training, counted in the summary)
    data_service: Union[str, None] = None  # grpc://HOST:PORT of a tf.data service dispatcher
    data_service_mode: Literal["parallel_epochs", "distributed_epoch"] = "parallel_epochs"


SECTIONS = {"data": DataConfig, "pipeline": PipelineConfig}  # the config's sections this workload reads


def check(sections: dict, need) -> None:
    """Every range and consistency rule of the two sections; `need(ok, key, value, rule)` collects problems."""
    _check_data(sections["data"], need)
    read_knobs.check(sections["pipeline"], need, "pipeline")
    _check_pipeline(sections["pipeline"], need)


def _check_data(d: DataConfig, need) -> None:
    need(d.image_size >= 8, "data.image_size", d.image_size, ">= 8")
    need(d.num_train >= 1, "data.num_train", d.num_train, ">= 1")
    need(d.num_val >= 1, "data.num_val", d.num_val, ">= 1")
    need(d.num_shards >= 1, "data.num_shards", d.num_shards, ">= 1")
    need(0 < d.val_fraction < 1, "data.val_fraction", d.val_fraction, "between 0 and 1")
    if d.source == "synthetic":
        need(
            d.num_shards <= min(d.num_train, d.num_val),
            "data.num_shards",
            d.num_shards,
            f"at most the number of examples in the smallest split ({min(d.num_train, d.num_val)})",
        )


def _check_pipeline(p: PipelineConfig, need) -> None:
    unknown = [name for name in p.transforms if name not in TRANSFORMS]
    need(not unknown, "pipeline.transforms", p.transforms, f"a list of {', '.join(TRANSFORMS)} (not {unknown})")
    need(len(set(p.transforms)) == len(p.transforms), "pipeline.transforms", p.transforms, "without repeats")
    need(p.cache_limit_mb >= 0, "pipeline.cache_limit_mb", p.cache_limit_mb, ">= 0")
    need(p.output_size is None or p.output_size >= 8, "pipeline.output_size", p.output_size, "null or >= 8")
    need(
        p.cache != "disk" or bool(p.cache_dir),
        "pipeline.cache_dir",
        p.cache_dir,
        "a local folder when pipeline.cache is 'disk'",
    )
    need(
        not p.random_crop or p.cache in ("auto", "encoded", "none"),
        "pipeline.cache",
        p.cache,
        "'auto', 'encoded' or 'none' with pipeline.random_crop (a decoded cache would keep the first crops)",
    )
    need(
        p.augment != "python" or p.cache in ("auto", "none"),
        "pipeline.cache",
        p.cache,
        "'auto' or 'none' with pipeline.augment 'python' (a cache after the generator would keep the first "
        "epoch's flips and shifts)",
    )
    need(
        not p.random_crop or p.shuffle_buffer > 0,
        "pipeline.shuffle_buffer",
        p.shuffle_buffer,
        "> 0 with pipeline.random_crop (crops are drawn per position in the stream: without a shuffle each "
        "example would get the same crop every epoch)",
    )
    for key in ("random_crop", "scaled_decode"):
        need(
            not getattr(p, key) or p.reader == "tfrecord",
            f"pipeline.{key}",
            getattr(p, key),
            "false unless pipeline.reader is 'tfrecord'",
        )
    need(
        p.shuffle_before_decode is not True or p.reader == "tfrecord",
        "pipeline.shuffle_before_decode",
        p.shuffle_before_decode,
        "'auto' or false unless pipeline.reader is 'tfrecord'",
    )
    need(
        p.cache not in ("encoded", "disk") or p.reader == "tfrecord",
        "pipeline.cache",
        p.cache,
        "'memory', 'auto' or 'none' unless pipeline.reader is 'tfrecord'",
    )
    need(p.private_threadpool_size >= 0, "pipeline.private_threadpool_size", p.private_threadpool_size, ">= 0")
    need(p.max_intra_op_parallelism >= 0, "pipeline.max_intra_op_parallelism", p.max_intra_op_parallelism, ">= 0")
    need(
        p.augment != "python" or p.reader == "python",
        "pipeline.augment",
        p.augment,
        "'none', 'per_example' or 'batched' unless pipeline.reader is 'python' "
        "(numpy augmentation runs in the generator)",
    )
    need(
        p.data_service is None or p.data_service.startswith("grpc://"),
        "pipeline.data_service",
        p.data_service,
        "null or an address like grpc://localhost:5050",
    )
    need(
        p.data_service is None or p.reader == "tfrecord",
        "pipeline.reader",
        p.reader,
        "'tfrecord' when pipeline.data_service is set (a Python generator cannot run on service workers)",
    )
