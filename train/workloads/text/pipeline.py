"""The one text pipeline builder. Every knob is explicit in `TextPipelineConfig` (settings.py).

The naive baseline and the optimized pipeline are presets of these knobs (configs/text/naive.yaml,
configs/text/optimized.yaml); a ladder turns them on one at a time. Stages, in the order `build`
chains them, each switched by its knob:

    read      python: a generator reads the raw JSONL texts and tokenizes each in Python (a split and a
              dict lookup against the saved vocabulary), one text at a time
              tfrecord: token-id shards read by the shared reader (train/input/reader.py: shuffled every
              epoch, interleaved over parallel_reads shards), parsed in a parallel map
    cache     the token ids in memory (tfrecord; about 4 bytes a token)
    shuffle   texts
    repeat    training with bucket or pack: before batching, so buckets fill across epochs and no text
              is dropped (an epoch is then steps_per_epoch batches)
    batch     pad_max: every row padded to data.max_length; pad_batch: to the longest of the batch;
              bucket: bucket_by_sequence_length, padded to the bucket's length, token_budget slots per
              batch; pack: several texts per row (packing.py), token_budget // pack_length rows
    repeat    training with pad_max or pad_batch
    prefetch
    options   autotune; tf.data injects no prefetch of its own when prefetch is 0

`build` takes knobs whose `auto`s are decided (`resolve` does it for a dataset: bucket lengths
from its length histogram, the pack length) and raises on one that is not. `auto` in parallel_reads,
parallel_calls and prefetch is tf.data's AUTOTUNE, right on any CPU and on GPU hosts alike.
Elements: (int32 token ids [B, L], int32 labels [B]); packed: ({token_ids, segment_ids, positions}
[B, L], labels [B, S], weights [B, S]).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import tensorflow as tf

from train.input import reader
from train.workloads.text import buckets, packing, raw_shards, token_records
from train.workloads.text.settings import TextPipelineConfig
from train.workloads.text.spec import TextSpec
from train.workloads.text.vocabulary import PythonTokenizer, load_vocabulary

_auto = reader.parallelism


def resolve(knobs: TextPipelineConfig, spec: TextSpec) -> tuple[TextPipelineConfig, dict]:
    """`knobs` with the data-dependent `auto`s decided for `spec`, and the reason for each."""
    reasons = {}
    lengths = knobs.bucket_lengths
    if lengths == "auto":
        lengths = buckets.choose_lengths(
            spec.length_histogram, knobs.max_padding, knobs.max_buckets, knobs.pad_multiple, spec.max_length
        )
        share = buckets.padding_share(spec.length_histogram, lengths)
        reasons["text.pipeline.bucket_lengths"] = (
            f"{len(lengths)} buckets pad {share:.0%} of the training split's slots "
            f"(max_padding {knobs.max_padding:.0%}, at most {knobs.max_buckets} buckets)"
        )
    pack_length = knobs.pack_length
    if pack_length == "auto":
        pack_length = spec.max_length
        reasons["text.pipeline.pack_length"] = f"data.max_length ({spec.max_length}): the longest text fits a row"
    return dataclasses.replace(knobs, bucket_lengths=sorted(int(n) for n in lengths), pack_length=pack_length), reasons


def require_resolved(knobs: TextPipelineConfig) -> None:
    undecided = [f"text.pipeline.{k}" for k in ("bucket_lengths", "pack_length") if getattr(knobs, k) == "auto"]
    if undecided:
        raise ValueError(
            f"The text pipeline needs {', '.join(undecided)} decided for the dataset: call "
            "train.workloads.text.pipeline.resolve(knobs, spec) first (a run's set-up does)."
        )


def bucket_sizes(knobs: TextPipelineConfig) -> list[int]:
    return buckets.batch_sizes(knobs.bucket_lengths, knobs.token_budget, knobs.pad_multiple)


def pack_rows(knobs: TextPipelineConfig) -> int:
    return max(1, knobs.token_budget // knobs.pack_length)


def steps_per_epoch(knobs: TextPipelineConfig, spec: TextSpec) -> int:
    """Training batches in one pass over the training split (estimated for packing: 1 % padding)."""
    require_resolved(knobs)
    if knobs.batching == "bucket":
        return buckets.steps_per_epoch(spec.length_histogram, knobs.bucket_lengths, bucket_sizes(knobs))
    if knobs.batching == "pack":
        tokens = float((spec.lengths()).sum())
        return max(1, round(tokens / 0.99 / (pack_rows(knobs) * knobs.pack_length)))
    whole = spec.num_train // knobs.batch_size if knobs.drop_remainder else -(-spec.num_train // knobs.batch_size)
    return max(1, whole)


def _python_reader(files, spec: TextSpec, knobs: TextPipelineConfig, training: bool, seed: int) -> tf.data.Dataset:
    """What most first text pipelines look like: a Python loop that reads and tokenizes each text."""
    tokenize = PythonTokenizer(load_vocabulary(spec.vocabulary_path))
    epochs = itertools.count()
    max_length = spec.max_length

    def examples():
        rng = np.random.default_rng([seed, next(epochs)])
        order = list(files)
        if training and knobs.shuffle_files:
            rng.shuffle(order)
        for text, label in raw_shards.read_shards(order):
            yield np.asarray(tokenize(text)[:max_length], dtype=np.int32), label

    signature = (tf.TensorSpec(shape=(None,), dtype=tf.int32), tf.TensorSpec(shape=(), dtype=tf.int32))
    return tf.data.Dataset.from_generator(examples, output_signature=signature)


def _tfrecord_reader(files, knobs: TextPipelineConfig, training: bool, seed: int) -> tf.data.Dataset:
    serialized = reader.records(files, knobs, training=training, seed=seed)
    return serialized.map(
        token_records.parse, num_parallel_calls=_auto(knobs.parallel_calls), deterministic=knobs.deterministic
    )


def _batch(dataset, spec: TextSpec, knobs: TextPipelineConfig, training: bool, batch_size: int) -> tf.data.Dataset:
    drop = training and knobs.drop_remainder
    if knobs.batching == "pad_max":
        return dataset.padded_batch(batch_size, padded_shapes=([spec.max_length], []), drop_remainder=drop)
    if knobs.batching == "pad_batch":
        return dataset.padded_batch(batch_size, padded_shapes=([None], []), drop_remainder=drop)
    if knobs.batching == "bucket":
        lengths = knobs.bucket_lengths
        return dataset.bucket_by_sequence_length(
            element_length_func=lambda ids, label: tf.shape(ids)[0],
            # a text of length l goes to the first bucket with l < boundary, padded to boundary - 1
            bucket_boundaries=[length + 1 for length in lengths],
            bucket_batch_sizes=bucket_sizes(knobs) + [1],  # the last bucket (longer than any length) stays empty
            pad_to_bucket_boundary=True,
            drop_remainder=drop,
        )
    parallel = _auto(knobs.parallel_calls)
    packed = packing.pack(
        dataset, knobs.pack_length, knobs.max_segments, knobs.pack_window, parallel, knobs.deterministic
    )
    return packed.batch(pack_rows(knobs), drop_remainder=drop)


def options(knobs: TextPipelineConfig) -> tf.data.Options:
    return reader.options(knobs)


def build(
    files, spec: TextSpec, knobs: TextPipelineConfig, *, training: bool, batch_size: int | None = None, seed: int = 0
) -> tf.data.Dataset:
    """The text pipeline for one split. `files` are raw shards for reader python, token shards for tfrecord
    (`input_files` picks them). `batch_size` (rows, for pad_max and pad_batch) defaults to the knob; the
    run's plan passes the global batch. `training=False` reads every text once, unshuffled, keeping the
    last partial batches (bucket: padded to the same bucket lengths)."""
    require_resolved(knobs)
    if knobs.reader == "python":
        dataset = _python_reader(files, spec, knobs, training, seed)
    else:
        dataset = _tfrecord_reader(files, knobs, training, seed)
        if knobs.cache:
            dataset = dataset.cache()
    if training and knobs.shuffle_buffer:
        dataset = dataset.shuffle(knobs.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    repeat_first = knobs.batching in ("bucket", "pack")
    if training and repeat_first:
        dataset = dataset.repeat()
    dataset = _batch(dataset, spec, knobs, training, batch_size or knobs.batch_size)
    if training and not repeat_first:
        dataset = dataset.repeat()
    if knobs.prefetch:
        dataset = dataset.prefetch(_auto(knobs.prefetch))
    return dataset.with_options(options(knobs))


def input_files(spec: TextSpec, knobs: TextPipelineConfig, training: bool) -> tuple[str, ...]:
    if knobs.reader == "python":
        return spec.raw_train_files if training else spec.raw_val_files
    return spec.train_files if training else spec.val_files


def describe(knobs: TextPipelineConfig, spec: TextSpec, batch_size: int | None = None) -> str:
    """One line naming the stages these (resolved) knobs turn on, for logs and reports."""
    require_resolved(knobs)
    if knobs.reader == "python":
        stages = ["python generator (json + split + dict lookup per text)"]
    else:
        reads = "sequential reads" if knobs.parallel_reads == 1 else f"interleave({knobs.parallel_reads})"
        stages = [f"tfrecord {reads}", f"map(parse, {knobs.parallel_calls})"]
        if knobs.cache:
            stages.append("cache")
    if knobs.shuffle_buffer:
        stages.append(f"shuffle({knobs.shuffle_buffer})")
    rows = batch_size or knobs.batch_size
    if knobs.batching == "pad_max":
        stages.append(f"padded_batch({rows}, to {spec.max_length})")
    elif knobs.batching == "pad_batch":
        stages.append(f"padded_batch({rows}, to the longest)")
    elif knobs.batching == "bucket":
        pairs = ", ".join(f"{size}x{length}" for size, length in zip(bucket_sizes(knobs), knobs.bucket_lengths))
        stages.append(f"bucket({len(knobs.bucket_lengths)} shapes: {pairs})")
    else:
        stages.append(f"pack({pack_rows(knobs)}x{knobs.pack_length}, <= {knobs.max_segments} texts a row)")
    stages.append(f"prefetch({knobs.prefetch})" if knobs.prefetch else "no prefetch")
    return " -> ".join(stages)
