"""Augmentation: random flips and a small random shift, in three implementations.

The same transformation exists as numpy (per example, inside the naive pipeline's Python
generator), as a TensorFlow op on one example (a per-element `map`) and vectorized over
a whole batch (one `map` after `batch`, the optimized pipeline's choice). All three work
on uint8 images, so batches stay compact until the model scales them. Given the same
random draws they produce the same pixels; tests check that.
"""

from __future__ import annotations

import numpy as np

SHIFT_FRACTION = 1 / 16  # largest shift, as a fraction of the image side


def max_shift(size: int) -> int:
    return max(1, int(size * SHIFT_FRACTION))


def numpy_apply(image: np.ndarray, flip_lr: bool, flip_ud: bool, dy: int, dx: int) -> np.ndarray:
    """Flip, then shift by (dy, dx) pixels, repeating the edge pixels into the gap."""
    height, width = image.shape[:2]
    rows = np.clip(np.arange(height) - dy, 0, height - 1)
    cols = np.clip(np.arange(width) - dx, 0, width - 1)
    if flip_ud:
        rows = height - 1 - rows
    if flip_lr:
        cols = width - 1 - cols
    return image[rows][:, cols]


def numpy_augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    shift = max_shift(image.shape[0])
    flip_lr, flip_ud = rng.random(2) < 0.5
    dy, dx = rng.integers(-shift, shift + 1, 2)
    return numpy_apply(image, bool(flip_lr), bool(flip_ud), int(dy), int(dx))


def tf_apply(images, flip_lr, flip_ud, dy, dx):
    """The same mapping for a batch: `images` is [B, H, W, C], the others are [B].

    Flips and shifts are folded into one source row and one source column per output
    row/column, so the whole batch moves with two gathers (rows first: they are cheap,
    whole rows of contiguous pixels).
    """
    import tensorflow as tf

    height, width = tf.shape(images)[1], tf.shape(images)[2]
    rows = tf.clip_by_value(tf.range(height)[None, :] - dy[:, None], 0, height - 1)
    rows = tf.where(flip_ud[:, None], height - 1 - rows, rows)
    cols = tf.clip_by_value(tf.range(width)[None, :] - dx[:, None], 0, width - 1)
    cols = tf.where(flip_lr[:, None], width - 1 - cols, cols)
    images = tf.gather(images, rows, axis=1, batch_dims=1)
    return tf.gather(images, cols, axis=2, batch_dims=1)


def tf_augment_batch(images, labels):
    """Augment a batch with vectorized ops (random draws per example)."""
    import tensorflow as tf

    batch = tf.shape(images)[0]
    shift = max_shift(int(images.shape[1]))
    flips = tf.random.uniform([2, batch]) < 0.5
    shifts = tf.random.uniform([2, batch], -shift, shift + 1, dtype=tf.int32)
    return tf_apply(images, flips[0], flips[1], shifts[0], shifts[1]), labels


def tf_augment_one(image, label):
    """Augment one example (for a per-element `map` before `batch`)."""
    images, _ = tf_augment_batch(image[None], label)
    return images[0], label
