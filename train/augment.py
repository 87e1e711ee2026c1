"""Augmentation: random left-right and up-down flips and a random vertical shift.

The same transformation exists as numpy (per example, inside the naive pipeline's Python
generator), as a TensorFlow op on one example (a per-element `map`) and vectorized over a
whole batch (one `map` after `batch`, the optimized pipeline's choice). All three work on
uint8 images, so batches stay compact until the model scales them, and given the same
random draws they produce the same pixels; tests check that.

Why these three: on uint8 [B, H, W, C] batches they move whole rows or whole images,
which is cheap (about 8 microseconds per 64x64 image on one CPU core). A per-example
horizontal shift needs a gather per pixel and measured 4x as expensive, which on a
2-core machine steals that time from the model.
"""

from __future__ import annotations

import numpy as np

SHIFT_FRACTION = 1 / 16  # largest vertical shift, as a fraction of the image height


def max_shift(size: int) -> int:
    return max(1, int(size * SHIFT_FRACTION))


def numpy_apply(image: np.ndarray, flip_lr: bool, flip_ud: bool, dy: int) -> np.ndarray:
    """Flip, then shift down by dy rows (up when negative), repeating the edge row into the gap."""
    height = image.shape[0]
    rows = np.clip(np.arange(height) - dy, 0, height - 1)
    if flip_ud:
        rows = height - 1 - rows
    image = image[rows]
    return image[:, ::-1] if flip_lr else image


def numpy_augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    shift = max_shift(image.shape[0])
    flip_lr, flip_ud = rng.random(2) < 0.5
    dy = rng.integers(-shift, shift + 1)
    return numpy_apply(image, bool(flip_lr), bool(flip_ud), int(dy))


def tf_apply(images, flip_lr, flip_ud, dy):
    """The same mapping for a batch: `images` is [B, H, W, C], the others are [B].

    The up-down flip and the shift become one source row per output row (one gather of
    whole rows); the left-right flip reverses only the images drawn for it and stitches
    the batch back together (whole-image copies, no per-pixel select).
    """
    import tensorflow as tf

    height = tf.shape(images)[1]
    rows = tf.clip_by_value(tf.range(height)[None, :] - dy[:, None], 0, height - 1)
    rows = tf.where(flip_ud[:, None], height - 1 - rows, rows)
    shifted = tf.gather(images, rows, axis=1, batch_dims=1)
    keep, flip = tf.dynamic_partition(tf.range(tf.shape(images)[0]), tf.cast(flip_lr, tf.int32), 2)
    stitched = tf.dynamic_stitch(
        [keep, flip], [tf.gather(shifted, keep), tf.reverse(tf.gather(shifted, flip), axis=[2])]
    )
    return tf.ensure_shape(stitched, images.shape)


def tf_augment_batch(images, labels):
    """Augment a batch with vectorized ops (random draws per example)."""
    import tensorflow as tf

    batch = tf.shape(images)[0]
    shift = max_shift(int(images.shape[1]))
    flips = tf.random.uniform([2, batch]) < 0.5
    dy = tf.random.uniform([batch], -shift, shift + 1, dtype=tf.int32)
    return tf_apply(images, flips[0], flips[1], dy), labels


def tf_augment_one(image, label):
    """Augment one example (for a per-element `map` before `batch`)."""
    images, _ = tf_augment_batch(image[None], label)
    return images[0], label
