"""Sequence packing: several texts per row of `pack_length` tokens, with segment ids and positions.

A window of texts (after the shuffle) is packed first-fit decreasing: longest first, each into the
first row with room (and fewer than `max_segments` texts). A packed row carries, per slot, the token
id, the segment id (1, 2, ... for the texts of the row, 0 for padding) and the position within its
text, so attention and pooling stay within a text (model.py builds the masks from the segment ids).
Labels come per segment, [rows, max_segments], with weights 1 for real segments and 0 for empty
ones, as Keras' (x, y, sample_weight).

Everything runs as TensorFlow ops inside tf.data: no Python per text.
"""

from __future__ import annotations

import tensorflow as tf


def _first_fit(lengths, pack_length: int, max_segments: int):
    """Row of each text (in the given order) under first-fit decreasing."""
    count = tf.shape(lengths)[0]
    order = tf.argsort(lengths, direction="DESCENDING", stable=True)
    sorted_lengths = tf.gather(lengths, order)

    def place(index, fills, segments, rows):
        length = sorted_lengths[index]
        fits = tf.logical_and(fills + length <= pack_length, segments < max_segments)
        row = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        fills = tf.tensor_scatter_nd_add(fills, [[row]], [length])
        segments = tf.tensor_scatter_nd_add(segments, [[row]], [1])
        return index + 1, fills, segments, rows.write(index, row)

    zeros = tf.zeros([count], tf.int32)
    _, _, _, rows = tf.while_loop(
        lambda index, *_: index < count,
        place,
        (0, zeros, zeros, tf.TensorArray(tf.int32, size=count)),
    )
    return tf.scatter_nd(order[:, None], rows.stack(), [count])


def pack_window(token_ids: tf.RaggedTensor, labels, pack_length: int, max_segments: int):
    """A window of texts ([W, None] ragged ids, [W] labels) -> packed rows, a variable number R of them:
    ({token_ids, segment_ids, positions: [R, pack_length]}, labels [R, max_segments], weights [R, max_segments])."""
    lengths = tf.cast(token_ids.row_lengths(), tf.int32)
    rows = _first_fit(lengths, pack_length, max_segments)
    count = tf.shape(rows)[0]
    # texts ordered by row, keeping the window's order within a row
    order = tf.argsort(rows * count + tf.range(count), stable=True)
    rows = tf.gather(rows, order)
    lengths = tf.gather(lengths, order)
    num_rows = tf.reduce_max(rows) + 1
    per_row = tf.math.unsorted_segment_sum(tf.ones_like(rows), rows, num_rows)
    first = tf.gather(tf.cumsum(per_row, exclusive=True), rows)
    segment = tf.range(count) - first + 1  # 1-based number of each text within its row
    row_tokens = tf.math.unsorted_segment_sum(lengths, rows, num_rows)

    def by_row(flat):
        return tf.RaggedTensor.from_row_lengths(flat, row_tokens).to_tensor(0, shape=[num_rows, pack_length])

    flat_ids = tf.gather(token_ids, order).flat_values
    inputs = {
        "token_ids": by_row(flat_ids),
        "segment_ids": by_row(tf.repeat(segment, lengths)),
        "positions": by_row(tf.ragged.range(lengths).flat_values),
    }
    where = tf.stack([rows, segment - 1], axis=1)
    shape = [num_rows, max_segments]
    packed_labels = tf.scatter_nd(where, tf.gather(labels, order), shape)
    weights = tf.scatter_nd(where, tf.ones([count], tf.float32), shape)
    return inputs, packed_labels, weights


def pack(dataset: tf.data.Dataset, pack_length: int, max_segments: int, window: int, parallel_calls: int, det: bool):
    """(token ids, label) elements -> packed rows, one row per element (batch them afterwards)."""
    windows = dataset.ragged_batch(window)
    packed = windows.map(
        lambda ids, labels: pack_window(ids, labels, pack_length, max_segments),
        num_parallel_calls=parallel_calls,
        deterministic=det,
    )
    return packed.unbatch()
