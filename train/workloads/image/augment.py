"""Augmentation: the transforms a config lists (pipeline.transforms), one implementation per placement.

The transforms, each drawn per example with probability 1/2 (the shift: uniformly):

    flip_left_right   mirror the image; right for nearly every photo
    flip_up_down      turn it upside down; right for the built-in shapes, wrong for photos and digits
                      (a sky below, a 6 read as a 9): only configs/base.yaml's built-in dataset lists it
    shift             move it up or down by up to 1/16 of its height, repeating the edge row

(`pipeline.random_crop` crops while decoding; it is a decode option, see pipeline.py.)

The placements (pipeline.augment), each one implementation of the listed set:

    python        numpy_augment, per example, inside the naive pipeline's Python generator
    per_example   tf_augment_one, a per-element `map` before `batch`
    batched       tf_augment_batch / tf_augment_plain_batch, one vectorized `map` after `batch`
    device        DeviceAugment, a Keras layer at the start of the model (on the accelerator)

All work on uint8 images, so batches stay compact until the model scales them. Every random draw
is made whether or not its transform is listed, then masked: listing or dropping one transform
leaves the others' draws as they were. Given the same draws the numpy, per-example and batched
forms produce the same pixels, and tests check that.

Why these: on uint8 [B, H, W, C] batches they move whole rows or whole images, which is cheap;
a per-example horizontal shift needs a gather per pixel, several times as expensive, and on a
2-core machine that time is stolen from the model. The batched path goes one step further. A
left-right flip of uint8 pixels (tf.reverse on the width axis) cost more than everything else
together. So where a flip is listed, each image's mirror is made once, before the cache, and kept
under it (`add_mirror`: [2H, W, C], twice the cache memory); after batching, flip, up-down flip and
shift are then one gather of whole rows (`tf_apply_mirrored`). The measured costs:
docs/figures.md, "What augmentation costs per batch".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from train.workloads.image.settings import PHOTO_TRANSFORMS, TRANSFORMS

SHIFT_FRACTION = 1 / 16  # largest vertical shift, as a fraction of the image height


@dataclasses.dataclass(frozen=True)
class Transforms:
    """Which of the transforms are on (pipeline.transforms, checked against TRANSFORMS by the config)."""

    flip_left_right: bool = False
    flip_up_down: bool = False
    shift: bool = False

    @classmethod
    def of(cls, names: Sequence[str]) -> Transforms:
        return cls(**{name: True for name in names})

    @property
    def names(self) -> list[str]:
        return [name for name in TRANSFORMS if getattr(self, name)]


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


def numpy_augment(image: np.ndarray, rng: np.random.Generator, transforms: Transforms) -> np.ndarray:
    shift = max_shift(image.shape[0])
    flip_lr, flip_ud = rng.random(2) < 0.5
    dy = rng.integers(-shift, shift + 1)
    return numpy_apply(
        image,
        bool(flip_lr) and transforms.flip_left_right,
        bool(flip_ud) and transforms.flip_up_down,
        int(dy) if transforms.shift else 0,
    )


def tf_apply(images, flip_ud, dy, num_flip_lr):
    """The same mapping for a batch [B, H, W, C]: `flip_ud` and `dy` are [B]; the first
    `num_flip_lr` images are flipped left-right.

    The up-down flip and the shift become one source row per output row (one gather of
    whole rows). Flipping a prefix of the batch needs no per-pixel select: one reverse of
    those images and one concatenation.
    """
    height = tf.shape(images)[1]
    rows = tf.clip_by_value(tf.range(height)[None, :] - dy[:, None], 0, height - 1)
    rows = tf.where(flip_ud[:, None], height - 1 - rows, rows)
    shifted = tf.gather(images, rows, axis=1, batch_dims=1)
    flipped = tf.concat([flip_left_right(shifted[:num_flip_lr]), shifted[num_flip_lr:]], axis=0)
    return tf.ensure_shape(flipped, images.shape)


def flip_left_right(images):
    """Mirror a batch [B, H, W, C]. Reversed as [B*H, W, C], the 3-D case TensorFlow's reverse kernel
    has a fast path for (a quarter of the CPU time of tf.reverse on the 4-D batch: docs/figures.md)."""
    shape = tf.shape(images)
    rows = tf.reshape(images, tf.concat([[shape[0] * shape[1]], shape[2:]], axis=0))
    return tf.reshape(tf.reverse(rows, axis=[1]), shape)


def add_mirror(image, label):
    """uint8 [H, W, C] -> [2H, W, C]: the image, then its left-right mirror (see tf_apply_mirrored)."""
    return tf.concat([image, tf.reverse(image, axis=[1])], axis=0), label


def tf_apply_mirrored(stacked, flip_lr, flip_ud, dy):
    """`tf_apply` for images stored with their mirror ([B, 2H, W, C] from `add_mirror`).

    `flip_lr`, `flip_ud` and `dy` are [B]; the result is [B, H, W, C]. A flipped image is
    read from the mirror's rows, so all three transformations are one gather of whole rows.
    """
    height = tf.shape(stacked)[1] // 2
    rows = tf.clip_by_value(tf.range(height)[None, :] - dy[:, None], 0, height - 1)
    rows = tf.where(flip_ud[:, None], height - 1 - rows, rows)
    rows += tf.where(flip_lr, height, 0)[:, None]
    out = tf.gather(stacked, rows, axis=1, batch_dims=1)
    return tf.ensure_shape(out, [stacked.shape[0], stacked.shape[1] // 2, *stacked.shape[2:]])


def _seed(seed, index):
    """A stateless seed from the run's seed and an element or batch index."""
    return tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)])


def _draws(key, size, shift: int, transforms: Transforms):
    """Per-example left-right flips, up-down flips and vertical shifts for a batch of `size`, those of
    transforms not listed masked off (drawn all the same, so the others' draws do not move)."""
    flips = tf.random.stateless_uniform([2, size], seed=key) < 0.5
    dy = tf.random.stateless_uniform([size], seed=key + [0, 1 << 40], minval=-shift, maxval=shift + 1, dtype=tf.int32)
    return (
        tf.logical_and(flips[0], transforms.flip_left_right),
        tf.logical_and(flips[1], transforms.flip_up_down),
        dy if transforms.shift else tf.zeros_like(dy),
    )


def tf_augment_batch(index, batch, seed: int, transforms: Transforms):
    """Augment the `index`-th batch of a shuffled stream of mirrored images ([B, 2H, W, C]).

    Random draws are stateless functions of (seed, index): the same batch gets the same
    augmentation in every run and in any thread, which is what makes resumed runs exact.
    Every transform is drawn per example.
    """
    stacked, labels = batch
    size, shift = tf.shape(stacked)[0], max_shift(int(stacked.shape[1]) // 2)
    flip_lr, flip_ud, dy = _draws(_seed(seed, index), size, shift, transforms)
    return tf_apply_mirrored(stacked, flip_lr, flip_ud, dy), labels


def element_seed(seed, index):
    """The stateless seed of the `index`-th element of a stream (random crops)."""
    return _seed(seed, index) + [0, 1 << 41]


def tf_augment_plain_batch(index, batch, seed: int, transforms: Transforms):
    """`tf_augment_batch` for plain images [B, H, W, C] (no decoded cache, so no stored mirror).

    The batch comes from a shuffled stream, so flipping its first k images (k drawn as the
    number of heads in B coin flips) flips each example with probability 1/2: one reverse of
    k images instead of a per-pixel select over the batch.
    """
    images, labels = batch
    size, shift = tf.shape(images)[0], max_shift(int(images.shape[1]))
    flip_lr, flip_ud, dy = _draws(_seed(seed, index), size, shift, transforms)
    return tf_apply(images, flip_ud, dy, tf.reduce_sum(tf.cast(flip_lr, tf.int32))), labels


def tf_augment_one(index, example, seed: int, transforms: Transforms):
    """Augment the `index`-th example (for a per-element `map` before `batch`)."""
    image, label = example
    shift = max_shift(int(image.shape[0]))
    draws = tf.random.stateless_uniform([3], seed=_seed(seed, index))
    dy = tf.cast(tf.floor(draws[1] * (2 * shift + 1)), tf.int32) - shift
    flip_ud = tf.logical_and(draws[:1] < 0.5, transforms.flip_up_down)
    flip_lr = tf.cast(tf.logical_and(draws[2] < 0.5, transforms.flip_left_right), tf.int32)
    dy = dy[None] if transforms.shift else tf.zeros([1], tf.int32)
    return tf_apply(image[None], flip_ud, dy, flip_lr)[0], label


@keras.saving.register_keras_serializable(package="train")
class DeviceAugment(keras.layers.Layer):
    """The listed transforms as a Keras layer at the start of the model (pipeline.augment: device): on a
    GPU they run there, next to the model, instead of on the host's cores. In training only; at
    inference it passes images through.

    Registered with Keras when this module is imported (as training does), so a saved model
    that holds it loads in any process that imports train.workloads.image.augment first."""

    def __init__(self, seed: int = 0, transforms: Sequence[str] = PHOTO_TRANSFORMS, **kwargs):
        super().__init__(**kwargs)
        self.seed = seed
        self.transforms = Transforms.of(transforms)
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, images, training=None):
        if not training:
            return images
        key = tf.cast(keras.random.randint([2], 0, 2**31 - 1, seed=self.seed_generator), tf.int64)
        shift = max_shift(int(images.shape[1]))
        flip_lr, flip_ud, dy = _draws(key, tf.shape(images)[0], shift, self.transforms)
        flipped = tf.where(flip_lr[:, None, None, None], flip_left_right(images), images)
        return tf_apply(flipped, flip_ud, dy, 0)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "seed": self.seed, "transforms": self.transforms.names}
