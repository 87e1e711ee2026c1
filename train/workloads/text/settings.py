"""The typed knobs of the text task: where the text comes from and how it is built (TextDataConfig), and
every knob of the one text pipeline builder (TextPipelineConfig). Presets: configs/text/*.yaml.

They sit under the `text:` section of the run's config (`workload: text`), read by train/config.py's
loader like every other section: unknown keys and wrong types are errors before anything runs, and
`check` (called by the loader) finds the range and consistency problems. No TensorFlow here: the text
models registered below are built with Keras only when a run builds one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

from train.input import knobs as read_knobs
from train.input.knobs import Auto, ReadKnobs
from train.workloads.text.model import text_small, text_transformer


@dataclass
class TextDataConfig:
    """Where the texts come from; a text dataset is built once into raw and token-id shards."""

    # synthetic | csv:PATH | jsonl:PATH | textfolder:PATH (PATH/<class>/*.txt, or PATH/train/<class>/ and
    # PATH/validation/<class>/, the layout keras.utils.text_dataset_from_directory reads)
    source: str = "synthetic"
    data_dir: str = "shards"  # where built datasets live (git-ignored)
    num_train: int = 8_000  # synthetic source only
    num_val: int = 1_000  # synthetic source only
    num_shards: int = 4  # files per split, for the raw texts and for the token ids
    val_fraction: float = 0.1  # own text without a validation file or folder: share held out (by a hash of the text)
    text_key: str = "text"  # csv / jsonl: the column or key that holds the text
    label_key: str = "label"  # csv / jsonl: the column or key that holds the label (a name or an integer)
    # A row without text or label, with a label of the wrong kind, a line that is not JSON, an empty text:
    # raise stops with the file and line; skip counts it, leaves it out, and the spec records how many.
    bad_rows: Literal["raise", "skip"] = "raise"
    max_tokens: int = 20_000  # vocabulary size, the padding and out-of-vocabulary ids included
    max_length: int = 512  # tokens kept per text; longer texts are cut (and counted) when the dataset is built
    seed: int = 0  # the synthetic corpus, and which texts of a single file go to validation


@dataclass
class TextPipelineConfig(ReadKnobs):
    """Every knob of the text pipeline builder (train/workloads/text/pipeline.py); the shared ones (reader ...
    autotune) are train/input/knobs.py's. reader python: a generator reads the raw texts and tokenizes each in
    Python (split + dict lookup); tfrecord: the token ids written when the dataset was built."""

    batch_size: int = 32  # rows per batch for pad_max and pad_batch
    cache: bool = True  # keep the parsed token ids in memory after the first epoch (about 4 bytes a token)
    # pad_max: every row padded to data.max_length, batch_size rows (one shape, most of it padding);
    # pad_batch: batch_size rows padded to the longest of the batch (less padding, a new shape almost every step);
    # bucket: rows of similar length batched together and padded to their bucket's length (few shapes, little
    # padding); pack: several examples per row of pack_length, with segment ids (one shape, least padding)
    batching: Literal["pad_max", "pad_batch", "bucket", "pack"] = "bucket"
    # bucket: token slots per batch: a bucket of length L gets token_budget // L rows (a multiple of
    # pad_multiple), so every step costs about the same; pack: rows per batch = token_budget // pack_length
    token_budget: int = 8192
    # bucket: padded lengths (each bucket's longest row). auto: the fewest of lengths in multiples of
    # pad_multiple whose padding share on the training split's lengths is at most max_padding
    bucket_lengths: Union[list, Auto] = "auto"
    max_padding: float = 0.1  # bucket_lengths auto: padding share to stay under
    max_buckets: int = 12  # bucket_lengths auto: at most this many shapes (one compile each)
    pad_multiple: int = 8  # bucket lengths and bucket batch sizes are multiples of this (tensor-core friendly)
    pack_length: Union[int, Auto] = "auto"  # pack: row length; auto: data.max_length
    max_segments: int = 16  # pack: examples per row at most
    pack_window: int = 512  # pack: examples packed together (first-fit decreasing within a window)


@dataclass
class TextConfig:
    data: TextDataConfig = field(default_factory=TextDataConfig)
    pipeline: TextPipelineConfig = field(default_factory=TextPipelineConfig)


SECTIONS = {"text": TextConfig}  # the config's sections this workload reads
MODELS = (text_small, text_transformer)  # registered with train/models.py's registry (model.py: no TensorFlow)


def check(sections: dict, need, prefix: str = "text") -> None:
    """Range and consistency checks; `need(ok, key, value, rule)` collects the problems (config_rules.Problems)."""
    d, p = sections["text"].data, sections["text"].pipeline
    read_knobs.check(p, need, f"{prefix}.pipeline")
    for key in ("num_train", "num_val", "num_shards"):
        need(getattr(d, key) >= 1, f"{prefix}.data.{key}", getattr(d, key), ">= 1")
    need(0 < d.val_fraction < 1, f"{prefix}.data.val_fraction", d.val_fraction, "between 0 and 1")
    need(d.max_tokens >= 3, f"{prefix}.data.max_tokens", d.max_tokens, ">= 3 (padding, out of vocabulary, one term)")
    need(d.max_length >= 2, f"{prefix}.data.max_length", d.max_length, ">= 2")
    need(p.pad_multiple >= 1, f"{prefix}.pipeline.pad_multiple", p.pad_multiple, ">= 1")
    need(0 < p.max_padding < 1, f"{prefix}.pipeline.max_padding", p.max_padding, "between 0 and 1")
    need(p.max_buckets >= 1, f"{prefix}.pipeline.max_buckets", p.max_buckets, ">= 1")
    need(p.max_segments >= 1, f"{prefix}.pipeline.max_segments", p.max_segments, ">= 1")
    need(p.pack_window >= 2, f"{prefix}.pipeline.pack_window", p.pack_window, ">= 2")
    need(
        p.token_budget >= d.max_length,
        f"{prefix}.pipeline.token_budget",
        p.token_budget,
        f">= data.max_length ({d.max_length}), so the longest bucket gets a row",
    )
    lengths = p.bucket_lengths
    need(
        lengths == "auto" or (bool(lengths) and all(isinstance(n, int) and 1 <= n <= d.max_length for n in lengths)),
        f"{prefix}.pipeline.bucket_lengths",
        lengths,
        f"'auto' or a list of lengths between 1 and data.max_length ({d.max_length})",
    )
    pack = p.pack_length
    need(
        pack == "auto" or 2 <= pack <= d.max_length * p.max_segments,
        f"{prefix}.pipeline.pack_length",
        pack,
        "'auto' or >= 2",
    )
    need(
        pack == "auto" or pack >= d.max_length,
        f"{prefix}.pipeline.pack_length",
        pack,
        f"'auto' or >= data.max_length ({d.max_length}), so the longest text fits a row",
    )
    need(
        p.batching != "pack" or p.reader == "tfrecord",
        f"{prefix}.pipeline.batching",
        p.batching,
        "'pad_max', 'pad_batch' or 'bucket' unless pipeline.reader is 'tfrecord'",
    )
