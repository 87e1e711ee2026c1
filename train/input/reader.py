"""The one TFRecord reader every pipeline starts from, and the tf.data options every pipeline ends with.

Shard list (shuffled every epoch when training) -> TFRecordDataset, interleaved over parallel_reads
shards (1: one shard after another): serialized records, which each workload's pipeline parses and
decodes its own way. The knobs are train/input/knobs.py's; `auto` is tf.data's AUTOTUNE.
"""

from __future__ import annotations

import tensorflow as tf

from train.input.knobs import ReadKnobs

AUTOTUNE = tf.data.AUTOTUNE


def parallelism(value: int | str) -> int:
    """A parallelism knob for tf.data: `auto` is AUTOTUNE."""
    return AUTOTUNE if value == "auto" else int(value)


def records(files, knobs: ReadKnobs, *, training: bool, seed: int) -> tf.data.Dataset:
    """The serialized records of `files`, interleaved over the shards as the knobs say."""
    file_list = tf.data.Dataset.from_tensor_slices(list(files))
    if training and knobs.shuffle_files:
        file_list = file_list.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if knobs.parallel_reads == 1:
        return tf.data.TFRecordDataset(file_list)
    reads = parallelism(knobs.parallel_reads)
    return file_list.interleave(
        tf.data.TFRecordDataset, cycle_length=reads, num_parallel_calls=reads, deterministic=knobs.deterministic
    )


def options(knobs: ReadKnobs, private_threadpool_size: int = 0, max_intra_op_parallelism: int = 0) -> tf.data.Options:
    opts = tf.data.Options()
    opts.deterministic = knobs.deterministic
    opts.autotune.enabled = knobs.autotune
    # tf.data quietly appends a prefetch when autotuning; "no prefetch" must mean none.
    opts.experimental_optimization.inject_prefetch = knobs.prefetch != 0
    if private_threadpool_size:
        opts.threading.private_threadpool_size = private_threadpool_size
    if max_intra_op_parallelism:
        opts.threading.max_intra_op_parallelism = max_intra_op_parallelism
    return opts
